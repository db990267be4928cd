"""The fixed held-out test shared by every run: built once, refused with another vocabulary, scored without
changing the run it scores."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("datasets")

from replayloader_electra import cli  # noqa: E402
from replayloader_electra.errors import UserError  # noqa: E402
from replayloader_electra.tokenizer import train_wordpiece  # noqa: E402
from replayloader_electra.data import pack_token_stream  # noqa: E402
from replayloader_electra.pretrain import discriminator_losses, pretrain, read_metrics  # noqa: E402
from replayloader_electra.pretrain.heldout import HeldoutSet, evaluate_heldout  # noqa: E402
from replayloader_electra.pretrain.metrics import base_rate_entropy, ranking_auc  # noqa: E402

from .test_pretrain import tiny_config  # noqa: E402

TRAIN_LINES = 1200  # of the corpus fixture's 1,500 lines; the rest is held out


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory, one_torch_thread) -> dict:
    """A short ELECTRA run (its exported generator is the reference corruptor) and a held-out file made with it."""
    root = tmp_path_factory.mktemp("heldout")
    run = pretrain(tiny_config(corpus, root / "reference", variant="electra", steps=4, max_lines=TRAIN_LINES,
                               export_hf=True))
    path = root / "heldout.safetensors"
    argv = ["heldout", "--run", str(run.output_dir), "--examples", "24", "--output", str(path)]
    assert cli.main(argv) == 0
    return {"run": run, "path": path, "argv": argv, "root": root}


def test_the_file_holds_corrupted_held_out_examples_and_how_they_were_made(reference, corpus):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(f"{reference['run'].output_dir}/generator")
    heldout = HeldoutSet.load(reference["path"], tokenizer)  # made with the run's own vocabulary: accepted
    tensors = heldout.tensors
    assert len(heldout) == 24 and tensors["input_ids"].shape == (24, 32)
    replaced = tensors["input_ids"] != tensors["original_ids"]
    assert replaced.any() and not (replaced & ~tensors["masked"]).any()  # only masked positions change
    assert 0 < heldout.replaced_share < 0.15
    info = heldout.info
    assert info["start_line"] == TRAIN_LINES and info["lines"] == 1500 - TRAIN_LINES and info["seed"] == 0
    # the originals are the held-out lines (never the training ones), tokenized and packed as pretraining does
    lines = open(corpus["file"]).read().splitlines()[TRAIN_LINES:]
    ids = tokenizer(lines, add_special_tokens=False)["input_ids"]
    packed, _ = pack_token_stream(ids, 32, tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id,
                                  min_tail=32)
    assert torch.equal(tensors["original_ids"], torch.tensor(packed[:24]))


def test_building_is_deterministic_and_leaves_the_callers_random_stream_alone(reference):
    again = reference["root"] / "again.safetensors"
    state = torch.random.get_rng_state()
    assert cli.main([*reference["argv"][:-1], str(again)]) == 0
    assert torch.equal(torch.random.get_rng_state(), state)
    first, second = HeldoutSet.load(reference["path"]), HeldoutSet.load(again)
    for name, tensor in first.tensors.items():
        assert torch.equal(tensor, second.tensors[name]), name
    other_seed = reference["root"] / "seed1.safetensors"
    assert cli.main([*reference["argv"][:-1], str(other_seed), "--seed", "1"]) == 0
    assert not torch.equal(HeldoutSet.load(other_seed).tensors["input_ids"], first.tensors["input_ids"])


def test_a_run_with_another_vocabulary_is_refused_naming_the_option(reference):
    other = train_wordpiece(["completely different words here"] * 50, 120)
    with pytest.raises(UserError, match="--heldout: .* another tokenizer"):
        HeldoutSet.load(reference["path"], other)
    with pytest.raises(UserError, match="--heldout: no such file"):
        HeldoutSet.load(reference["root"] / "missing.safetensors")


def test_scores_do_not_depend_on_the_batch_size_and_match_their_definitions(reference):
    from transformers import ElectraForPreTraining

    torch.manual_seed(0)
    discriminator = ElectraForPreTraining.from_pretrained(f"{reference['run'].output_dir}/discriminator")
    discriminator.train()  # evaluation must switch dropout off and then restore the mode
    heldout = HeldoutSet.load(reference["path"])
    small, large = (evaluate_heldout(discriminator, heldout, batch_size=b) for b in (5, 64))
    assert discriminator.training
    assert small["heldout_auc"] == pytest.approx(large["heldout_auc"], abs=1e-12)
    assert small["heldout_loss"] == pytest.approx(large["heldout_loss"], rel=1e-5)
    discriminator.eval()
    with torch.no_grad():
        d = discriminator_losses(discriminator, heldout.tensors)
    real = d.mask.bool()
    assert large["heldout_auc"] == pytest.approx(
        ranking_auc(d.logits[d.labels.bool() & real], d.logits[~d.labels.bool() & real]), abs=1e-12)
    token_mean = float((d.per_example * d.mask.sum(1)).sum() / d.mask.sum())
    assert large["heldout_loss"] == pytest.approx(token_mean, rel=1e-5)
    assert large["heldout_base_entropy"] == pytest.approx(base_rate_entropy(heldout.replaced_share))


def test_scoring_along_training_changes_nothing_in_the_run(reference, corpus, tmp_path):
    settings = dict(variant="tmr-loss_diff", steps=6, dropout=0.1, max_lines=TRAIN_LINES)
    scored = pretrain(tiny_config(corpus, tmp_path / "scored", heldout=str(reference["path"]), heldout_every=4,
                                  **settings))
    plain = pretrain(tiny_config(corpus, tmp_path / "plain", **settings))
    assert scored.losses == plain.losses
    records = read_metrics(scored.metrics_path)
    assert [r["step"] for r in records if "heldout_auc" in r] == [4, 6]  # every 4 steps and the last
    assert all(0.0 <= r["heldout_auc"] <= 1.0 and r["heldout_loss"] > 0 for r in records if "heldout_auc" in r)
    # the scoring passes are timed apart from the steps, so a run's wall time can count them
    assert [r["step"] for r in records if r.get("heldout_seconds", 0) > 0] == [4, 6]
    assert scored.summary["final_heldout_auc"] == records[-1]["heldout_auc"]
    config = json.loads((tmp_path / "scored" / "config.json").read_text())
    assert config["heldout"] == str(reference["path"]) and config["heldout_every"] == 4


@pytest.mark.parametrize("flags, fragment", [
    (["--start-line", "-1"], "--start-line"),
    (["--examples", "0"], "--examples"),
    (["--run", "/no/such/dir"], "--run"),
])
def test_heldout_command_errors_are_one_line(reference, flags, fragment, capsys):
    status = cli.main([*reference["argv"], *flags])
    err = capsys.readouterr().err.strip()
    assert status == 2 and fragment in err and len(err.splitlines()) == 1, err


def test_heldout_refuses_a_run_without_generator_or_held_out_lines(reference, tmp_path, capsys):
    """The text and masking come from the run's config; what the config cannot say must be given."""
    saved = json.loads((Path(reference["run"].output_dir) / "config.json").read_text())
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps(saved))
    assert cli.main(["heldout", "--run", str(bare), "--output", str(tmp_path / "a.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "--run" in err and "generator" in err
    whole = tmp_path / "whole"
    whole.mkdir()
    (whole / "config.json").write_text(json.dumps({**saved, "max_lines": None}))
    (whole / "generator").symlink_to(Path(reference["run"].output_dir) / "generator")
    assert cli.main(["heldout", "--run", str(whole), "--output", str(tmp_path / "b.safetensors")]) == 2
    assert "--start-line" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.safetensors"))  # nothing written on a refusal

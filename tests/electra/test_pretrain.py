"""Fast tests of ELECTRA/TMR pretraining on tiny models and a generated corpus (CPU, a few seconds each)."""
from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("datasets")

from replayloader_electra import cli  # noqa: E402
from replayloader_electra.grad_norms import GhostNorms, loop_grad_norms  # noqa: E402
from replayloader_electra.models import (PRESETS, build_electra_pair, embeddings_are_shared,  # noqa: E402
                                         with_overrides)
from replayloader_electra.errors import UserError  # noqa: E402
from replayloader_electra.finetune.options import default_data_dir  # noqa: E402
from replayloader_electra.pretrain.config import buffer_strategy  # noqa: E402
from replayloader_electra.pretrain import (VARIANTS, PretrainConfig, SpecialIds, choose_masked_positions,  # noqa: E402
                                           corrupt_batch, discriminator_losses, gumbel_max_sample, make_optimizer,
                                           mask_inputs, pretrain, read_metrics, resume_config,
                                           uniform_replacements)

from .checkpoint_files import write_config_only_checkpoint  # noqa: E402

SPECIAL = SpecialIds(pad=0, cls=2, sep=3, mask=4)
VOCAB = 120


def random_batch(batch: int = 6, length: int = 24, seed: int = 0, pad_rows: bool = True) -> dict:
    """[CLS] tokens [SEP] [PAD]... rows with ids >= 5, some rows padded."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(batch):
        n = length - (3 * row if pad_rows else 0)
        ids[row, 0], ids[row, n - 1] = SPECIAL.cls, SPECIAL.sep
        ids[row, n:] = SPECIAL.pad
        mask[row, n:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def tiny_pair(dropout: float = 0.0, seed: int = 0, **sizes):
    preset = with_overrides(PRESETS["tiny"], **sizes)
    return build_electra_pair(preset, VOCAB, SPECIAL.pad, dropout=dropout, seed=seed)


def tiny_config(corpus: dict, out, **overrides) -> PretrainConfig:
    settings = dict(preset="tiny", corpus=corpus["file"], vocab_size=200, max_len=32, batch_size=8, steps=6,
                    buffer_size=32, warmup_steps=2, output_dir=str(out), cache_dir=corpus["cache"], progress=False,
                    export_hf=False)
    settings.update(overrides)
    return PretrainConfig(**settings)


# ----------------------------------------------------------------------------- masking and sampling
def test_masking_rate_positions_and_mask_token_split():
    torch.manual_seed(0)
    raw = random_batch(batch=64, length=64, pad_rows=False)
    raw["input_ids"][:, 40:] = SPECIAL.pad
    raw["attention_mask"][:, 40:] = 0
    raw["input_ids"][:, 39] = SPECIAL.sep
    eligible = 38  # positions 1..38
    mask_token, kept, total = 0, 0, 0
    for _ in range(20):
        generator_input, masked = mask_inputs(raw["input_ids"], raw["attention_mask"], SPECIAL, 0.15, 0.85)
        assert (masked.sum(1) == round(0.15 * eligible)).all()  # exact 15% (rounded) of eligible tokens per row
        assert not masked[:, 0].any() and not masked[:, 39:].any()  # never [CLS], [SEP] or padding
        assert torch.equal(generator_input[~masked], raw["input_ids"][~masked])  # unmasked positions untouched
        at_masked = generator_input[masked]
        is_mask = at_masked == SPECIAL.mask
        assert torch.equal(at_masked[~is_mask], raw["input_ids"][masked][~is_mask])  # the rest keep the token
        mask_token += int(is_mask.sum())
        kept += int((~is_mask).sum())
        total += int(masked.sum())
    assert abs(mask_token / total - 0.85) < 0.02
    counts = torch.zeros(64)
    for _ in range(200):  # positions are chosen uniformly among eligible ones
        counts += choose_masked_positions(raw["input_ids"], raw["attention_mask"], SPECIAL, 0.15).float().sum(0)
    per_position = counts[1:39] / (200 * 64)
    assert per_position.min() > 0.12 and per_position.max() < 0.18


def test_gumbel_max_follows_the_softmax_distribution():
    torch.manual_seed(0)
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5, -3.0])
    n = 200_000
    samples = gumbel_max_sample(logits.expand(n, -1))
    observed = torch.bincount(samples, minlength=6).double() / n
    expected = torch.softmax(logits.double(), 0)
    chi2 = float((n * (observed - expected) ** 2 / expected).sum())
    assert chi2 < 20.5  # 5 d.o.f., p ≈ 0.001
    extreme = torch.tensor([[1e4, -1e4, 0.0]], dtype=torch.float16).expand(1000, -1)
    assert (gumbel_max_sample(extreme) == 0).all()  # float16 input, no NaN, no gradient
    assert not gumbel_max_sample(logits.requires_grad_()).requires_grad


# ----------------------------------------------------------------------------- models
def test_embedding_table_is_one_tensor_across_generator_and_discriminator():
    pair = tiny_pair()
    assert embeddings_are_shared(pair)
    table = pair.discriminator.electra.embeddings.word_embeddings.weight
    assert pair.generator.generator_lm_head.weight.data_ptr() == table.data_ptr()
    assert sum(1 for p in pair.parameters() if p is table) == 1  # listed once, optimised once
    optimizer = make_optimizer(pair, 1e-3, 0.01)
    examples, aux = corrupt_batch(pair.part("generator"), random_batch(), SPECIAL)
    (aux["generator_loss"] + 50 * discriminator_losses(pair.discriminator, examples).loss).backward()
    optimizer.step()
    assert embeddings_are_shared(pair)
    assert pair.generator.generator_predictions.dense.out_features == PRESETS["tiny"].embedding
    assert pair.generator.config.hidden_size == PRESETS["tiny"].hidden // 4


# ----------------------------------------------------------------------------- labels and losses
def test_labels_mark_replaced_tokens_and_sampled_originals_count_as_original():
    pair = tiny_pair()
    raw = random_batch()
    raw["input_ids"][raw["attention_mask"].bool() & (raw["input_ids"] > 4)] = 7  # every real token is id 7
    with torch.no_grad():
        pair.generator.generator_lm_head.bias.fill_(-1e4)
        pair.generator.generator_lm_head.bias[7] = 1e4  # the generator always samples the original token
    examples, _ = corrupt_batch(pair.part("generator"), raw, SPECIAL)
    assert examples["masked"].any()
    d = discriminator_losses(pair.discriminator, examples)
    assert d.labels.sum() == 0  # masked but sampled equal to the original: "original"
    # Hand-made data: replaced exactly where input differs from the original.
    data = {"input_ids": raw["input_ids"].clone(), "original_ids": raw["input_ids"].clone(),
            "attention_mask": raw["attention_mask"]}
    data["input_ids"][0, 3] = 9
    data["input_ids"][1, 5] = 11
    labels = discriminator_losses(pair.discriminator, data).labels
    assert labels.sum() == 2 and labels[0, 3] == 1 and labels[1, 5] == 1


def test_per_example_losses_match_the_scalar_loss_and_hf_loss():
    pair = tiny_pair()
    pair.eval()
    examples, _ = corrupt_batch(pair.part("generator"), random_batch(), SPECIAL)
    d = discriminator_losses(pair.discriminator, examples)
    tokens = examples["attention_mask"].sum(1).float()
    assert torch.allclose((d.per_example * tokens).sum() / tokens.sum(), d.loss, atol=1e-6)
    hf = pair.discriminator(input_ids=examples["input_ids"], attention_mask=examples["attention_mask"],
                            labels=d.labels.long()).loss
    assert torch.allclose(hf, d.loss, atol=1e-6)  # HF's own loss: token mean over non-padding positions
    for row in range(len(tokens)):  # each example alone, padding trimmed
        n = int(tokens[row])
        single = {k: v[row:row + 1, :n] for k, v in examples.items()}
        alone = discriminator_losses(pair.discriminator, single).per_example[0]
        assert torch.allclose(alone, d.per_example[row], atol=1e-5)


def test_joint_loss_decreases_on_a_fixed_batch():
    torch.manual_seed(0)
    pair = tiny_pair(dropout=0.0)
    optimizer = make_optimizer(pair, 2e-3, 0.01)
    raw = random_batch(batch=8, length=24, pad_rows=False)
    losses = []
    for _ in range(40):
        examples, aux = corrupt_batch(pair.part("generator"), raw, SPECIAL)
        d = discriminator_losses(pair.discriminator, examples)
        loss = aux["generator_loss"] + 50 * d.loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(pair.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    assert np.mean(losses[-5:]) < 0.75 * np.mean(losses[:5])


# ----------------------------------------------------------------------------- gradient norms
@pytest.mark.parametrize("weighted", [False, True])
def test_ghost_norms_equal_a_loop_of_batch1_backward_passes(weighted):
    torch.manual_seed(0)
    pair = tiny_pair(dropout=0.0, embedding=32)  # embedding != hidden: covers the embeddings_project Linear
    assert hasattr(pair.discriminator.electra, "embeddings_project")
    raw = random_batch(batch=6, length=20)
    raw["input_ids"][1, 4] = raw["input_ids"][1, 8] = raw["input_ids"][1, 9]  # repeated ids share embedding rows
    examples, aux = corrupt_batch(pair.part("generator"), raw, SPECIAL)  # generator uses the shared embeddings first
    weights = torch.linspace(0.5, 1.5, 6) if weighted else None
    ghost = GhostNorms(pair.discriminator)
    with ghost.record():
        d = discriminator_losses(pair.discriminator, examples, weights)
    (aux["generator_loss"] + 50 * d.loss).backward()  # L_G's share of the embedding grad must not count
    ghost_norms = ghost.norms(50 * d.coefficients.double())
    reference = loop_grad_norms(pair.discriminator, lambda m, b: discriminator_losses(m, b).per_example,
                                {k: v.detach() for k, v in examples.items()})
    ghost.remove()
    assert torch.allclose(ghost_norms, reference, rtol=1e-4)


def test_logit_bound_matches_its_definition_and_the_core_helper():
    """tmr-grad_bound feeds logits/labels/mask back and the library's `grad_bound_sigmoid` computes the bound: it
    must be ‖∂ℓ_i/∂z_i‖ for the discriminator's per-example loss ℓ_i (mean BCE over real tokens)."""
    from replayloader.strategies import grad_bound_sigmoid

    torch.manual_seed(0)
    logits = torch.randn(4, 10, requires_grad=True)
    labels = (torch.rand(4, 10) < 0.3).float()
    mask = torch.ones(4, 10)
    mask[2, 6:] = 0
    bound = grad_bound_sigmoid(logits.detach(), labels, mask)
    for i in range(4):
        per_token = torch.nn.functional.binary_cross_entropy_with_logits(logits[i], labels[i], reduction="none")
        loss = (per_token * mask[i]).sum() / mask[i].sum()
        (grad,) = torch.autograd.grad(loss, logits)
        assert math.isclose(float(grad.norm()), float(bound[i]), rel_tol=1e-5)


# ----------------------------------------------------------------------------- the training loop
def test_every_variant_runs_a_few_steps(corpus, tmp_path):
    for variant in VARIANTS:
        result = pretrain(tiny_config(corpus, tmp_path / variant, variant=variant, steps=5))
        records = read_metrics(result.metrics_path)
        assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
        assert all(math.isfinite(r["loss"]) for r in records)
        if variant == "electra":
            assert all(r["fresh_fraction"] == 1.0 for r in records)  # D sees exactly the produced batch
        else:
            assert records[-1]["fresh_fraction"] < 1.0  # replayed examples appear once the buffer fills
        if variant == "tmr-grad_norm":
            assert records[-1]["example_grad_norm_mean"] > 0
        assert (tmp_path / variant / "losses.png").stat().st_size > 0


def test_uniform_replacements_avoid_special_tokens_and_cover_the_rest():
    torch.manual_seed(0)
    drawn = uniform_replacements(torch.zeros(20_000, VOCAB), SPECIAL)
    specials = {SPECIAL.pad, SPECIAL.cls, SPECIAL.sep, SPECIAL.mask}
    assert not specials & set(drawn.tolist())
    counts = torch.bincount(drawn, minlength=VOCAB)
    allowed = [i for i in range(VOCAB) if i not in specials]
    assert (counts[allowed] > 0).all()  # 20,000 draws over 116 ids: every id shows up
    assert counts[allowed].float().std() / counts[allowed].float().mean() < 0.15  # flat (expected ≈ 0.08)


@pytest.mark.parametrize("variant", ["electra", "tmr-loss_diff"])
def test_discriminator_learns_when_replacements_are_easy(corpus, tmp_path, one_torch_thread, variant):
    """End to end through `pretrain`: with replacements drawn uniformly over the vocabulary (easy to spot), the
    discriminator must learn to rank replaced tokens above originals. It stays at AUC ≈ 0.5 if it sees the
    original ids (checked once with that bug put in), if its labels are misaligned, or if its parameters are not stepped; this tells
    a broken pipeline apart from a discriminator that is merely too small for a good generator's replacements."""
    records = read_metrics(pretrain(tiny_config(corpus, tmp_path, variant=variant, steps=40, batch_size=16,
                                                warmup_steps=5, replacements="uniform")).metrics_path)
    first, last = records[0]["replaced_auc"], np.mean([r["replaced_auc"] for r in records[-5:]])
    assert first < 0.65, first  # untrained: about chance
    assert last > 0.8, (first, last)  # measured 0.87-0.89 over 3 seeds
    assert np.mean([r["discriminator_loss"] for r in records[-5:]]) < records[0]["discriminator_loss"]


def test_checkpoint_resume_reproduces_the_uninterrupted_run_exactly(corpus, tmp_path):
    full = pretrain(tiny_config(corpus, tmp_path / "full", steps=8, checkpoint_every=4, keep_checkpoints=5,
                                dropout=0.1, variant="tmr-loss_diff"))
    assert (tmp_path / "full" / "checkpoints" / "step-00000004" / "tensors.safetensors").is_file()
    shutil.copytree(tmp_path / "full", tmp_path / "resumed")
    resumed = pretrain(resume_config(str(tmp_path / "resumed" / "checkpoints" / "step-00000004"),
                                     output_dir=str(tmp_path / "resumed"), progress=False))
    assert resumed.losses == full.losses  # steps 1-4 kept from the log, 5-8 recomputed after the resume
    first = read_metrics(tmp_path / "full" / "metrics.jsonl")
    again = read_metrics(tmp_path / "resumed" / "metrics.jsonl")
    for key in ("generator_loss", "discriminator_loss", "sample_age_mean", "buffer_weight_mean"):
        assert [r[key] for r in first] == [r[key] for r in again], key


def test_hf_export_loads_with_auto_classes(corpus, tmp_path):
    from transformers import AutoModel, AutoTokenizer

    result = pretrain(tiny_config(corpus, tmp_path / "run", steps=2, export_hf=True))
    model = AutoModel.from_pretrained(result.discriminator_dir)
    tokenizer = AutoTokenizer.from_pretrained(result.discriminator_dir)
    assert tokenizer.is_fast and tokenizer.mask_token == "[MASK]"
    encoded = tokenizer("the cat sat on the mat", return_tensors="pt")
    assert model(**encoded).last_hidden_state.shape[-1] == PRESETS["tiny"].hidden


def test_export_of_a_checkpoint_equals_the_runs_own_export_at_that_step(corpus, tmp_path):
    from transformers import AutoModel

    result = pretrain(tiny_config(corpus, tmp_path / "run", steps=6, checkpoint_every=3, keep_checkpoints=0,
                                  export_hf=True))
    final_dir = cli.main(["export", "--checkpoint", str(tmp_path / "run"), "--output-dir", str(tmp_path / "last")])
    assert final_dir == 0
    early = cli.main(["export", "--checkpoint", str(tmp_path / "run" / "checkpoints" / "step-00000003"),
                      "--output-dir", str(tmp_path / "early")])
    assert early == 0
    own, last, at3 = (AutoModel.from_pretrained(d).state_dict()
                      for d in (result.discriminator_dir, tmp_path / "last" / "discriminator",
                                tmp_path / "early" / "discriminator"))
    assert all(torch.equal(own[k], last[k]) for k in own)  # the latest checkpoint is the final model
    assert not all(torch.equal(own[k], at3[k]) for k in own)  # step 3 is not
    assert (tmp_path / "early" / "generator" / "config.json").is_file()
    assert (tmp_path / "early" / "discriminator" / "tokenizer.json").is_file()


# ----------------------------------------------------------------------------- command line
@pytest.mark.parametrize("argv, fragment", [
    (["pretrain", "--variant", "tmr-nope"], "unknown variant"),
    (["pretrain", "--preset", "huge"], "unknown preset"),
    (["pretrain", "--corpus", "/no/such/file.txt"], "not found"),
    (["pretrain", "--steps", "0"], "--steps"),
    (["pretrain", "--resume", "/no/such/run"], "no checkpoint"),
    (["--steps", "many"], "invalid int"),
    (["pretrain", "--buffer-size", "4"], "--buffer-size"),
    (["pretrain", "--replacements", "random"], "--replacements"),
])
def test_cli_errors_are_one_line(argv, fragment, tmp_path, capsys):
    try:
        status = cli.main([*argv, "--output-dir", str(tmp_path / "out")])
    except SystemExit as exit_:  # argparse errors
        status = exit_.code
    err = capsys.readouterr().err.strip()
    assert status == 2
    assert fragment in err and "Traceback" not in err and len(err.splitlines()) == 1, err


def test_cli_empty_corpus_is_one_line(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n")
    status = cli.main(["pretrain", "--corpus", str(empty), "--output-dir", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "empty" in err and len(err.splitlines()) == 1, err


def test_cli_pretrain_runs_and_writes_summary(corpus, tmp_path, capsys):
    status = cli.main(["pretrain", "--variant", "tmr-grad_bound", "--corpus", corpus["file"], "--vocab-size", "200",
                       "--max-len", "32", "--batch-size", "8", "--steps", "3", "--buffer-size", "16",
                       "--output-dir", str(tmp_path / "run"), "--cache-dir", corpus["cache"], "--no-progress"])
    assert status == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["variant"] == "tmr-grad_bound" and summary["steps"] == 3


def _compare_args(corpus: dict, out) -> list[str]:
    return ["compare", "--corpus", corpus["file"], "--vocab-size", "200", "--max-len", "32", "--batch-size", "8",
            "--steps", "3", "--buffer-size", "16", "--output-dir", str(out), "--cache-dir", corpus["cache"],
            "--no-progress"]


def test_cli_compare_without_glue_says_fine_tuning_was_skipped(corpus, tmp_path, capsys):
    # --glue-dir none: as without ../shared/data/glue (a bad --glue-dir is refused at once: test_cli_newcomer.py)
    status = cli.main([*_compare_args(corpus, tmp_path / "cmp"), "--glue-dir", "none"])
    assert status == 0
    summary = (tmp_path / "cmp" / "summary.md").read_text()
    assert "| electra | tmr-loss_diff |" in summary and "fine-tuning skipped" in summary
    reason = "fine-tuning skipped: no GLUE data given"
    assert capsys.readouterr().out.startswith(reason) and "--glue-dir hub" in summary  # said first, with the fix
    assert (tmp_path / "cmp" / "compare.png").is_file()


@pytest.mark.skipif(default_data_dir("glue") is None, reason="no GLUE data: set REPLAYLOADER_DATA (tests/conftest.py does, where it exists)")
def test_cli_compare_fine_tunes_both_discriminators(corpus, tmp_path):
    pytest.importorskip("replayloader_electra.finetune.api")
    status = cli.main([*_compare_args(corpus, tmp_path / "cmp"), "--finetune-train-examples", "32",
                       "--finetune-eval-examples", "32"])
    assert status == 0
    summary = (tmp_path / "cmp" / "summary.md").read_text()
    assert "Fine-tuning (sst2, dev)" in summary and "| tmr-loss_diff | 1 |" in summary


def test_resume_keeps_every_typed_flag_even_one_equal_to_its_default(tmp_path):
    step_dir = tmp_path / "run" / "checkpoints" / "step-00000004"
    saved = PretrainConfig(variant="tmr-grad_norm", steps=8, checkpoint_every=4, seed=3, mask_prob=0.2,
                           output_dir=str(tmp_path / "run"))
    write_config_only_checkpoint(step_dir, saved, step=4)
    args = cli.build_parser().parse_args(["pretrain", "--resume", str(tmp_path / "run"), "--checkpoint-every", "0",
                                          "--steps", "12", "--no-progress"])
    config = cli.pretrain_config(args)
    assert config.checkpoint_every == 0  # typed, and equal to the default: still applied
    assert config.steps == 12 and config.progress is False
    assert (config.variant, config.seed, config.mask_prob) == ("tmr-grad_norm", 3, 0.2)  # not typed: as saved
    assert config.output_dir == str(tmp_path / "run") and config.resume == str(step_dir)


def test_cli_flags_map_onto_config_fields_and_only_typed_ones_are_set():
    args = cli.build_parser().parse_args(["pretrain", "--mask-prob", "0.3", "--lr", "1e-3", "--hidden", "32",
                                          "--generator-fraction", "0.5"])
    config = cli.pretrain_config(args)
    assert (config.mask_prob, config.learning_rate, config.hidden, config.generator_fraction) == (0.3, 1e-3, 32, 0.5)
    assert config.steps is None and config.layers is None  # untyped: the preset's value, filled in later


def test_model_size_options_shape_both_models_and_default_to_the_preset():
    from replayloader_electra.pretrain import model_preset

    default = model_preset(PretrainConfig().filled())
    assert default == with_overrides(PRESETS["tiny"], max_len=PRESETS["tiny"].max_len)
    sized = model_preset(PretrainConfig(hidden=32, layers=3, generator_fraction=0.5, generator_layers=1).filled())
    pair = build_electra_pair(sized, VOCAB, SPECIAL.pad)
    d, g = pair.discriminator.config, pair.generator.config
    assert (d.hidden_size, d.intermediate_size, d.embedding_size, d.num_hidden_layers) == (32, 128, 32, 3)
    assert (g.hidden_size, g.intermediate_size, g.num_hidden_layers) == (16, 64, 1)
    assert g.embedding_size == 32  # the shared embedding table


@pytest.mark.parametrize("overrides, fragment", [
    ({"hidden": 33}, "--hidden"), ({"layers": 0}, "--layers"), ({"generator_fraction": 1.5}, "--generator-fraction"),
    ({"generator_layers": 0}, "--generator-layers"), ({"mask_prob": 1.0}, "--mask-prob"),
])
def test_bad_model_options_are_user_errors_naming_the_flag(overrides, fragment):
    from replayloader_electra.errors import UserError

    with pytest.raises(UserError, match=fragment):
        PretrainConfig(**overrides).filled()


def test_ranking_auc_counts_pairs_ranked_right_and_ties_as_half():
    from replayloader_electra.pretrain.metrics import ranking_auc

    positive, negative = torch.tensor([0.9, 0.2, 0.5]), torch.tensor([0.1, 0.5, 0.3, 0.95])
    pairs = [(p > n) + 0.5 * (p == n) for p in positive.tolist() for n in negative.tolist()]
    assert ranking_auc(positive, negative) == pytest.approx(float(np.mean(pairs)))
    assert math.isnan(ranking_auc(positive, negative[:0]))


def test_cli_lets_a_bug_keep_its_traceback(monkeypatch, tmp_path):
    """Only `UserError` becomes a one-line message; any other exception (a bug) propagates."""
    import replayloader_electra.pretrain as pretrain_package

    def broken(config):
        raise ValueError("a bug, not a user mistake")

    monkeypatch.setattr(pretrain_package, "pretrain", broken)
    with pytest.raises(ValueError, match="a bug"):
        cli.main(["pretrain", "--output-dir", str(tmp_path / "out"), "--no-progress"])


# ----------------------------------------------------------------------------- ablation knobs
def test_eviction_option_swaps_only_the_variants_eviction(corpus, tmp_path):
    for variant in ("tmr-loss_diff", "tmr-grad_norm", "tmr-lsr"):
        own = buffer_strategy(tiny_config(corpus, tmp_path, variant=variant)).config()
        fifo = buffer_strategy(tiny_config(corpus, tmp_path, variant=variant, eviction="fifo")).config()
        assert own["evict"] == "lowest" and fifo == {**own, "evict": "fifo"}
    with pytest.raises(UserError, match="--eviction must be one of lowest, fifo, got 'oldest'"):
        tiny_config(corpus, tmp_path, variant="tmr-loss_diff", eviction="oldest").filled()
    with pytest.raises(UserError, match="--eviction applies to a tmr variant"):
        tiny_config(corpus, tmp_path, variant="electra", eviction="fifo").filled()


def test_a_run_with_a_swapped_eviction_saves_it_and_resumes_exactly(corpus, tmp_path):
    config = tiny_config(corpus, tmp_path / "fifo", variant="tmr-loss_diff", eviction="fifo", alpha=0.0, steps=12,
                         checkpoint_every=6, keep_checkpoints=5)
    run = pretrain(config)
    state = json.loads((tmp_path / "fifo" / "checkpoints" / "step-00000012" / "state.json").read_text())
    assert state["config"]["eviction"] == "fifo"
    rank_state = (tmp_path / "fifo" / "checkpoints" / "step-00000012" / "rank-00000.json").read_text()
    assert '"evict": "fifo"' in rank_state and '"update": "loss_diff"' in rank_state  # the buffer used it
    shutil.copytree(tmp_path / "fifo", tmp_path / "again")
    resumed = pretrain(resume_config(str(tmp_path / "again" / "checkpoints" / "step-00000006"),
                                     output_dir=str(tmp_path / "again"), progress=False))
    assert resumed.losses == run.losses

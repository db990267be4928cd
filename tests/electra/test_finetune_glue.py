"""GLUE: TSV loaders (official layout, quirks), the optimiser recipe, tables, CLI and tiny end-to-end runs."""

from __future__ import annotations

import argparse
import csv
import random
import warnings
from pathlib import Path

import pytest
import torch
from replayloader_electra.errors import UserError
from replayloader_electra.flags import options_from
from replayloader_electra.finetune.api import finetune_glue, finetune_glue_task, glue_table, render_markdown
from replayloader_electra.finetune.cli import add_finetune_subparser
from replayloader_electra.finetune.glue import (check_local_files, GLUE_TASKS, load_glue_split, read_glue_tsv,
                                                seeded_subset)
from replayloader_electra.finetune.options import DataOptions, GlueOptions, SquadOptions, SubsetOptions, TrainingOptions
from replayloader_electra.finetune.sources import DataSource, resolve_data_source
from replayloader_electra.finetune.training import layerwise_parameter_groups, resolve_config
from tests.electra.tiny_checkpoint import build_tiny_checkpoint
from transformers import get_linear_schedule_with_warmup

SHARED_GLUE = (Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "glue").resolve()
POSITIVE = "good great fine nice".split()
NEGATIVE = "bad awful poor sad".split()
FILLER = "the movie film plot actor scene story was is a very quite and with of".split()


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def write_tsv(path: Path, header: list[str] | None, rows: list[list[str]], bom: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = (["\t".join(header)] if header else []) + ["\t".join(r) for r in rows]
    path.write_text(("\ufeff" if bom else "") + "\n".join(lines) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------- loaders on official-format files

QQP_HEADER = ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"]
MNLI_DEV_HEADER = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
                   "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "label2", "label3",
                   "label4", "label5", "gold_label"]
MNLI_TRAIN_HEADER = MNLI_DEV_HEADER[:11] + ["gold_label"]


def test_qqp_loader_skips_malformed_lines(tmp_path):
    path = tmp_path / "QQP" / "train.tsv"
    rows = [
        ["201", "1", "2", 'How do I say "hello"?', "How to greet?", "1"],
        ["202", "3", "4", "What is AI?", "What is ML?", "0"],
        ["203", "5", "6", "A question split by a newline"],  # malformed: 4 fields
        ["7", "8", "and its rest?", "0"],  # the rest of it: 4 fields
        ["204", "9", "10", "Why?", "Why not?", "duplicate"],  # malformed: unknown label
        ["205", "11", "12", "Is it?", "It is.", "1"],
    ]
    write_tsv(path, QQP_HEADER, rows)
    with pytest.warns(UserWarning, match="skipped 3 malformed"):
        dataset, report = read_glue_tsv(GLUE_TASKS["qqp"], path)
    assert report.kept == 3 and report.skipped_lines == [4, 5, 6]
    assert dataset.column_names == ["question1", "question2", "label", "idx"]
    assert dataset["question1"][0] == 'How do I say "hello"?'  # bare quotes kept, no row merging
    assert dataset["label"] == [1, 0, 1]


def test_mnli_loader_matched_and_mismatched(tmp_path):
    def mnli_row(i, premise, hypothesis, gold, train):
        labels = [gold] if train else [gold, gold, "neutral", gold, gold]
        return [str(i), "p", "q", "fiction", "(x)", "(y)", "(X)", "(Y)", premise, hypothesis, *labels, gold]

    glue = tmp_path / "glue"
    write_tsv(glue / "MNLI" / "train.tsv", MNLI_TRAIN_HEADER,
              [mnli_row(0, "A man eats.", "Someone eats.", "entailment", True),
               mnli_row(1, "A man eats.", "Nobody eats.", "contradiction", True),
               mnli_row(2, "A man eats.", "He is hungry.", "neutral", True)])
    write_tsv(glue / "MNLI" / "dev_matched.tsv", MNLI_DEV_HEADER, [mnli_row(0, "It rains.", "It is wet.", "entailment", False)])
    write_tsv(glue / "MNLI" / "dev_mismatched.tsv", MNLI_DEV_HEADER,
              [mnli_row(0, "It rains.", "It is dry.", "contradiction", False),
               mnli_row(1, "It rains.", "It is cold.", "neutral", False)])
    source = DataSource(local_dir=glue)
    task = GLUE_TASKS["mnli"]
    train = load_glue_split(task, "train", source)
    assert train.column_names == ["premise", "hypothesis", "label", "idx"]
    assert train["label"] == [0, 2, 1]  # hub ids: entailment 0, neutral 1, contradiction 2
    assert load_glue_split(task, "validation_matched", source)["hypothesis"] == ["It is wet."]
    assert load_glue_split(task, "validation_mismatched", source)["label"] == [2, 1]


def test_qnli_loader_and_missing_train_file_is_named(tmp_path):
    glue = tmp_path / "glue"
    header = ["index", "question", "sentence", "label"]
    write_tsv(glue / "QNLI" / "dev.tsv", header, [["0", "Who wrote it?", "It was written by Ann.", "entailment"],
                                                  ["1", "When?", "Nobody knows where.", "not_entailment"]])
    task, source = GLUE_TASKS["qnli"], DataSource(local_dir=glue)
    dev = load_glue_split(task, "validation", source)
    assert dev["question"] == ["Who wrote it?", "When?"] and dev["label"] == [0, 1]
    with pytest.raises(UserError, match=r"missing file .*QNLI/train\.tsv"):
        check_local_files(task, source)
    write_tsv(glue / "QNLI" / "train.tsv", header, [["0", "Q?", "S.", "entailment"]])
    assert len(load_glue_split(task, "train", source)) == 1


def test_cola_without_header_and_mrpc_with_bom(tmp_path):
    cola = tmp_path / "CoLA.tsv"
    write_tsv(cola, None, [["gj04", "1", "", "The dog barked."], ["gj04", "0", "*", "Dog the barked."]])
    dataset, _ = read_glue_tsv(GLUE_TASKS["cola"], cola)
    assert dataset["sentence"] == ["The dog barked.", "Dog the barked."] and dataset["label"] == [1, 0]
    mrpc = tmp_path / "MRPC.tsv"
    write_tsv(mrpc, ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"], [["1", "1", "2", "He left.", "He went."]], bom=True)
    dataset, _ = read_glue_tsv(GLUE_TASKS["mrpc"], mrpc)
    assert dataset["sentence1"] == ["He left."] and dataset["label"] == [1]


def test_data_source_rules(tmp_path):
    assert resolve_data_source(None, "nyu-mll/glue", "GLUE").hub_name == "nyu-mll/glue"
    assert resolve_data_source("hf:someone/glue", "nyu-mll/glue", "GLUE").hub_name == "someone/glue"
    assert resolve_data_source(str(tmp_path), "nyu-mll/glue", "GLUE").local_dir == tmp_path
    with pytest.raises(UserError, match="GLUE directory not found"):
        resolve_data_source(str(tmp_path / "nope"), "nyu-mll/glue", "GLUE")


def test_hub_path_uses_nyu_mll_glue_names(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        return datasets.Dataset.from_dict({"premise": ["p"], "hypothesis": ["h"], "label": [2], "idx": [0], "x": [1]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    source = resolve_data_source(None, "nyu-mll/glue", "GLUE")
    dataset = load_glue_split(GLUE_TASKS["mnli"], "validation_mismatched", source)
    assert calls == [("nyu-mll/glue", "mnli", "validation_mismatched")]
    assert dataset.column_names == ["premise", "hypothesis", "label", "idx"]


def test_hub_failure_is_one_clear_error(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(UserError, match=r"hub dataset nyu-mll/glue/sst2 .*no network.*local directory"):
        load_glue_split(GLUE_TASKS["sst2"], "train", resolve_data_source("hub", "nyu-mll/glue", "GLUE"))


EXPECTED_LOCAL_COUNTS = {"cola": (8551, 1043), "sst2": (67349, 872), "mrpc": (3668, 408), "stsb": (5749, 1500),
                         "rte": (2490, 277), "wnli": (635, 71)}


@pytest.mark.skipif(not SHARED_GLUE.is_dir(), reason="shared GLUE data absent")
@pytest.mark.parametrize("task_name", sorted(EXPECTED_LOCAL_COUNTS))
def test_real_local_glue_counts(task_name):
    task, source = GLUE_TASKS[task_name], DataSource(local_dir=SHARED_GLUE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no line of the official files may be skipped
        train = load_glue_split(task, "train", source)
        dev = load_glue_split(task, "validation", source)
    assert (len(train), len(dev)) == EXPECTED_LOCAL_COUNTS[task_name]
    if task_name == "stsb":
        assert dev["label"][0] == pytest.approx(5.0) and min(train["label"]) >= 0 and max(train["label"]) <= 5


@pytest.mark.skipif(not SHARED_GLUE.is_dir(), reason="shared GLUE data absent")
def test_real_local_qnli_dev_count_and_sst2_balance():
    source = DataSource(local_dir=SHARED_GLUE)
    assert len(load_glue_split(GLUE_TASKS["qnli"], "validation", source)) == 5463
    dev = load_glue_split(GLUE_TASKS["sst2"], "validation", source)
    assert sum(dev["label"]) == 444


def test_seeded_subset_is_reproducible_and_ordered(tmp_path):
    path = tmp_path / "SST-2.tsv"
    write_tsv(path, ["sentence", "label"], [[f"s{i}", str(i % 2)] for i in range(50)])
    dataset, _ = read_glue_tsv(GLUE_TASKS["sst2"], path)
    a, b = seeded_subset(dataset, 10, seed=3), seeded_subset(dataset, 10, seed=3)
    assert a["idx"] == b["idx"] == sorted(a["idx"]) and len(a) == 10
    assert seeded_subset(dataset, 10, seed=4)["idx"] != a["idx"]
    assert len(seeded_subset(dataset, 500, seed=0)) == 50


# ---------------------------------------------------------------------------- recipe


def test_layerwise_learning_rates_follow_electra():
    from transformers import ElectraConfig, ElectraModel

    encoder = ElectraModel(ElectraConfig(vocab_size=50, embedding_size=16, hidden_size=16, num_hidden_layers=2,
                                         num_attention_heads=2, intermediate_size=32))
    head = torch.nn.Linear(16, 2)
    groups = layerwise_parameter_groups(encoder, head, 2, resolve_config(16, 3, learning_rate=1.0, layer_decay=0.8))
    lr_of = {id(p): g["lr"] for g in groups for p in g["params"]}
    wd_of = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    named = dict(encoder.named_parameters())
    assert lr_of[id(head.weight)] == pytest.approx(1.0)
    assert lr_of[id(named["encoder.layer.1.attention.self.query.weight"])] == pytest.approx(0.8**2)
    assert lr_of[id(named["encoder.layer.0.output.dense.weight"])] == pytest.approx(0.8**3)
    assert lr_of[id(named["embeddings.word_embeddings.weight"])] == pytest.approx(0.8**4)
    assert wd_of[id(named["encoder.layer.0.output.dense.weight"])] == 0.01
    assert wd_of[id(named["encoder.layer.0.output.LayerNorm.weight"])] == 0.0
    assert wd_of[id(head.bias)] == 0.0


def test_warmup_then_linear_decay():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=2, num_training_steps=10)
    rates = []
    for _ in range(10):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    # transformers' schedule warms up as step/warmup (the hand-written one before issue 14 used (step+1)/warmup,
    # i.e. [0.5, 1.0, 1.0, ...]): the first step runs at rate 0.
    assert rates == pytest.approx([0.0, 0.5, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125])


def test_presets_and_task_epochs():
    assert resolve_config(256, 3).learning_rate == 3e-4
    assert resolve_config(768, 10).epochs == 10
    large = resolve_config(1024, 3)
    assert (large.learning_rate, large.layer_decay) == (5e-5, 0.9)
    assert resolve_config(256, 3, learning_rate=1e-3, epochs=1, batch_size=8).batch_size == 8
    assert GLUE_TASKS["rte"].epochs == GLUE_TASKS["stsb"].epochs == 10 and GLUE_TASKS["sst2"].epochs == 3
    with pytest.raises(UserError, match="--preset 'huge'"):
        resolve_config(256, 3, preset="huge")
    with pytest.raises(UserError, match="--batch-size must be > 0, got 0"):
        resolve_config(256, 3, batch_size=0)
    with pytest.raises(TypeError, match="batchsize"):  # a misspelt keyword is not silently ignored
        finetune_glue_task({"x": "x"}, "sst2", None, None, None, [0], "out", batchsize=8)


# ---------------------------------------------------------------------------- tables


def test_table_one_layout_with_average():
    rows = []
    for seed, offset in ((0, 0.0), (1, 0.02)):
        for task, metric in (("mnli", "accuracy"), ("qqp", "accuracy"), ("qnli", "accuracy"), ("sst2", "accuracy"),
                             ("cola", "mcc"), ("stsb", "spearman"), ("mrpc", "accuracy"), ("rte", "accuracy")):
            rows.append({"checkpoint": "electra", "task": task, "seed": seed, metric: 0.5 + offset})
    header, body = glue_table(rows)
    assert header == ["Model", "MNLI", "QQP", "QNLI", "SST", "CoLA", "STS", "MRPC", "RTE", "Avg."]
    assert body == [["electra"] + ["0.510 ± 0.014"] * 9]


# ---------------------------------------------------------------------------- end to end


def _review(rng: random.Random, positive: bool) -> str:
    words = [rng.choice(FILLER) for _ in range(rng.randint(4, 9))]
    words.insert(rng.randrange(len(words) + 1), rng.choice(POSITIVE if positive else NEGATIVE))
    return " ".join(words)


@pytest.fixture(scope="module")
def synthetic_glue(tmp_path_factory) -> Path:
    """SST-2 (single sentence), RTE (pair) and STS-B (regression) files in the official layout; dev = train."""
    rng = random.Random(0)
    glue = tmp_path_factory.mktemp("glue")
    sst_rows = [[_review(rng, i % 2 == 1), str(i % 2)] for i in range(48)]
    for split in ("train", "dev"):
        write_tsv(glue / "SST-2" / f"{split}.tsv", ["sentence", "label"], sst_rows)
    rte_rows = []
    for i in range(48):
        entailed = i % 2 == 0
        premise = " ".join(rng.choice(FILLER) for _ in range(8))  # the signal is in the second text
        rte_rows.append([str(i), premise, _review(rng, entailed),
                         "entailment" if entailed else "not_entailment"])
    for split in ("train", "dev"):
        write_tsv(glue / "RTE" / f"{split}.tsv", ["index", "sentence1", "sentence2", "label"], rte_rows)
    sts_header = ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2", "score"]
    sts_rows = []
    for i in range(48):
        score = 5.0 * (i % 4) / 3
        words = [rng.choice(FILLER) for _ in range(6)] + ["great"] * (i % 4)
        rng.shuffle(words)
        sts_rows.append([str(i), "main", "x", "2012", str(i), "none", "none", " ".join(words), "the film", f"{score:.3f}"])
    for split in ("train", "dev"):
        write_tsv(glue / "STS-B" / f"{split}.tsv", sts_header, sts_rows)
    return glue


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    rng = random.Random(1)
    lines = [" ".join(POSITIVE + NEGATIVE + FILLER)] * 10 + [_review(rng, i % 2 == 0) for i in range(300)]
    return build_tiny_checkpoint(tmp_path_factory.mktemp("glue_ckpt"), lines, vocab_size=120, seed=0)


FAST = {"learning_rate": 2e-3, "batch_size": 8, "progress": False}


@pytest.mark.parametrize(("task", "metric", "threshold"), [("sst2", "accuracy", 0.9), ("rte", "accuracy", 0.9),
                                                          ("stsb", "spearman", 0.8)])
def test_tiny_glue_finetune_learns(tmp_path, synthetic_glue, checkpoint, task, metric, threshold):
    rows = finetune_glue_task({"tiny": str(checkpoint)}, task, str(synthetic_glue), None, None, [0],
                              str(tmp_path / "out"), epochs=25, **FAST)
    (row,) = rows
    assert row["train_loss_last_epoch"] < 0.5 * row["train_loss_first_epoch"]
    assert row[metric] > threshold  # on the training examples: the pipeline fits what it is given
    assert row["train_examples"] == 48 and row["train_steps"] == 25 * 6


def test_two_checkpoints_two_seeds_and_subsets(tmp_path, synthetic_glue, checkpoint):
    rows = finetune_glue({"A": str(checkpoint), "B": str(checkpoint)}, ["sst2", "rte"], str(synthetic_glue),
                         max_train_examples=16, max_eval_examples=12, seeds=[0, 1], output_dir=str(tmp_path),
                         epochs=1, **FAST)
    assert len(rows) == 2 * 2 * 2
    assert {(r["train_examples"], r["eval_examples"], r["train_examples_total"]) for r in rows} == {(16, 12, 48)}
    # Same checkpoint, same seed -> same result; different seeds -> different heads.
    by_key = {(r["checkpoint"], r["task"], r["seed"]): r for r in rows}
    assert by_key[("A", "sst2", 0)]["train_loss_first_epoch"] == by_key[("B", "sst2", 0)]["train_loss_first_epoch"]
    assert by_key[("A", "sst2", 0)]["train_loss_first_epoch"] != by_key[("A", "sst2", 1)]["train_loss_first_epoch"]
    report = (tmp_path / "results.md").read_text()
    assert "| Model | SST | RTE |" in report and "sst2: train 16 of 48 examples, eval 12 of 48" in report
    with open(tmp_path / "results_glue.csv", newline="") as handle:
        table = list(csv.reader(handle))
    assert table[0] == ["Model", "SST", "RTE"] and [r[0] for r in table[1:]] == ["A", "B"]
    assert "±" in table[1][1]
    assert (tmp_path / "runs" / "B" / "rte" / "seed1.json").is_file()
    assert "Mean ± sample std over fine-tuning seeds [0, 1]" in render_markdown(rows)


# ---------------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="electra_tmr")
    add_finetune_subparser(parser.add_subparsers(dest="command", required=True))
    return parser


def test_cli_runs_a_task(tmp_path, synthetic_glue, checkpoint, capsys):
    args = _parser().parse_args(["finetune", "--checkpoint", f"mine={checkpoint}", "--task", "sst2",
                                 "--glue-dir", str(synthetic_glue), "--max-train-examples", "16", "--seeds", "0",
                                 "--epochs", "1", "--batch-size", "8", "--output-dir", str(tmp_path), "--no-progress"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "| Model | SST |" in out and "| mine |" in out
    assert (tmp_path / "results_glue.csv").is_file()


def test_cli_defaults_come_from_the_option_dataclasses():
    args = _parser().parse_args(["finetune", "--checkpoint", "d", "--task", "glue"])
    data, subset, training, glue, squad = (options_from(args, cls) for cls in (DataOptions, SubsetOptions,
                                                                               TrainingOptions, GlueOptions,
                                                                               SquadOptions))
    assert subset.seeds == [0, 1, 2] and training.learning_rate is None and training.batch_size == 32
    assert glue.max_length == 128 and squad.doc_stride == 128
    if SHARED_GLUE.is_dir():
        assert Path(data.glue_dir) == SHARED_GLUE
    repeated = _parser().parse_args(["finetune", "--checkpoint", "a=x", "--checkpoint", "b=y", "z", "--task", "sst2"])
    assert repeated.checkpoint == ["a=x", "b=y", "z"]  # a repeated flag adds to the list


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--checkpoint", "/nonexistent/ckpt", "--task", "sst2"], "checkpoint directory not found: /nonexistent/ckpt"),
        (["--checkpoint", "CKPT", "--task", "qqp", "--glue-dir", "GLUE"], "missing file"),
        (["--checkpoint", "a=CKPT", "--checkpoint", "a=CKPT", "--task", "sst2"], "two checkpoints are named 'a'"),
    ],
)
def test_cli_user_errors_are_one_line_without_traceback(argv, message, tmp_path, synthetic_glue, checkpoint, capsys):
    argv = [a.replace("CKPT", str(checkpoint)).replace("GLUE", str(synthetic_glue)) for a in argv]
    args = _parser().parse_args(["finetune", *argv, "--output-dir", str(tmp_path), "--no-progress"])
    with pytest.raises(SystemExit) as exit_info:
        args.func(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and message in err[-1] and "Traceback" not in "".join(err)


def test_prioritized_sampling_flag_trains_through_the_sampler(tmp_path, synthetic_glue, checkpoint):
    args = _parser().parse_args(["finetune", "--checkpoint", str(checkpoint), "--task", "sst2", "--sampling",
                                 "prioritized", "--glue-dir", str(synthetic_glue)])
    assert args.sampling == "prioritized"
    untyped = _parser().parse_args(["finetune", "--checkpoint", "x", "--task", "sst2"])
    assert options_from(untyped, TrainingOptions).sampling == "uniform"
    rows = finetune_glue_task({"tiny": str(checkpoint)}, "sst2", str(synthetic_glue), None, None, [0],
                              str(tmp_path / "out"), epochs=25, sampling="prioritized", **FAST)
    (row,) = rows
    assert row["sampling"] == "prioritized" and row["train_steps"] == 25 * 6
    assert row["accuracy"] > 0.9  # on the training examples, as for uniform sampling above


def test_local_glue_files_need_no_datasets(tmp_path, monkeypatch):
    """Local TSVs are read into plain columns: GLUE from a local directory works with `datasets` unimportable."""
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` now raises ImportError
    write_tsv(tmp_path / "STS-B" / "train.tsv", ["index", "genre", "filename", "year", "old_index", "source1",
                                                 "source2", "sentence1", "sentence2", "score"],
              [["0", "g", "f", "y", "0", "s", "s", "A man.", "A person.", "3.8"]])
    train = load_glue_split(GLUE_TASKS["stsb"], "train", DataSource(local_dir=tmp_path))
    assert train.column_names == ["sentence1", "sentence2", "label", "idx"]
    assert train["label"] == [float(__import__("numpy").float32(3.8))] and train[0]["sentence2"] == "A person."
    assert seeded_subset(train, 1, seed=0)["idx"] == [0]

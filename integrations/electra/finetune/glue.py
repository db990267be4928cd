"""GLUE: the task registry and loaders, and fine-tuning with a [CLS] head.

GLUE task registry and loaders: official TSV files from a local directory, or ``nyu-mll/glue``.

Both paths yield a `table.Columns` with the hub's column names and label ids, so everything downstream has
one code path; local files need no `datasets` (the hub path loads through it and copies the columns out).
Local TSVs are parsed without quote handling (sentences hold bare ``"``), MRPC's BOM is stripped, CoLA's
header-less files are read by position, and malformed lines (QQP train has a few) are skipped and counted.
STS-B scores are kept as float32 values, as the hub's ``float32`` column holds them.

GLUE fine-tuning: the [CLS] final hidden vector and one new linear layer (regression for STS-B).

Loss: cross-entropy over ``h_[CLS] W^T`` for classification (the paper's formula), mean squared
error on a single output for STS-B (as ELECTRA does).
"""

from __future__ import annotations

import copy
import csv
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..errors import UserError
from ..runtime import set_seed
from ..table import Columns
from .sources import DataSource, load_hub_split
from .tasks import GLUE_EIGHT, GLUE_TASKS, GlueTask, get_task  # noqa: F401  (the task table, re-exported)
from .training import encode_texts, FinetuneConfig, pad_batch, predict, train, TrainStats


# --------------------------------------------------------------------------------------------------
# GLUE task registry and loaders: official TSV files from a local directory, or ``nyu-mll/glue``.
GLUE_HUB_NAME = "nyu-mll/glue"

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


@dataclass
class TsvReadReport:
    """What a local TSV file held: rows kept and malformed rows skipped (with their line numbers)."""

    kept: int = 0
    skipped_lines: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # "line N: what is wrong", one per skipped line


def read_glue_tsv(task: GlueTask, path: Path) -> tuple[Columns, TsvReadReport]:
    """Parse one labelled official GLUE TSV file into the hub schema (texts, ``label``, ``idx``).

    A row is skipped when it has the wrong number of fields or an unknown label; that is how the
    official QQP train file's malformed lines are handled (as the legacy GLUE processors did).
    """
    if not path.is_file():
        raise UserError(
            f"GLUE task {task.name!r}: missing file {path} (expected the official GLUE layout "
            f"<glue-dir>/{task.local_dir}/{{train.tsv,{','.join(f for f, _ in task.eval_splits.values())}}}; "
            f"offline copies of QQP, MNLI and QNLI train are not bundled; use --glue-dir hub when online)"
        )
    columns: dict[str, list] = {c: [] for c in task.text_columns}
    columns["label"] = []
    columns["idx"] = []
    report = TsvReadReport()
    # utf-8-sig strips MRPC's byte-order mark and is a no-op elsewhere.
    with open(path, encoding="utf-8-sig", newline="") as handle:
        rows = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        if task.has_header:
            header = next(rows, None)
            if header is None:
                raise UserError(f"GLUE task {task.name!r}: file {path} is empty")
            width = len(header)
            try:
                text_positions = [header.index(s) for s in task.local_text_sources]
                label_position = header.index(task.local_label_source)
            except ValueError:
                raise UserError(
                    f"GLUE task {task.name!r}: {path} lacks the expected columns "
                    f"{list(task.local_text_sources) + [task.local_label_source]} (header: {header})"
                ) from None
            first_line = 2
        else:
            width = None
            text_positions = list(task.local_text_sources)
            label_position = task.local_label_source
            first_line = 1
        needed = max([*text_positions, label_position]) + 1
        for line_number, row in enumerate(rows, start=first_line):
            if width is None and len(row) >= needed:
                width = len(row)  # header-less (CoLA): the first complete row fixes the width
            problem = _row_problem(task, row, width, needed, label_position)
            if problem is not None:
                report.skipped_lines.append(line_number)
                report.problems.append(f"line {line_number}: {problem}")
                continue
            for column, position in zip(task.text_columns, text_positions):
                columns[column].append(row[position])
            label = _parse_label(task, row[label_position])
            columns["label"].append(float(np.float32(label)) if task.is_regression else label)
            columns["idx"].append(report.kept)
            report.kept += 1
    if not report.kept:
        found = (f"{len(report.skipped_lines)} malformed: " + "; ".join(report.problems[:3])
                 if report.skipped_lines else "no data rows")
        raise UserError(f"GLUE task {task.name!r}: {path} has no usable row ({found})")
    if report.skipped_lines:
        warnings.warn(
            f"{path}: skipped {len(report.skipped_lines)} malformed line(s) "
            f"(first: {report.skipped_lines[:5]}; {report.problems[0]}); kept {report.kept}",
            stacklevel=2,
        )
    return Columns(columns), report


def _row_problem(task: GlueTask, row: list[str], width: int | None, needed: int, label_position: int) -> str | None:
    """What makes a row unusable (a cut or extra column, a missing or unknown label), or None."""
    if len(row) < needed or (width is not None and len(row) != width):
        expected = width if width is not None else f"at least {needed}"
        return f"{len(row)} field(s), expected {expected} (a cut or extra column)"
    raw = row[label_position]
    if not raw.strip():
        return f"the label (column {task.local_label_source!r}) is missing"
    if _parse_label(task, raw) is None:
        kinds = "a number" if task.local_label_map is None else f"one of {sorted(task.local_label_map)}"
        return f"the label {raw!r} is not {kinds}"
    return None


def _parse_label(task: GlueTask, raw: str) -> float | int | None:
    raw = raw.strip()
    if task.local_label_map is None:
        try:
            return float(raw)
        except ValueError:
            return None
    return task.local_label_map.get(raw)


def load_glue_split(task: GlueTask, split: str, source: DataSource) -> Columns:
    """One labelled split ("train" or one of ``task.eval_splits``) from the given source."""
    if split != "train" and split not in task.eval_splits:
        raise UserError(f"GLUE task {task.name!r} has no split {split!r}")
    if source.local_dir is None:
        dataset = load_hub_split(source.hub_name, task.name, split)
        return Columns.from_dataset(dataset, [*task.text_columns, "label", "idx"])
    file_name = "train.tsv" if split == "train" else task.eval_splits[split][0]
    dataset, _ = read_glue_tsv(task, source.local_dir / task.local_dir / file_name)
    return dataset


def check_local_files(task: GlueTask, source: DataSource) -> None:
    """Fail early, before any training, if a local file of the task is missing."""
    if source.local_dir is None:
        return
    for file_name in ["train.tsv", *(f for f, _ in task.eval_splits.values())]:
        path = source.local_dir / task.local_dir / file_name
        if not path.is_file():
            read_glue_tsv(task, path)  # raises the descriptive UserError


def seeded_subset(dataset, max_examples: int | None, seed: int):
    """A reproducible random subset of at most ``max_examples`` rows, kept in the original order."""
    if max_examples is None or max_examples >= len(dataset):
        return dataset
    if max_examples <= 0:
        raise UserError(f"subset size must be positive, got {max_examples}")
    chosen = np.random.default_rng(seed).choice(len(dataset), size=max_examples, replace=False)
    return dataset.select(sorted(int(i) for i in chosen))


# --------------------------------------------------------------------------------------------------
# GLUE fine-tuning: the [CLS] final hidden vector and one new linear layer (regression for STS-B).
def uses_token_types(encoder: nn.Module) -> bool:
    """Segment ids only for models with a segment embedding of more than one type (BERT, ELECTRA)."""
    return int(getattr(encoder.config, "type_vocab_size", 0) or 0) > 1


class ClsClassifier(nn.Module):
    """Pretrained encoder + dropout + ``Linear(H, C)`` on the first ([CLS]) token's final hidden state."""

    def __init__(self, encoder: nn.Module, num_labels: int):
        super().__init__()
        self.encoder = encoder
        self.token_types = uses_token_types(encoder)
        dropout = getattr(encoder.config, "hidden_dropout_prob", 0.1)
        self.dropout = nn.Dropout(0.1 if dropout is None else dropout)
        self.head = nn.Linear(encoder.config.hidden_size, num_labels)
        nn.init.normal_(self.head.weight, std=getattr(encoder.config, "initializer_range", 0.02))
        nn.init.zeros_(self.head.bias)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.token_types and token_type_ids is not None:
            inputs["token_type_ids"] = token_type_ids
        hidden = self.encoder(**inputs).last_hidden_state[:, 0]
        return self.head(self.dropout(hidden))


def encode_glue_split(dataset, task: GlueTask, tokenizer, max_length: int) -> list[dict]:
    """Packed token ids plus the label of every example."""
    texts_b = dataset[task.text_columns[1]] if len(task.text_columns) > 1 else None
    features = encode_texts(tokenizer, dataset[task.text_columns[0]], texts_b, max_length)
    for feature, label in zip(features, dataset["label"]):
        feature["label"] = float(label) if task.is_regression else int(label)
    return features


def _forward(model: ClsClassifier, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])


def glue_loss(task: GlueTask):
    """Per-example losses (the training loop reduces them; prioritized sampling feeds them back)."""
    def compute(model: ClsClassifier, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = _forward(model, batch)
        if task.is_regression:
            return F.mse_loss(logits.squeeze(-1).float(), batch["label"].float(), reduction="none")
        return F.cross_entropy(logits.float(), batch["label"].long(), reduction="none")

    return compute


def predict_glue(
    model: ClsClassifier, task: GlueTask, features: list[dict], pad_id: int, config: FinetuneConfig, device
) -> np.ndarray:
    """Class ids (argmax) or, for STS-B, the regression outputs."""
    outputs = np.zeros(len(features), dtype=np.float64)
    collate = lambda fs: pad_batch(fs, pad_id)  # noqa: E731
    for indices, logits in predict(model, features, collate, _forward, config.eval_batch_size, device, config.autocast):
        values = logits.squeeze(-1) if task.is_regression else logits.argmax(-1)
        outputs[indices] = values.numpy()
    return outputs


@dataclass
class GlueRunResult:
    metrics: dict[str, float]
    stats: TrainStats


def run_glue_seed(
    base_encoder: nn.Module,
    task: GlueTask,
    train_features: list[dict],
    eval_features: dict[str, list[dict]],
    pad_id: int,
    config: FinetuneConfig,
    seed: int,
    device: torch.device,
    description: str = "",
    progress: bool = True,
) -> GlueRunResult:
    """Fine-tune a fresh copy of ``base_encoder`` with one seed and score every dev split of the task."""
    set_seed(seed)
    model = ClsClassifier(copy.deepcopy(base_encoder), task.num_labels)
    collate = lambda fs: pad_batch(fs, pad_id, extra_keys=("label",))  # noqa: E731
    stats = train(model, model.encoder, model.head, train_features, collate, glue_loss(task), config, seed, device,
                  description=description or f"{task.name} seed {seed}", progress=progress)
    metrics: dict[str, float] = {}
    for split, features in eval_features.items():
        suffix = task.eval_splits[split][1]
        predictions = predict_glue(model, task, features, pad_id, config, device)
        labels = np.array([f["label"] for f in features])
        metrics.update({name + suffix: value for name, value in task.score(predictions, labels).items()})
    return GlueRunResult(metrics=metrics, stats=stats)

"""GLUE task registry and loaders: official TSV files from a local directory, or ``nyu-mll/glue``.

Both paths yield a ``datasets.Dataset`` with the hub's column names and label ids, so everything
downstream has one code path. Local TSVs are parsed without quote handling (sentences hold bare
``"``), MRPC's BOM is stripped, CoLA's header-less files are read by position, and malformed lines
(QQP train has a few) are skipped and counted.
"""

from __future__ import annotations

import csv
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from typing import TYPE_CHECKING

import numpy as np

from .data_source import DataSource, load_hub_split
from ..common import UserError

if TYPE_CHECKING:  # datasets is imported lazily: building the CLI parser should stay cheap
    import datasets

GLUE_HUB_NAME = "nyu-mll/glue"

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


@dataclass(frozen=True)
class GlueTask:
    """How to find, parse and score one GLUE task."""

    name: str  # our id and the hub config name
    table_name: str  # column header in the paper's Table 1
    local_dir: str  # folder in the official glue_data layout
    text_columns: tuple[str, ...]  # hub column names of the one or two texts
    num_labels: int  # 1 = regression (STS-B)
    # eval split (hub name) -> (local file, suffix added to metric names; "" for the main dev set)
    eval_splits: dict[str, tuple[str, str]]
    # local parsing: source column (header name, or position when header-less) for each text and the label
    local_text_sources: tuple[str | int, ...]
    local_label_source: str | int
    local_label_map: dict[str, int] | None  # None for the float STS-B score
    has_header: bool = True
    epochs: int = 3
    label_names: tuple[str, ...] = field(default=())

    @property
    def is_regression(self) -> bool:
        return self.num_labels == 1


def _dev(file: str = "dev.tsv") -> dict[str, tuple[str, str]]:
    return {"validation": (file, "")}


_BINARY = {"0": 0, "1": 1}
_ENTAILMENT_2 = {"entailment": 0, "not_entailment": 1}

GLUE_TASKS: dict[str, GlueTask] = {
    "cola": GlueTask("cola", "CoLA", "CoLA", ("sentence",), 2, _dev(), (3,), 1, _BINARY, has_header=False,
                     label_names=("unacceptable", "acceptable")),
    "sst2": GlueTask("sst2", "SST", "SST-2", ("sentence",), 2, _dev(), ("sentence",), "label", _BINARY,
                     label_names=("negative", "positive")),
    "mrpc": GlueTask("mrpc", "MRPC", "MRPC", ("sentence1", "sentence2"), 2, _dev(), ("#1 String", "#2 String"),
                     "Quality", _BINARY, label_names=("not_equivalent", "equivalent")),
    "stsb": GlueTask("stsb", "STS", "STS-B", ("sentence1", "sentence2"), 1, _dev(), ("sentence1", "sentence2"),
                     "score", None, epochs=10),
    "qqp": GlueTask("qqp", "QQP", "QQP", ("question1", "question2"), 2, _dev(), ("question1", "question2"),
                    "is_duplicate", _BINARY, label_names=("not_duplicate", "duplicate")),
    "mnli": GlueTask("mnli", "MNLI", "MNLI", ("premise", "hypothesis"), 3,
                     {"validation_matched": ("dev_matched.tsv", ""), "validation_mismatched": ("dev_mismatched.tsv", "_mm")},
                     ("sentence1", "sentence2"), "gold_label",
                     {"entailment": 0, "neutral": 1, "contradiction": 2},
                     label_names=("entailment", "neutral", "contradiction")),
    "qnli": GlueTask("qnli", "QNLI", "QNLI", ("question", "sentence"), 2, _dev(), ("question", "sentence"), "label",
                     _ENTAILMENT_2, label_names=("entailment", "not_entailment")),
    "rte": GlueTask("rte", "RTE", "RTE", ("sentence1", "sentence2"), 2, _dev(), ("sentence1", "sentence2"), "label",
                    _ENTAILMENT_2, epochs=10, label_names=("entailment", "not_entailment")),
    "wnli": GlueTask("wnli", "WNLI", "WNLI", ("sentence1", "sentence2"), 2, _dev(), ("sentence1", "sentence2"), "label",
                     _BINARY, label_names=("not_entailment", "entailment")),
}
# The eight tasks of the GLUE average; WNLI is optional and never averaged.
GLUE_EIGHT: tuple[str, ...] = ("mnli", "qqp", "qnli", "sst2", "cola", "stsb", "mrpc", "rte")


def get_task(name: str) -> GlueTask:
    try:
        return GLUE_TASKS[name]
    except KeyError:
        raise UserError(f"unknown GLUE task {name!r}; choose from {', '.join(GLUE_TASKS)}") from None


@dataclass
class TsvReadReport:
    """What a local TSV file held: rows kept and malformed rows skipped (with their line numbers)."""

    kept: int = 0
    skipped_lines: list[int] = field(default_factory=list)


def read_glue_tsv(task: GlueTask, path: Path) -> tuple[datasets.Dataset, TsvReadReport]:
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
    import datasets

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
        for line_number, row in enumerate(rows, start=first_line):
            if width is None:
                width = len(row)  # header-less (CoLA): the first row fixes the width
            label = _parse_label(task, row[label_position]) if len(row) == width else None
            if label is None:
                report.skipped_lines.append(line_number)
                continue
            for column, position in zip(task.text_columns, text_positions):
                columns[column].append(row[position])
            columns["label"].append(label)
            columns["idx"].append(report.kept)
            report.kept += 1
    if report.skipped_lines:
        warnings.warn(
            f"{path}: skipped {len(report.skipped_lines)} malformed line(s) "
            f"(first: {report.skipped_lines[:5]}); kept {report.kept}",
            stacklevel=2,
        )
    features = {c: datasets.Value("string") for c in task.text_columns}
    features["label"] = datasets.Value("float32") if task.is_regression else datasets.ClassLabel(names=list(task.label_names))
    features["idx"] = datasets.Value("int32")
    return datasets.Dataset.from_dict(columns, features=datasets.Features(features)), report


def _parse_label(task: GlueTask, raw: str) -> float | int | None:
    raw = raw.strip()
    if task.local_label_map is None:
        try:
            return float(raw)
        except ValueError:
            return None
    return task.local_label_map.get(raw)


def load_glue_split(task: GlueTask, split: str, source: DataSource) -> datasets.Dataset:
    """One labelled split ("train" or one of ``task.eval_splits``) from the given source."""
    if split != "train" and split not in task.eval_splits:
        raise UserError(f"GLUE task {task.name!r} has no split {split!r}")
    if source.local_dir is None:
        dataset = load_hub_split(source.hub_name, task.name, split)
        return dataset.select_columns([*task.text_columns, "label", "idx"])
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


def seeded_subset(dataset: datasets.Dataset, max_examples: int | None, seed: int) -> datasets.Dataset:
    """A reproducible random subset of at most ``max_examples`` rows, kept in the original order."""
    if max_examples is None or max_examples >= len(dataset):
        return dataset
    if max_examples <= 0:
        raise UserError(f"subset size must be positive, got {max_examples}")
    chosen = np.random.default_rng(seed).choice(len(dataset), size=max_examples, replace=False)
    return dataset.select(sorted(int(i) for i in chosen))

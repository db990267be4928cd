"""The GLUE tasks, defined once: files, columns, labels, epochs, metrics, and whether a task counts in the average.

Everything else (loaders, training, the result tables, the command line's ``--task`` choices) reads this table;
a task whose metrics are not known fails here, at import, rather than after training.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import UserError
from .metrics import GLUE_METRICS


@dataclass(frozen=True)
class GlueTask:
    """How to find, parse and score one GLUE task: the one definition of a task (see `GLUE_TASKS`)."""

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
    metrics: tuple[str, ...] = ()  # names in `metrics.GLUE_METRICS`; the first is the task's score in Table 1
    averaged: bool = True  # one of the eight tasks of the GLUE average (WNLI is not)

    def __post_init__(self) -> None:
        unknown = [m for m in self.metrics if m not in GLUE_METRICS]
        if not self.metrics or unknown:  # fail where the task is defined, not after hours of training
            raise ValueError(f"GLUE task {self.name!r}: metrics must name at least one of "
                             f"{', '.join(GLUE_METRICS)}; got {self.metrics}")

    @property
    def is_regression(self) -> bool:
        return self.num_labels == 1

    @property
    def main_metric(self) -> str:
        return self.metrics[0]

    def score(self, predictions, labels) -> dict[str, float]:
        """The task's official metrics on one dev set (fractions)."""
        return {name: GLUE_METRICS[name](predictions, labels) for name in self.metrics}


def _dev(file: str = "dev.tsv") -> dict[str, tuple[str, str]]:
    return {"validation": (file, "")}


_BINARY = {"0": 0, "1": 1}
_ENTAILMENT_2 = {"entailment": 0, "not_entailment": 1}

# In the order of the paper's Table 1 (the order of every GLUE table and of --task glue).
GLUE_TASKS: dict[str, GlueTask] = {task.name: task for task in (
    GlueTask("mnli", "MNLI", "MNLI", ("premise", "hypothesis"), 3,
             {"validation_matched": ("dev_matched.tsv", ""), "validation_mismatched": ("dev_mismatched.tsv", "_mm")},
             ("sentence1", "sentence2"), "gold_label", {"entailment": 0, "neutral": 1, "contradiction": 2},
             label_names=("entailment", "neutral", "contradiction"), metrics=("accuracy",)),
    GlueTask("qqp", "QQP", "QQP", ("question1", "question2"), 2, _dev(), ("question1", "question2"),
             "is_duplicate", _BINARY, label_names=("not_duplicate", "duplicate"), metrics=("accuracy", "f1")),
    GlueTask("qnli", "QNLI", "QNLI", ("question", "sentence"), 2, _dev(), ("question", "sentence"), "label",
             _ENTAILMENT_2, label_names=("entailment", "not_entailment"), metrics=("accuracy",)),
    GlueTask("sst2", "SST", "SST-2", ("sentence",), 2, _dev(), ("sentence",), "label", _BINARY,
             label_names=("negative", "positive"), metrics=("accuracy",)),
    GlueTask("cola", "CoLA", "CoLA", ("sentence",), 2, _dev(), (3,), 1, _BINARY, has_header=False,
             label_names=("unacceptable", "acceptable"), metrics=("mcc", "accuracy")),
    GlueTask("stsb", "STS", "STS-B", ("sentence1", "sentence2"), 1, _dev(), ("sentence1", "sentence2"),
             "score", None, epochs=10, metrics=("spearman", "pearson")),
    GlueTask("mrpc", "MRPC", "MRPC", ("sentence1", "sentence2"), 2, _dev(), ("#1 String", "#2 String"),
             "Quality", _BINARY, label_names=("not_equivalent", "equivalent"), metrics=("accuracy", "f1")),
    GlueTask("rte", "RTE", "RTE", ("sentence1", "sentence2"), 2, _dev(), ("sentence1", "sentence2"), "label",
             _ENTAILMENT_2, epochs=10, label_names=("entailment", "not_entailment"), metrics=("accuracy",)),
    GlueTask("wnli", "WNLI", "WNLI", ("sentence1", "sentence2"), 2, _dev(), ("sentence1", "sentence2"), "label",
             _BINARY, label_names=("not_entailment", "entailment"), metrics=("accuracy",), averaged=False),
)}
# The eight tasks of the GLUE average, in table order; WNLI is optional and never averaged.
GLUE_EIGHT: tuple[str, ...] = tuple(name for name, task in GLUE_TASKS.items() if task.averaged)


def glue_average(main_scores: dict[str, float]) -> float:
    """Average of the eight GLUE main scores (WNLI excluded, as is customary and as in the paper)."""
    missing = [t for t in GLUE_EIGHT if t not in main_scores]
    if missing:
        raise ValueError(f"GLUE average needs all eight tasks; missing {missing}")
    return float(np.mean([main_scores[t] for t in GLUE_EIGHT]))


def get_task(name: str) -> GlueTask:
    try:
        return GLUE_TASKS[name]
    except KeyError:
        raise UserError(f"unknown GLUE task {name!r}; choose from {', '.join(GLUE_TASKS)}") from None



"""GLUE and SQuAD v1.1 metrics, written out so that their exact definitions are visible and tested.

GLUE scores are fractions in [0, 1] (as in the TMR paper's Table 1); SQuAD scores are percentages in
[0, 100] (as printed by the official ``evaluate-v1.1.py``).
"""

from __future__ import annotations

import collections
import math
import re
import string
from typing import Iterable, Mapping, Sequence

import numpy as np

# Official GLUE metric per task, in the order of the paper's Table 1.
GLUE_TASKS_IN_TABLE_ORDER: tuple[str, ...] = ("mnli", "qqp", "qnli", "sst2", "cola", "stsb", "mrpc", "rte")
MAIN_METRIC: dict[str, str] = {
    "mnli": "accuracy",  # matched dev; mismatched is reported as accuracy_mm
    "qqp": "accuracy",
    "qnli": "accuracy",
    "sst2": "accuracy",
    "cola": "mcc",
    "stsb": "spearman",
    "mrpc": "accuracy",
    "rte": "accuracy",
    "wnli": "accuracy",
}


def _as_array(values: Iterable[float]) -> np.ndarray:
    return np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=np.float64)


def accuracy(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """Fraction of exact matches."""
    p, y = _as_array(predictions), _as_array(labels)
    if len(p) != len(y):
        raise ValueError(f"{len(p)} predictions for {len(y)} labels")
    return float(np.mean(p == y)) if len(y) else 0.0


def f1_positive_class(predictions: Sequence[int], labels: Sequence[int], positive: int = 1) -> float:
    """F1 of the positive class (GLUE convention for MRPC and QQP: class 1 = paraphrase/duplicate).

    Precision and recall are computed separately (ELECTRA's scorer set recall = precision; not here).
    Returns 0 when there are no true positives.
    """
    p, y = _as_array(predictions) == positive, _as_array(labels) == positive
    true_pos = float(np.sum(p & y))
    if true_pos == 0:
        return 0.0
    precision = true_pos / float(np.sum(p))
    recall = true_pos / float(np.sum(y))
    return 2 * precision * recall / (precision + recall)


def matthews_corrcoef(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """Matthews correlation for binary labels (CoLA); 0 when undefined, as scikit-learn does."""
    p, y = _as_array(predictions) == 1, _as_array(labels) == 1
    tp = float(np.sum(p & y))
    tn = float(np.sum(~p & ~y))
    fp = float(np.sum(p & ~y))
    fn = float(np.sum(~p & y))
    denominator = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return 0.0 if denominator == 0 else (tp * tn - fp * fn) / denominator


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation; 0 when either side is constant (undefined), so averages stay finite."""
    a, b = _as_array(x), _as_array(y)
    a, b = a - a.mean(), b - b.mean()
    denominator = math.sqrt(float(np.sum(a * a)) * float(np.sum(b * b)))
    return 0.0 if denominator == 0 else float(np.sum(a * b)) / denominator


def average_ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks starting at 1, ties sharing the mean of the ranks they span (as scipy's rankdata)."""
    v = _as_array(values)
    order = np.argsort(v, kind="mergesort")
    ranks = np.empty(len(v), dtype=np.float64)
    i = 0
    while i < len(v):
        j = i
        while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman correlation = Pearson correlation of the tie-averaged ranks."""
    return pearson(average_ranks(x), average_ranks(y))


def glue_metrics(task: str, predictions: Sequence[float], labels: Sequence[float]) -> dict[str, float]:
    """The official metrics of one GLUE task on one dev set (all fractions)."""
    if task == "cola":
        return {"mcc": matthews_corrcoef(predictions, labels), "accuracy": accuracy(predictions, labels)}
    if task == "stsb":
        return {"spearman": spearman(predictions, labels), "pearson": pearson(predictions, labels)}
    if task in ("mrpc", "qqp"):
        return {"accuracy": accuracy(predictions, labels), "f1": f1_positive_class(predictions, labels)}
    if task in MAIN_METRIC:
        return {"accuracy": accuracy(predictions, labels)}
    raise ValueError(f"unknown GLUE task {task!r}")


def glue_average(main_scores: Mapping[str, float]) -> float:
    """Average of the eight GLUE main scores (WNLI excluded, as is customary and as in the paper)."""
    missing = [t for t in GLUE_TASKS_IN_TABLE_ORDER if t not in main_scores]
    if missing:
        raise ValueError(f"GLUE average needs all eight tasks; missing {missing}")
    return float(np.mean([main_scores[t] for t in GLUE_TASKS_IN_TABLE_ORDER]))


# ----------------------------------------------------------------------------------------------
# SQuAD v1.1, same definitions as the official evaluate-v1.1.py

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lowercase, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(gold)


def token_f1(prediction: str, gold: str) -> float:
    """Bag-of-tokens F1 between the normalised answers (0 when they share no token)."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_v1_scores(predictions: Mapping[str, str], gold_answers: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """EM and F1 in percent, each maximised over a question's gold answers and averaged over questions.

    A question without a prediction scores 0, as in the official script.
    """
    if not gold_answers:
        return {"exact_match": 0.0, "f1": 0.0}
    em_total = f1_total = 0.0
    for qid, golds in gold_answers.items():
        if qid not in predictions:
            continue
        prediction = predictions[qid]
        em_total += max(float(exact_match(prediction, g)) for g in golds)
        f1_total += max(token_f1(prediction, g) for g in golds)
    n = len(gold_answers)
    return {"exact_match": 100.0 * em_total / n, "f1": 100.0 * f1_total / n}

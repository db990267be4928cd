"""GLUE and SQuAD v1.1 metrics: scikit-learn / scipy for GLUE, the official SQuAD v1.1 definitions written out.

GLUE scores are fractions in [0, 1] (as in the TMR paper's Table 1); SQuAD scores are percentages in
[0, 100] (as printed by the official ``evaluate-v1.1.py``).
"""

from __future__ import annotations

import collections
import re
import string
from typing import Mapping, Sequence

import numpy as np
from scipy import stats
from scipy.stats import rankdata as average_ranks  # noqa: F401  (ties share their mean rank)
from sklearn import metrics as sklearn_metrics

from ..stats import spearman  # noqa: F401  (STS-B's main metric; shared with pretraining's diagnostics)

def accuracy(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """Fraction of exact matches (0 for no examples)."""
    return float(sklearn_metrics.accuracy_score(labels, predictions)) if len(labels) else 0.0


def f1_positive_class(predictions: Sequence[int], labels: Sequence[int], positive: int = 1) -> float:
    """F1 of the positive class (GLUE convention for MRPC and QQP: class 1 = paraphrase/duplicate).

    Precision and recall are computed separately (ELECTRA's scorer set recall = precision; not here).
    0 when there are no true positives.
    """
    return float(sklearn_metrics.f1_score(labels, predictions, pos_label=positive, zero_division=0))


def matthews_corrcoef(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """Matthews correlation (CoLA); 0 when undefined."""
    return float(sklearn_metrics.matthews_corrcoef(labels, predictions))


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation; 0 when either side is constant (undefined), so averages stay finite."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.size < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return 0.0
    return float(stats.pearsonr(a, b).statistic)


# Every GLUE metric by the name a task lists it under (`glue.GlueTask.metrics`), all fractions.
GLUE_METRICS = {"accuracy": accuracy, "f1": f1_positive_class, "mcc": matthews_corrcoef, "spearman": spearman,
                "pearson": pearson}


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

"""GLUE and SQuAD v1.1 metrics against values computed by hand."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replayloader_electra.finetune.metrics import (
    accuracy,
    average_ranks,
    exact_match,
    f1_positive_class,
    matthews_corrcoef,
    normalize_answer,
    pearson,
    spearman,
    squad_v1_scores,
    token_f1,
)
from replayloader_electra.finetune.tasks import GLUE_EIGHT, GLUE_TASKS, GlueTask, glue_average


def glue_metrics(task: str, predictions, labels) -> dict[str, float]:
    return GLUE_TASKS[task].score(predictions, labels)


def test_accuracy():
    assert accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5


def test_matthews_by_hand():
    # tp = 2, fp = 1, tn = 2, fn = 1 -> (2*2 - 1*1) / sqrt(3*3*3*3) = 1/3
    assert matthews_corrcoef([1, 1, 0, 0, 1, 0], [1, 0, 0, 0, 1, 1]) == pytest.approx(1 / 3)
    assert matthews_corrcoef([1, 0, 1, 0], [1, 0, 1, 0]) == pytest.approx(1.0)
    assert matthews_corrcoef([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)


def test_matthews_undefined_is_zero():
    assert matthews_corrcoef([1, 1, 1, 1], [1, 0, 1, 0]) == 0.0


def test_f1_positive_class_by_hand():
    # tp = 2, fp = 1, fn = 1 -> P = R = 2/3
    assert f1_positive_class([1, 1, 1, 0, 0], [1, 0, 1, 1, 0]) == pytest.approx(2 / 3)
    # tp = 1, fp = 3, fn = 1 -> P = 1/4, R = 1/2, F1 = 1/3 (recall differs from precision)
    assert f1_positive_class([1, 1, 1, 1, 0], [1, 0, 0, 0, 1]) == pytest.approx(1 / 3)
    assert f1_positive_class([0, 0], [1, 1]) == 0.0


def test_pearson_by_hand():
    # dx = (-1, 0, 1), dy = (-7/3, -1/3, 8/3): r = 5 / sqrt(2 * 114/9)
    assert pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(5 / math.sqrt(2 * 114 / 9))
    assert pearson([1, 1, 1], [1, 2, 3]) == 0.0


def test_ranks_average_ties():
    assert list(average_ranks([10, 20, 20, 5])) == [2.0, 3.5, 3.5, 1.0]


def test_spearman_by_hand():
    # ranks x = (1, 2.5, 2.5, 4), y = (1, 3, 2, 4): r = 4.5 / sqrt(4.5 * 5) = 3 / sqrt(10)
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(3 / math.sqrt(10))
    assert spearman([1, 2, 3, 4], [1, 4, 9, 16]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)


def test_spearman_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    x = [0.5, 2.0, 2.0, 3.1, 4.0, 4.0, 4.0, 1.0]
    y = [1.0, 0.2, 3.0, 3.0, 5.0, 2.5, 4.0, 0.0]
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic)
    assert pearson(x, y) == pytest.approx(stats.pearsonr(x, y).statistic)


def test_glue_metric_names_per_task():
    assert set(glue_metrics("cola", [1, 0], [1, 0])) == {"mcc", "accuracy"}
    assert set(glue_metrics("stsb", [1.0, 2.0, 3.0], [1.0, 2.5, 2.0])) == {"spearman", "pearson"}
    assert set(glue_metrics("mrpc", [1, 0], [1, 0])) == {"accuracy", "f1"}
    assert set(glue_metrics("qqp", [1, 0], [1, 0])) == {"accuracy", "f1"}
    for task in ("sst2", "mnli", "qnli", "rte", "wnli"):
        assert set(glue_metrics(task, [1, 0], [1, 0])) == {"accuracy"}


def test_the_task_table_is_in_table_order_and_a_task_without_known_metrics_fails_where_it_is_defined():
    assert GLUE_EIGHT == ("mnli", "qqp", "qnli", "sst2", "cola", "stsb", "mrpc", "rte")  # the paper's Table 1
    assert list(GLUE_TASKS) == [*GLUE_EIGHT, "wnli"] and not GLUE_TASKS["wnli"].averaged
    assert {t: task.main_metric for t, task in GLUE_TASKS.items() if task.main_metric != "accuracy"} == {
        "cola": "mcc", "stsb": "spearman"}
    sst2 = GLUE_TASKS["sst2"]
    fields = dict(name="new", table_name="NEW", local_dir="NEW", text_columns=("sentence",), num_labels=2,
                  eval_splits=sst2.eval_splits, local_text_sources=("sentence",), local_label_source="label",
                  local_label_map={"0": 0, "1": 1})
    with pytest.raises(ValueError, match="'new': metrics must name at least one"):
        GlueTask(**fields)
    with pytest.raises(ValueError, match="'new': metrics must name"):
        GlueTask(**fields, metrics=("accuracy", "bleu"))


def test_glue_average_of_the_eight_without_wnli():
    scores = {task: 0.1 * (i + 1) for i, task in enumerate(GLUE_EIGHT)}
    assert glue_average({**scores, "wnli": 0.0}) == pytest.approx(0.45)
    del scores["rte"]
    with pytest.raises(ValueError, match="rte"):
        glue_average(scores)


def test_paper_table_average_is_reproduced():
    # TMR paper, Table 1, ELECTRA row: the eight scores average to the printed 0.783.
    electra = dict(zip(GLUE_EIGHT, [0.730, 0.881, 0.836, 0.862, 0.733, 0.832, 0.809, 0.584]))
    assert round(glue_average(electra), 3) == 0.783


# ---------------------------------------------------------------------------- SQuAD v1.1


@pytest.mark.parametrize(
    ("text", "normalised"),
    [
        ("The  Quick, brown fox!", "quick brown fox"),
        ("an apple a day", "apple day"),
        ("Theater and the anthem", "theater and anthem"),  # articles only as whole words
        ("Saint-Bernadette", "saintbernadette"),  # punctuation is dropped, not replaced by a space
        ("  \tA\n", ""),
        ("“Curly” quotes", "“curly” quotes"),  # only ASCII punctuation, as the official script
    ],
)
def test_normalize_answer(text, normalised):
    assert normalize_answer(text) == normalised


def test_exact_match_after_normalisation():
    assert exact_match("the Eiffel Tower.", "Eiffel tower")
    assert not exact_match("Eiffel", "Eiffel tower")


def test_token_f1_by_hand():
    # "in city of paris" vs "paris france": 1 common token, P = 1/4, R = 1/2 -> F1 = 1/3
    assert token_f1("in the city of Paris", "Paris, France") == pytest.approx(1 / 3)
    assert token_f1("x y y", "y y z") == pytest.approx(2 / 3)  # multiset overlap 2, P = R = 2/3
    assert token_f1("a b b", "b b c") == pytest.approx(0.8)  # "a" is dropped: P = 1, R = 2/3
    assert token_f1("the", "a") == 0.0  # both normalise to nothing


def test_squad_scores_max_over_golds_and_missing_predictions():
    golds = {"q1": ["Denver Broncos", "Broncos"], "q2": ["Denver Broncos", "the Broncos"], "q3": ["1990"]}
    predictions = {"q1": "Broncos team", "q2": "the Denver Broncos"}  # q3 missing -> 0
    scores = squad_v1_scores(predictions, golds)
    # q1: EM 0, F1 max(1/2, 2/3); q2: EM 1, F1 1; q3: 0
    assert scores["exact_match"] == pytest.approx(100 / 3)
    assert scores["f1"] == pytest.approx(100 * (2 / 3 + 1) / 3)


_words = st.lists(st.sampled_from(["the", "a", "Paris", "paris,", "tower", "1990", "an", "x"]), max_size=6).map(" ".join)


@settings(max_examples=100, deadline=None)
@given(_words, _words)
def test_f1_symmetric_and_em_implies_full_f1(prediction, gold):
    assert token_f1(prediction, gold) == pytest.approx(token_f1(gold, prediction))
    if exact_match(prediction, gold) and normalize_answer(gold):
        assert token_f1(prediction, gold) == pytest.approx(1.0)

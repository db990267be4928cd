"""The argument checks written once (``replayloader._checks``): the same sentence, naming the argument and the bad
value, wherever an id array or a choice of a few words is passed."""
from __future__ import annotations

import re

import numpy as np
import pytest

from replayloader import ReplayBuffer
from replayloader import _checks as checks
from replayloader.loader.deferred import DeferredFeedback


@pytest.mark.parametrize("value, got", [
    (np.array([0.5, 1.0]), "dtype float64 shape (2,)"),
    (np.zeros((2, 2), np.int64), "dtype int64 shape (2, 2)"),
    (np.array([], np.int64), "dtype int64 shape (0,)"),
    ([], "dtype float64 shape (0,)"),
])
def test_an_index_array_must_be_non_empty_one_dimensional_integers(value, got):
    with pytest.raises(ValueError, match="^" + re.escape(f"ids must be a non-empty 1-D integer array, got {got}")):
        checks.index_array("ids", value)


def test_an_index_array_comes_back_as_contiguous_int64_and_a_length_can_be_required():
    out = checks.index_array("ids", np.array([3, 1, 2], np.uint8)[::-1])
    assert out.dtype == np.int64 and out.flags.c_contiguous and out.tolist() == [2, 1, 3]
    assert checks.index_array("ids", [4, 5]).tolist() == [4, 5]
    with pytest.raises(ValueError, match=r"^indices must be a 3-long 1-D integer array \(dataset indices\), got "
                                         r"dtype int64 shape \(2,\)"):
        checks.index_array("indices", [1, 2], length=3, why="dataset indices")


def test_the_buffer_and_deferred_feedback_refuse_bad_ids_with_the_one_sentence():
    buffer = ReplayBuffer(8, seed=0)
    buffer.add({"x": np.arange(4.0)[:, None]})
    for call in (buffer.feedback, DeferredFeedback(buffer.feedback).push):
        with pytest.raises(ValueError, match=r"^ids must be a non-empty 1-D integer array, got dtype float64"):
            call(np.array([0.5]), loss=np.ones(1))


def test_a_choice_names_the_argument_the_choices_and_the_value():
    with pytest.raises(ValueError, match=r"^sampling must be one of \('stratified', 'independent'\), got 'greedy'$"):
        ReplayBuffer(8, sampling="greedy")
    assert checks.one_of("sampling", "independent", ("stratified", "independent")) == "independent"

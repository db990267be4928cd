"""Priorities never overflow: a weight up to ``max_weight`` keeps the sum tree finite even when every leaf holds
it, and feedback above it is refused by name before anything changes (a priority w^alpha of inf would turn every
probability into NaN)."""
import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replayloader import PrioritizedSampler, ReplayBuffer
from replayloader.sumtree import SumTree
from replayloader.strategies import by_name

from .helpers import assert_state_equal

ALPHAS = st.sampled_from([0.0, 0.3, 0.6, 1.0, 2.0, 7.5])
DTYPES = st.sampled_from([np.float64, np.float32])


@settings(max_examples=60, deadline=None)
@given(alpha=ALPHAS, dtype=DTYPES, capacity=st.integers(1, 300))
def test_every_leaf_at_max_weight_keeps_the_buffer_finite(alpha, dtype, capacity):
    buffer = ReplayBuffer(capacity, alpha=alpha, beta=0.4, strategy=by_name("per"), seed=0, tree_dtype=dtype)
    ids = buffer.add({"x": np.zeros((capacity, 1))})
    buffer.feedback(ids, weight=np.full(capacity, buffer.max_weight))
    assert np.isfinite(buffer.tree.total) and buffer.tree.total > 0
    sample = buffer.sample(64)
    assert np.isfinite(sample.probabilities).all() and np.isfinite(sample.weights).all()
    np.testing.assert_allclose(sample.probabilities, 1.0 / capacity, rtol=1e-5)


@settings(max_examples=60, deadline=None)
@given(alpha=ALPHAS, n=st.integers(1, 300), above=st.floats(1.0, 1e6, exclude_min=True))
def test_the_sampler_takes_max_weight_and_refuses_more_changing_nothing(alpha, n, above):
    sampler = PrioritizedSampler(n, n, alpha=alpha, seed=0, warmup_epochs=0)
    batch = sampler.next_batch()
    before = copy.deepcopy(sampler.state_dict())
    too_large = min(sampler.max_weight * above, np.finfo(np.float64).max)
    loss = np.full(n, sampler.max_weight)
    loss[-1] = too_large
    with pytest.raises(ValueError, match=rf"loss must be <= .*\(`max_weight`\); loss\[{n - 1}\] = "):
        sampler.feedback(batch, loss=loss)
    assert_state_equal(copy.deepcopy(sampler.state_dict()), before)
    sampler.feedback(batch, loss=np.full(n, sampler.max_weight))
    p = sampler.probabilities()
    assert np.isfinite(p).all()
    np.testing.assert_allclose(p.sum(), 1.0)


@pytest.mark.parametrize("update", ["per", "loss_diff"])  # the value rule, and a loss difference (a fused step each)
@pytest.mark.parametrize("alpha", [0.6, 2.0])
def test_the_buffer_refuses_feedback_above_max_weight_changing_nothing(update, alpha):
    buffer = ReplayBuffer(16, alpha=alpha, strategy=by_name(update), seed=0)
    ids = buffer.add({"x": np.zeros((16, 1))})
    keyword = buffer.strategy.update.feedback_key
    buffer.feedback(ids, **{keyword: np.ones(16)})
    before = copy.deepcopy(buffer.state_dict())
    values = np.ones(16)
    values[3] = np.nextafter(buffer.max_weight, np.inf)
    with pytest.raises(ValueError, match=rf"{keyword} must be <= .*; {keyword}\[3\] = "):
        buffer.feedback(ids, **{keyword: values})
    assert_state_equal(copy.deepcopy(buffer.state_dict()), before)


def test_max_weight_is_the_documented_bound():
    """float64 max / (2 x leaves), raised to 1 / alpha when alpha > 1: what the docstrings quote."""
    top = np.finfo(np.float64).max / (2 * 2 ** 20)
    tree = SumTree(10 ** 6)
    assert tree.max_weight(0.6) == tree.max_weight(1.0) == top
    assert tree.max_weight(2.0) == pytest.approx(top ** 0.5)
    assert f"{top:.1e}" == "8.6e+301"
    assert SumTree(8, np.float32).max_weight(1.0) == pytest.approx(np.finfo(np.float32).max / 16)

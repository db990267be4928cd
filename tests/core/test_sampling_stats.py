"""Sampling frequencies match P(i) = w_i^alpha / sum_j w_j^alpha (chi-square, fixed seeds)."""
import numpy as np
import pytest
from scipy import stats

from replayloader import ReplayBuffer
from replayloader.strategies import EvictLowest, MeanWeight, SetWeight, Strategy


def filled_buffer(alpha, sampling, seed=0, n=1000, beta=None):
    buf = ReplayBuffer(n, alpha=alpha, beta=beta, sampling=sampling, seed=seed,
                       strategy=Strategy(MeanWeight(), SetWeight(), EvictLowest()))
    ids = buf.add({"x": np.arange(n)})
    weights = np.random.default_rng(seed).uniform(0.01, 1.0, n)
    weights[::97] = 0.0  # some examples must never be drawn
    buf.feedback(ids, weight=weights)
    return buf, weights


@pytest.mark.parametrize("sampling", ["stratified", "independent"])
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_frequencies_follow_powered_weights(alpha, sampling):
    buf, weights = filled_buffer(alpha, sampling)
    counts = np.zeros(1000)
    for _ in range(200):
        s = buf.sample(1000)
        np.add.at(counts, s.data["x"], 1)
    priorities = np.where(weights > 0, weights ** alpha, 0.0)
    expected = priorities / priorities.sum() * counts.sum()
    assert counts[expected == 0].sum() == 0  # weight 0 means never sampled, also with alpha = 0
    live = expected > 0
    chi2, p = stats.chisquare(counts[live], expected[live])
    assert p > 1e-3, (chi2, p)


def test_reported_probabilities_and_importance_weights():
    buf, weights = filled_buffer(0.6, "stratified", beta=0.4)
    s = buf.sample(256)
    priorities = np.where(weights > 0, weights ** 0.6, 0.0)
    np.testing.assert_allclose(s.probabilities, priorities[s.data["x"]] / priorities.sum(), rtol=1e-12)
    p_min = priorities[priorities > 0].min() / priorities.sum()
    np.testing.assert_allclose(s.weights, (p_min / s.probabilities) ** 0.4, rtol=1e-12)
    assert s.weights.max() <= 1.0


def test_all_zero_weights_fall_back_to_uniform():
    buf = ReplayBuffer(50, seed=1, strategy=Strategy(MeanWeight(), SetWeight(), EvictLowest()))
    ids = buf.add({"x": np.arange(50)})
    buf.feedback(ids, weight=np.zeros(50))
    counts = np.bincount(np.concatenate([buf.sample(100).data["x"] for _ in range(400)]), minlength=50)
    assert stats.chisquare(counts).pvalue > 1e-3


def test_float32_tree_frequencies_match_at_large_n():
    # float32 sums lose precision at large N; stratified draws must still follow the weights.
    n = 100_000
    buf = ReplayBuffer(n, alpha=1.0, seed=5, tree_dtype=np.float32,
                       strategy=Strategy(MeanWeight(), SetWeight(), EvictLowest()))
    ids = buf.add({"x": np.arange(n)})
    weights = np.where(np.arange(n) < n // 2, 1.0, 3.0)  # two blocks: a quarter and three quarters of the mass
    weights[::1000] = 0.0
    buf.feedback(ids, weight=weights)
    drawn = np.concatenate([buf.sample(4096).data["x"] for _ in range(50)])
    assert (weights[drawn] > 0).all()
    high = (drawn >= n // 2).sum()
    expected = weights[n // 2:].sum() / weights.sum() * len(drawn)
    assert abs(high - expected) < 4 * np.sqrt(expected * (1 - expected / len(drawn)))

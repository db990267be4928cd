"""The mixing rules against numpy references written here from the papers' formulas, step by step; their
argument and state checks."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from replayloader import InvalidState
from replayloader.mixing import ODM, ExcessLoss, FixedMixture, MixingRule


# ----------------------------------------------------------------------------- references
class ReferenceEXP3:
    """Albalak et al. 2023, Algorithm 1 (ODM), with several sources per step: ε_0 = 1/K, R̂ = 0; at step t:
    ε_t = min(1/K, sqrt(ln K / (K t))), π = (1 − K ε_t) softmax(ε_{t−1} R̂) + ε_t; after the step, for each
    source seen, R̂_k ← α R̂_k + (1 − α) r_k / π_k."""

    def __init__(self, k, alpha):
        self.k, self.alpha, self.t, self.r = k, alpha, 1, np.zeros(k)

    def eps(self, t):
        return 1 / self.k if t == 0 else min(1 / self.k, math.sqrt(math.log(self.k) / (self.k * t)))

    def policy(self):
        z = np.exp(self.eps(self.t - 1) * self.r)
        return (1 - self.k * self.eps(self.t)) * z / z.sum() + self.eps(self.t)

    def step(self, losses, counts):
        pi = self.policy()
        for k in range(self.k):
            if counts[k] > 0:
                self.r[k] = self.alpha * self.r[k] + (1 - self.alpha) * losses[k] / pi[k]
        self.t += 1


def reference_doremi(weights, losses, counts, reference, eta, c):
    """One DoReMi-style step: λ = max(r − ref, 0) (0 unseen), w' = w exp(η λ), w = (1 − c) w'/Σw' + c/K."""
    lam = np.where(counts > 0, np.maximum(losses - reference, 0), 0)
    w = weights * np.exp(eta * lam)
    return (1 - c) * w / w.sum() + c / len(w)


def feedback_stream(k, steps, seed):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        counts = rng.multinomial(16, rng.dirichlet(np.ones(k)))
        losses = np.where(counts > 0, rng.gamma(2.0, 1.0 + np.arange(k)), 0.0)
        yield losses, counts


# ----------------------------------------------------------------------------- ODM
@pytest.mark.parametrize("k, alpha", [(2, 0.9), (5, 0.5), (8, 0.0)])
def test_odm_matches_the_numpy_exp3_reference_step_by_step(k, alpha):
    rule, ref = ODM(k, smoothing=alpha), ReferenceEXP3(k, alpha)
    for losses, counts in feedback_stream(k, 300, seed=k):
        np.testing.assert_allclose(rule.weights(), ref.policy(), rtol=1e-12, atol=1e-15)
        rule.feedback(losses, counts)
        ref.step(losses, counts)
        np.testing.assert_allclose(rule.rewards, ref.r, rtol=1e-12)
    np.testing.assert_allclose(rule.weights(), ref.policy(), rtol=1e-12)
    assert rule.t == 300 and not np.allclose(rule.weights(), 1 / k)  # it moved off uniform


def test_odm_starts_uniform_keeps_exploring_and_favours_the_highest_loss():
    rule = ODM(4)
    np.testing.assert_allclose(rule.weights(), 0.25)
    for _ in range(2000):
        rule.feedback(np.array([1.0, 2.0, 3.0, 4.0]), np.array([4, 4, 4, 4]))
    w = rule.weights()
    assert np.all(np.diff(w) > 0) and w.sum() == pytest.approx(1.0)
    assert w.min() >= rule.exploration() - 1e-15  # every source keeps at least ε


def test_odm_learns_its_number_of_sources_from_the_sampler_and_refuses_another():
    rule = ODM()
    with pytest.raises(RuntimeError, match="number of sources"):
        rule.weights()
    rule.bind(3)
    assert rule.weights().shape == (3,)
    with pytest.raises(ValueError, match="built for 3 sources but the sampler has 4"):
        rule.bind(4)


@pytest.mark.parametrize("smoothing", [1.0, -0.1, float("nan")])
def test_odm_smoothing_must_lie_in_zero_one(smoothing):
    with pytest.raises(ValueError, match="smoothing"):
        ODM(2, smoothing=smoothing)


# ----------------------------------------------------------------------------- ExcessLoss
@pytest.mark.parametrize("eta, c", [(1.0, 1e-3), (0.3, 0.1), (2.0, 0.0)])
def test_excess_loss_matches_the_reference(eta, c):
    reference = np.array([1.0, 2.5, 0.5, 4.0])
    rule = ExcessLoss(reference, step_size=eta, smoothing=c)
    w = np.full(4, 0.25)
    for losses, counts in feedback_stream(4, 200, seed=7):
        rule.feedback(losses, counts)
        w = reference_doremi(w, losses, counts, reference, eta, c)
        np.testing.assert_allclose(rule.weights(), w, rtol=1e-10, atol=1e-15)
    assert rule.t == 200


def test_excess_loss_gives_no_credit_below_the_reference():
    rule = ExcessLoss([1.0, 1.0], step_size=1.0, smoothing=0.0)
    rule.feedback(np.array([0.2, 3.0]), np.array([8, 8]))
    np.testing.assert_allclose(rule.excess(np.array([0.2, 3.0]), np.array([8, 8])), [0.0, 2.0])
    w = rule.weights()
    np.testing.assert_allclose(w, np.array([1.0, math.exp(2.0)]) / (1 + math.exp(2.0)))


# ----------------------------------------------------------------------------- FixedMixture
def test_fixed_mixtures():
    np.testing.assert_allclose(FixedMixture.natural([10, 30, 60]).weights(), [0.1, 0.3, 0.6])
    np.testing.assert_allclose(FixedMixture.stratified(4).weights(), 0.25)
    rule = FixedMixture([0.2, 0.8])
    rule.feedback(np.array([5.0, 1.0]), np.array([1, 1]))
    np.testing.assert_array_equal(rule.weights(), [0.2, 0.8])
    for r in (rule, ODM(), ExcessLoss([1.0])):
        assert isinstance(r, MixingRule)


@pytest.mark.parametrize("proportions, message", [
    ([0.5, 0.6], "must sum to 1"),
    ([1.2, -0.2], r"must be finite and >= 0; proportions\[1\] = -0.2"),
    ([0.5, float("nan")], "must be finite"),
    ([], "non-empty"),
    ([[0.5, 0.5]], "1-D"),
])
def test_bad_proportions_are_refused_by_name(proportions, message):
    with pytest.raises(ValueError, match=message):
        FixedMixture(proportions)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="sizes"):
        FixedMixture.natural([3, 0])
    with pytest.raises(ValueError, match="num_sources"):
        FixedMixture.stratified(0)
    with pytest.raises(ValueError, match=r"reference_losses\[1\]"):
        ExcessLoss([1.0, float("inf")])
    with pytest.raises(ValueError, match="step_size"):
        ExcessLoss([1.0], step_size=0)
    with pytest.raises(ValueError, match="initial must have 2"):
        ExcessLoss([1.0, 2.0], initial=[1.0])


@pytest.mark.parametrize("rule", [ODM(3), ExcessLoss([1.0, 1.0, 1.0]), FixedMixture.stratified(3)],
                         ids=["odm", "excess", "fixed"])
@pytest.mark.parametrize("losses, counts, message", [
    ([1.0, float("nan"), 1.0], [1, 1, 1], r"source_losses\[1\]"),
    ([1.0, 1.0], [1, 1], "shape"),
    ([1.0, 1.0, 1.0], [0, 0, 0], "at least one"),
    ([1.0, 1.0, 1.0], [1, -1, 1], "source_counts"),
])
def test_bad_feedback_raises_and_changes_nothing(rule, losses, counts, message):
    rule.feedback(np.array([1.0, 2.0, 3.0]), np.array([2, 0, 1]))
    before = rule.state_dict()
    with pytest.raises(ValueError, match=message):
        rule.feedback(np.array(losses), np.array(counts))
    assert repr(rule.state_dict()) == repr(before)


@settings(max_examples=25, deadline=None)
@given(k=st.integers(1, 6), steps=st.integers(0, 30), seed=st.integers(0, 2**16), alpha=st.floats(0, 0.99))
def test_odm_weights_are_a_distribution_with_the_exploration_floor_and_resume_exactly(k, steps, seed, alpha):
    rule = ODM(k, smoothing=alpha)
    for losses, counts in feedback_stream(k, steps, seed):
        rule.feedback(losses, counts)
    w = rule.weights()
    assert w.shape == (k,) and abs(w.sum() - 1) < 1e-12 and (w >= rule.exploration() - 1e-12).all()
    again = ODM(k, smoothing=alpha)
    again.load_state_dict(rule.state_dict())
    np.testing.assert_array_equal(again.weights(), w)


def test_rule_states_are_checked_and_a_refused_one_changes_nothing():
    rule = ODM(2)
    rule.feedback(np.array([1.0, 2.0]), np.array([1, 1]))
    good = rule.state_dict()
    for bad, message in [({**good, "rewards": np.array([1.0, np.inf])}, "finite"),
                         ({**good, "t": -1}, "'t'"),
                         ({**good, "config": {**good["config"], "smoothing": 0.5}}, "smoothing=0.5"),
                         ({**good, "rewards": np.zeros(3)}, "shape")]:
        with pytest.raises(InvalidState, match=message):
            ODM(2).load_state_dict(bad)
    excess = ExcessLoss([1.0, 2.0])
    with pytest.raises(InvalidState, match="sum to 1"):
        excess.load_state_dict({**excess.state_dict(), "weights": np.array([0.9, 0.3])})
    np.testing.assert_array_equal(excess.weights(), [0.5, 0.5])

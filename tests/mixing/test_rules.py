"""The mixing rules against numpy references written here from the papers' formulas, step by step; their
argument and state checks."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from replayloader import InvalidState
from replayloader.mixing import ODM, ExcessLoss, FixedMixture, MixingRule, ODMExp3


# ----------------------------------------------------------------------------- references
class ReferenceSchedule:
    """The schedule both of the authors' updaters share (alon-albalak/online-data-mixing,
    megatron/data/data_sampling_utils.py: ``UpdateScheduler.requires_update``, ``DynamicDataSamplingWeight
    .group_update`` and the ε lines of each ``group_update``): plain Python over dicts, one source at a time, as
    there; the global iteration is incremented before the update call, which runs only after the warm-up."""

    def __init__(self, k, warmup):
        self.k, self.warmup = k, warmup
        self.weights = [1 / k] * k
        self.probabilities = {n: 1 / k for n in range(k)}
        self.eps, self.prev_eps, self.iteration = 1 / k, None, 0

    def step(self, losses, counts):
        self.iteration += 1
        if self.iteration > self.warmup:
            self.prev_eps = self.eps
            self.eps = min(1 / self.k, math.sqrt(math.log(self.k) / (self.k * self.iteration)))
            self.update(losses, counts)

    def policy(self):
        return np.array([self.probabilities[n] for n in range(self.k)])


class ReferenceSmoothedMean(ReferenceSchedule):
    """Transcribed from the authors' ``SmoothedMeanWeightUpdater.group_update``."""

    def __init__(self, k, smoothing, warmup):
        super().__init__(k, warmup)
        self.smoothing = smoothing
        self.estimated = {n: 0.0 for n in range(k)}

    def update(self, losses, counts):
        for name in range(self.k):
            if counts[name] > 0:
                self.estimated[name] = (self.smoothing * self.estimated[name]
                                        + (1 - self.smoothing) * math.exp(losses[name]))
        total = sum(r * self.prev_eps for r in self.estimated.values())
        scale = (1 - self.k * self.eps) / total
        for name in range(self.k):
            self.weights[name] = self.estimated[name] * self.prev_eps * scale + self.eps
        total_w = sum(self.weights)
        for name in range(self.k):
            self.probabilities[name] = self.weights[name] / total_w


class ReferenceExp3(ReferenceSchedule):
    """Transcribed from the authors' ``Exp3WeightUpdater.group_update`` (same file): reward = loss / 10,
    R̂ += reward / q with q the observation probability (theirs: the current probability π; the presence
    correction: 1 − (1 − π)^B), weights exp(ε_prev R̂) (1 − K ε) / Σ + ε, then normalised."""

    def __init__(self, k, warmup, correction):
        super().__init__(k, warmup)
        self.correction = correction
        self.cumulative = {n: 0.0 for n in range(k)}

    def update(self, losses, counts):
        b = sum(int(c) for c in counts)
        for name in range(self.k):
            if counts[name] > 0:
                pi = self.probabilities[name]
                q = pi if self.correction == "probability" else 1 - (1 - pi) ** b
                self.cumulative[name] += (losses[name] / 10) / q
        top = max(r * self.prev_eps for r in self.cumulative.values())  # shifted: the ratios are the authors'
        total = sum(math.exp(r * self.prev_eps - top) for r in self.cumulative.values())
        scale = (1 - self.k * self.eps) / total
        for name in range(self.k):
            self.weights[name] = math.exp(self.cumulative[name] * self.prev_eps - top) * scale + self.eps
        total_w = sum(self.weights)
        for name in range(self.k):
            self.probabilities[name] = self.weights[name] / total_w


def reference_doremi(weights, scores, losses, counts, reference, eta, c):
    """Transcribed from DoReMi's ``DoReMiTrainer.update_domain_weights`` (sangmichaelxie/doremi,
    doremi/trainer.py, ``doremiv1``): a domain seen scores its clipped excess loss, one not seen keeps its last
    score; log w += η score; normalised by logsumexp; (1 − c) w + c / K."""
    scores = np.array([max(losses[k] - reference[k], 0.0) if counts[k] > 0 else scores[k]
                       for k in range(len(weights))])
    with np.errstate(divide="ignore"):  # a weight of 0 (c = 0) stays 0
        log_w = np.log(weights) + eta * scores
    log_w = log_w - np.log(np.sum(np.exp(log_w)))
    return (1 - c) * np.exp(log_w) + c / len(weights), scores


def feedback_stream(k, steps, seed):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        counts = rng.multinomial(16, rng.dirichlet(np.ones(k)))
        losses = np.where(counts > 0, rng.gamma(2.0, 1.0 + np.arange(k)), 0.0)
        yield losses, counts


def higher_loss_stream(k, gap, batch, seed):
    """Per-source mean losses around 3 nats with one source (the last) ``gap`` nats higher, multinomial counts."""
    rng = np.random.default_rng(seed)
    while True:
        counts = rng.multinomial(batch, np.full(k, 1 / k))
        losses = 3.0 + rng.normal(0, 0.1, k)
        losses[-1] += gap
        yield np.where(counts > 0, losses, 0.0), counts


def steps_until(rule, stream, threshold, limit):
    """The number of feedback steps until the last source's weight first exceeds ``threshold`` (None: never
    within ``limit``)."""
    for step in range(1, limit + 1):
        rule.feedback(*next(stream))
        if rule.weights()[-1] > threshold:
            return step
    return None


# ----------------------------------------------------------------------------- ODM (smoothed mean), ODMExp3
@pytest.mark.parametrize("k, alpha, warmup", [(2, 0.9, 0), (5, 0.5, 20), (8, 0.0, 3), (6, 0.5, 2000)])
def test_odm_matches_the_authors_smoothed_mean_step_by_step(k, alpha, warmup):
    rule, ref = ODM(k, smoothing=alpha, warmup_steps=warmup), ReferenceSmoothedMean(k, alpha, warmup)
    for losses, counts in feedback_stream(k, warmup + 300, seed=k):
        np.testing.assert_allclose(rule.weights(), ref.policy(), rtol=1e-12, atol=1e-15)
        rule.feedback(losses, counts)
        ref.step(losses, counts)
        np.testing.assert_allclose(rule.rewards, [ref.estimated[n] for n in range(k)], rtol=1e-12)
    np.testing.assert_allclose(rule.weights(), ref.policy(), rtol=1e-12)
    assert rule.t == warmup + 300 and not np.allclose(rule.weights(), 1 / k)  # it moved off uniform


@pytest.mark.parametrize("correction", ["presence", "probability"])
@pytest.mark.parametrize("k, warmup", [(2, 0), (5, 20), (8, 3)])
def test_odm_exp3_matches_the_authors_exp3_step_by_step(k, warmup, correction):
    rule, ref = ODMExp3(k, warmup_steps=warmup, correction=correction), ReferenceExp3(k, warmup, correction)
    for losses, counts in feedback_stream(k, warmup + 300, seed=k):
        np.testing.assert_allclose(rule.weights(), ref.policy(), rtol=1e-9, atol=1e-14)
        rule.feedback(losses, counts)
        ref.step(losses, counts)
        np.testing.assert_allclose(rule.rewards, [ref.cumulative[n] for n in range(k)], rtol=1e-12)
    assert not np.allclose(rule.weights(), 1 / k)


def test_the_mixed_batch_correction_is_the_presence_probability_or_the_authors_pi():
    """With B examples per step, source k is seen with probability 1 − (1 − π_k)^B: the default divides the
    reward by that (unbiased for mixed batches); ``correction="probability"`` divides by π_k as the authors do."""
    counts = np.array([30, 2, 0])
    presence, authors = ODMExp3(3, warmup_steps=0), ODMExp3(3, warmup_steps=0, correction="probability")
    np.testing.assert_allclose(presence.observed(counts), 1 - (1 - 1 / 3) ** 32)
    np.testing.assert_allclose(authors.observed(counts), 1 / 3)
    losses = np.array([2.0, 4.0, 0.0])
    presence.feedback(losses, counts)
    authors.feedback(losses, counts)
    np.testing.assert_allclose(presence.rewards, [0.2 / (1 - (2 / 3) ** 32), 0.4 / (1 - (2 / 3) ** 32), 0.0])
    np.testing.assert_allclose(authors.rewards, [0.6, 1.2, 0.0])  # the unseen source keeps 0


def test_odm_a_source_one_and_a_half_nats_higher_passes_two_over_k_at_the_first_update():
    """K = 6, batches of 32, one source 1.5 nats above the others: the smoothed-mean rule gives it
    (1 − Kε) e^1.5 / (5 + e^1.5) + ε ≈ 0.37 > 2/K at the first update after the warm-up (step 101 here)."""
    k, warmup = 6, 100
    rule = ODM(k, warmup_steps=warmup)
    step = steps_until(rule, higher_loss_stream(k, 1.5, 32, seed=0), 2 / k, 2000)
    assert step == warmup + 1
    for _ in range(500):  # and it stays there while the loss stays higher
        rule.feedback(*next(higher_loss_stream(k, 1.5, 32, seed=1)))
    assert rule.weights()[-1] > 2 / k and np.allclose(rule.weights()[:-1], rule.weights()[0], rtol=0.2)


def test_odm_exp3_a_source_one_nat_higher_passes_two_over_k_within_800_steps():
    """K = 6, one source 1 nat above: EXP3's cumulative estimate grows ~0.1 t ahead, in a softmax at
    ε ~ 1/sqrt(t): the gap in the exponent grows like 0.055 sqrt(t), and the weight passes 2/K within 800 steps
    after a 100-step warm-up (measured: see the assertion), while the smoothed-mean rule reaches
    e / (5 + e) ≈ 0.35 only after a long warm-up makes ε small."""
    k = 6
    step = steps_until(ODMExp3(k, warmup_steps=100), higher_loss_stream(k, 1.0, 32, seed=0), 2 / k, 5000)
    assert step is not None and step <= 800, step


def test_odm_keeps_its_initial_weights_through_the_warm_up():
    rule = ODM(3, warmup_steps=5, initial=[0.5, 0.3, 0.2])
    for i in range(5):
        assert rule.warming_up()
        rule.feedback(np.array([9.0, 1.0, 1.0]), np.array([4, 4, 4]))
        np.testing.assert_array_equal(rule.weights(), [0.5, 0.3, 0.2])
        assert rule.exploration() == pytest.approx(1 / 3)
    assert not rule.warming_up()
    np.testing.assert_array_equal(rule.rewards, 0.0)  # nothing estimated during the warm-up
    rule.feedback(np.array([9.0, 1.0, 1.0]), np.array([4, 4, 4]))
    eps = math.sqrt(math.log(3) / 18)  # ε_6: the first update is the sixth step
    assert rule.exploration() == pytest.approx(eps)
    share = math.exp(9.0) / (math.exp(9.0) + 2 * math.exp(1.0))
    np.testing.assert_allclose(rule.weights()[0], (1 - 3 * eps) * share + eps, rtol=1e-12)
    assert set(rule.estimates()) == {"reward", "exploration"}


def test_odm_learns_its_number_of_sources_from_the_sampler_and_refuses_another():
    rule = ODM()
    with pytest.raises(RuntimeError, match="number of sources"):
        rule.weights()
    rule.bind(3)
    assert rule.weights().shape == (3,)
    with pytest.raises(ValueError, match="built for 3 sources but the sampler has 4"):
        rule.bind(4)
    assert ODM(initial=[0.2, 0.8]).num_sources == 2


@pytest.mark.parametrize("options, message", [
    ({"smoothing": 1.0}, "smoothing"), ({"smoothing": -0.1}, "smoothing"), ({"smoothing": float("nan")}, "smoothing"),
    ({"warmup_steps": -1}, "warmup_steps"), ({"warmup_steps": 2.5}, "warmup_steps"),
    ({"initial": [0.5, 0.6]}, "initial must sum to 1"),
])
def test_odm_options_are_checked_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        ODM(2, **options)


@pytest.mark.parametrize("options, message", [({"correction": "pi"}, "correction must be one of"),
                                              ({"reward_scale": 0}, "reward_scale")])
def test_odm_exp3_options_are_checked_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        ODMExp3(2, **options)


def test_odm_refuses_a_loss_whose_exp_overflows_and_changes_nothing():
    rule = ODM(2, warmup_steps=0)
    before = rule.state_dict()
    with pytest.raises(ValueError, match="source_losses must be below 710"):
        rule.feedback(np.array([800.0, 1.0]), np.array([1, 1]))
    assert repr(rule.state_dict()) == repr(before)


def test_an_odm_state_of_replayloader_1_is_refused_with_what_to_do():
    old = {"version": 1, "config": {"rule": "ODM", "num_sources": 2, "smoothing": 0.9},
           "rewards": np.zeros(2), "t": 3}
    with pytest.raises(InvalidState, match="1.x's ODM rule, which was replaced .* start the rule afresh"):
        ODM(2).load_state_dict(old)


# ----------------------------------------------------------------------------- ExcessLoss
@pytest.mark.parametrize("eta, c", [(1.0, 1e-3), (0.3, 0.1), (2.0, 0.0)])
def test_excess_loss_matches_doremis_update_step_by_step(eta, c):
    reference = np.array([1.0, 2.5, 0.5, 4.0])
    rule = ExcessLoss(reference, step_size=eta, smoothing=c)
    w, scores = np.full(4, 0.25), np.zeros(4)
    for losses, counts in feedback_stream(4, 200, seed=7):
        rule.feedback(losses, counts)
        w, scores = reference_doremi(w, scores, losses, counts, reference, eta, c)
        np.testing.assert_allclose(rule.weights(), w, rtol=1e-10, atol=1e-15)
        np.testing.assert_allclose(rule.estimates()["excess"], scores, rtol=1e-12)
    assert rule.t == 200


def test_excess_loss_a_source_above_its_reference_passes_two_over_k_at_the_second_step():
    """K = 6, every source at its reference (± 0.1 noise) except one 0.5 nats above it (η = 1): its weight
    grows by about e^0.5 a step against the others, e / (5 + e) ≈ 0.35 > 2/K after two steps."""
    k = 6
    rule = ExcessLoss(np.full(k, 3.0))
    step = steps_until(rule, higher_loss_stream(k, 0.5, 32, seed=0), 2 / k, 100)
    assert step == 2


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
    for r in (rule, ODM(), ODMExp3(), ExcessLoss([1.0])):
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


@pytest.mark.parametrize("rule", [ODM(3, warmup_steps=0), ODMExp3(3, warmup_steps=0), ExcessLoss([1.0, 1.0, 1.0]),
                                  FixedMixture.stratified(3)], ids=["odm", "exp3", "excess", "fixed"])
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
@given(k=st.integers(1, 6), steps=st.integers(0, 30), seed=st.integers(0, 2**16), alpha=st.floats(0, 0.99),
       warmup=st.integers(0, 10), exp3=st.booleans())
def test_odm_weights_are_a_distribution_with_the_exploration_floor_and_resume_exactly(k, steps, seed, alpha,
                                                                                      warmup, exp3):
    def make():
        return ODMExp3(k, warmup_steps=warmup) if exp3 else ODM(k, smoothing=alpha, warmup_steps=warmup)

    rule = make()
    for losses, counts in feedback_stream(k, steps, seed):
        rule.feedback(losses, counts)
    w = rule.weights()
    floor = rule.exploration() / (1.0 + 1e-9)
    assert w.shape == (k,) and abs(w.sum() - 1) < 1e-12 and (w >= floor - 1e-12).all()
    again = make()
    again.load_state_dict(rule.state_dict())
    np.testing.assert_array_equal(again.weights(), w)


def test_rule_states_are_checked_and_a_refused_one_changes_nothing():
    rule = ODM(2, warmup_steps=0)
    rule.feedback(np.array([1.0, 2.0]), np.array([1, 1]))
    good = rule.state_dict()
    for bad, message in [({**good, "rewards": np.array([1.0, np.inf])}, "finite"),
                         ({**good, "probabilities": np.array([0.9, 0.3])}, "sum to 1"),
                         ({**good, "t": -1}, "'t'"),
                         ({**good, "config": {**good["config"], "smoothing": 0.9}}, "smoothing=0.9"),
                         ({**good, "config": {**good["config"], "warmup_steps": 9}}, "warmup_steps=9"),
                         ({**good, "rewards": np.zeros(3)}, "shape")]:
        fresh = ODM(2, warmup_steps=0)
        with pytest.raises(InvalidState, match=message):
            fresh.load_state_dict(bad)
        np.testing.assert_array_equal(fresh.weights(), [0.5, 0.5])
    excess = ExcessLoss([1.0, 2.0])
    with pytest.raises(InvalidState, match="sum to 1"):
        excess.load_state_dict({**excess.state_dict(), "weights": np.array([0.9, 0.3])})
    with pytest.raises(InvalidState, match="scores"):
        excess.load_state_dict({**excess.state_dict(), "scores": np.array([-1.0, 0.0])})
    np.testing.assert_array_equal(excess.weights(), [0.5, 0.5])

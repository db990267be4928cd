"""PrioritizedSampler against a numpy reference: frequencies, importance weights, warm-up, feedback rules, resume."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.stats import chisquare

from replayloader.sampler import LinearSchedule, PrioritizedSampler, SampledBatch
from replayloader.strategies import GradBound, LossDifference, MaxWeight, SetWeight

from .helpers import assert_state_equal


def warmed_up(weights, batch_size=8, **kw):
    """A sampler past its warm-up pass whose weights were fed back as losses."""
    sampler = PrioritizedSampler(len(weights), batch_size, **kw)
    for batch in sampler:
        sampler.feedback(batch, loss=weights[batch.indices])
    assert sampler.epoch == 1
    return sampler


def reference_probabilities(weights, alpha, eps, floor=1e-6):
    p = np.maximum(weights, floor) ** alpha
    return (1 - eps) * p / p.sum() + eps / len(weights)


@pytest.mark.parametrize("sampling", ["stratified", "independent"])
@pytest.mark.parametrize("alpha, eps", [(1.0, 0.0), (0.6, 0.25)])
def test_frequencies_follow_weights_to_the_alpha_mixed_with_uniform(sampling, alpha, eps):
    weights = np.random.default_rng(1).gamma(1.0, size=50) + 0.05
    sampler = warmed_up(weights, batch_size=16, alpha=alpha, uniform_fraction=eps, sampling=sampling, seed=3)
    expected = reference_probabilities(weights, alpha, eps)
    np.testing.assert_allclose(sampler.probabilities(), expected, rtol=1e-12)
    counts = np.zeros(50)
    for _ in range(1500):  # 24,000 draws; feedback off, so the distribution stays fixed
        np.add.at(counts, sampler.next_batch().indices, 1)
    assert chisquare(counts, expected * counts.sum()).pvalue > 1e-3


def test_importance_weights_and_probabilities_are_exact_with_a_beta_schedule():
    weights = np.linspace(0.1, 3.0, 30)
    schedule = LinearSchedule(0.4, 1.0, steps=20)
    sampler = warmed_up(weights, batch_size=8, alpha=0.7, beta=schedule, uniform_fraction=0.1, seed=0)
    p = reference_probabilities(weights, 0.7, 0.1)
    for _ in range(25):
        batch = sampler.next_batch()
        np.testing.assert_allclose(batch.probabilities, p[batch.indices], rtol=1e-12)
        np.testing.assert_allclose(batch.weights, (p.min() / p[batch.indices]) ** schedule(batch.step), rtol=1e-12)
    assert schedule(25) == 1.0 and sampler.current_beta() == 1.0


def test_warmup_pass_has_unit_importance_weights_and_uniform_probabilities():
    sampler = PrioritizedSampler(10, 4, beta=1.0, seed=0)
    batch = sampler.next_batch()
    np.testing.assert_array_equal(batch.weights, 1.0)
    np.testing.assert_array_equal(batch.probabilities, 0.1)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 60), batch_size=st.integers(1, 17), seed=st.integers(0, 2**32 - 1))
def test_warmup_epoch_visits_every_index_exactly_once(n, batch_size, seed):
    sampler = PrioritizedSampler(n, batch_size, seed=seed)
    batches = list(sampler)
    assert len(batches) == len(sampler) == -(-n // batch_size)
    np.testing.assert_array_equal(np.sort(np.concatenate([b.indices for b in batches])), np.arange(n))
    assert sampler.epoch == 1 and sampler.position == 0
    after = list(sampler)  # a prioritized epoch: same number of steps, full batches
    assert len(after) == len(sampler) and all(len(b) == batch_size for b in after)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_weights_follow_feedback_with_last_duplicate_winning_and_the_floor(data):
    n = data.draw(st.integers(2, 20))
    floor = data.draw(st.sampled_from([1e-6, 0.5]))
    sampler = PrioritizedSampler(n, n, floor=floor, seed=0, update=SetWeight())
    list(sampler)  # hand every index out once
    reference = np.ones(n)  # MeanWeight's default for examples without feedback
    for _ in range(data.draw(st.integers(1, 5))):
        idx = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=2 * n)))
        vals = np.array(data.draw(st.lists(st.floats(0, 10), min_size=len(idx), max_size=len(idx))))
        sampler.feedback(idx, weight=vals)
        for i, v in zip(idx, vals):
            reference[i] = v
        np.testing.assert_array_equal(sampler.weights, np.maximum(reference, floor))
    np.testing.assert_allclose(sampler.probabilities(), sampler.weights / sampler.weights.sum())


def test_zero_loss_never_makes_an_example_unreachable():
    sampler = warmed_up(np.zeros(6), batch_size=6, seed=0)
    assert sampler.weights.min() == sampler.floor > 0
    seen = np.concatenate([sampler.next_batch().indices for _ in range(20)])
    assert set(seen) == set(range(6))


def test_examples_without_feedback_get_the_mean_measured_weight_at_epoch_end():
    sampler = PrioritizedSampler(6, 3, seed=0)
    first = sampler.next_batch()
    sampler.feedback(first, loss=np.array([1.0, 2.0, 6.0]))
    sampler.next_batch()  # no feedback for this one: the epoch ends
    untouched = np.setdiff1d(np.arange(6), first.indices)
    np.testing.assert_allclose(sampler.weights[untouched], 3.0)


def test_stale_epoch_feedback_is_skipped_and_counted():
    sampler = PrioritizedSampler(4, 4, seed=0, update=SetWeight())
    old = sampler.next_batch()  # epoch 0, every index
    new = sampler.next_batch()  # epoch 1
    sampler.feedback(new, weight=np.full(4, 2.0))
    assert sampler.feedback(old, weight=np.full(4, 9.0)) == 0  # drawn again since: stale
    assert sampler.stats()["stale_feedback"] == 4
    assert sampler.weights[new.indices].tolist() == [2.0] * 4
    sampler.feedback(old.indices, weight=np.full(4, 5.0))  # plain indices carry no epoch: applied
    assert sampler.weights.tolist() == [5.0] * 4


def test_loss_difference_and_grad_bound_updates_run_through_the_sampler():
    sampler = PrioritizedSampler(4, 4, seed=0, update=LossDifference())
    batch = sampler.next_batch()
    assert sampler.feedback(batch, loss=np.array([1.0, 1.0, 1.0, 1.0])) == 0  # first visit: loss remembered
    assert sampler.feedback(batch.indices, loss=np.array([0.5, 1.0, 3.0, 1.0])) == 4
    np.testing.assert_allclose(sampler.weights[batch.indices], [0.5, 1e-6, 2.0, 1e-6])
    bound = PrioritizedSampler(3, 3, seed=0, update=GradBound())
    batch = bound.next_batch()
    logits, targets = np.zeros((3, 2)), np.array([0, 1, 0])
    bound.feedback(batch, logits=logits, targets=targets)
    np.testing.assert_allclose(bound.weights[batch.indices], np.sqrt(0.5))


def test_max_weight_initializer_learns_from_feedback():
    sampler = PrioritizedSampler(4, 2, seed=0, init=MaxWeight())
    batch = sampler.next_batch()
    sampler.feedback(batch, loss=np.array([3.0, 7.0]))
    sampler.next_batch()  # epoch end: the two unmeasured examples get the largest weight seen
    rest = np.setdiff1d(np.arange(4), batch.indices)
    np.testing.assert_array_equal(sampler.weights[rest], 7.0)


BAD_UPDATES = [
    (lambda s, b: s.feedback(b, loss=np.array([np.nan, 1, 1])), ValueError, r"loss\[0\] = nan"),
    (lambda s, b: s.feedback(b, loss=np.array([1, -2.0, 1])), ValueError, r"loss\[1\] = -2"),
    (lambda s, b: s.feedback(b, loss=np.ones(2)), ValueError, r"loss must have shape \(3,\)"),
    (lambda s, b: s.feedback(np.array([b.indices[0], 12]), loss=np.ones(2)), ValueError, r"indices\[1\] = 12"),
    (lambda s, b: s.feedback(np.array([-1]), loss=np.ones(1)), ValueError, r"indices\[0\] = -1"),
    (lambda s, b: s.feedback(np.array([0.5]), loss=np.ones(1)), ValueError, "indices must be a non-empty 1-D integer"),
    (lambda s, b: s.feedback(b, lost=np.ones(3)), TypeError,
     r"unknown feedback keyword 'lost' for LossDifference; accepted: \['loss'\]"),
    (lambda s, b: s.feedback(b, grad_norm=np.ones(3)), TypeError, r"'grad_norm' for LossDifference; accepted: \['loss'\]"),
    (lambda s, b: s.feedback(b), TypeError, "needs the keyword 'loss'"),
]


@pytest.mark.parametrize("call, error, message", BAD_UPDATES)
def test_bad_feedback_raises_naming_the_argument_and_changes_nothing(call, error, message):
    sampler = PrioritizedSampler(12, 3, seed=0, update=LossDifference())
    batch = sampler.next_batch()
    sampler.feedback(batch, loss=np.ones(3))
    before = sampler.state_dict()
    with pytest.raises(error, match=message):
        call(sampler, batch)
    assert_state_equal(sampler.state_dict(), before)


def test_feedback_for_an_index_never_handed_out_is_refused():
    sampler = PrioritizedSampler(12, 3, seed=0)
    batch = sampler.next_batch()
    never = np.setdiff1d(np.arange(12), batch.indices)[0]
    before = sampler.state_dict()
    with pytest.raises(ValueError, match=rf"indices\[1\] = {never} was never handed out"):
        sampler.feedback(np.array([batch.indices[0], never]), loss=np.ones(2))
    assert_state_equal(sampler.state_dict(), before)


@pytest.mark.parametrize("kwargs, message", [
    ({"num_examples": 0}, "num_examples must be an integer >= 1, got 0"),
    ({"batch_size": 2.5}, "batch_size must be an integer >= 1, got 2.5"),
    ({"alpha": -1}, "alpha must be a finite number >= 0"),
    ({"beta": float("nan")}, "beta must be a finite number >= 0"),
    ({"uniform_fraction": 1.5}, r"uniform_fraction must be a finite number >= 0.0 and <= 1.0, got 1.5"),
    ({"floor": 0.0}, "floor must be a finite number > 0"),
    ({"sampling": "greedy"}, "sampling must be one of \\('stratified', 'independent'\\)"),
    ({"warmup_epochs": -1}, "warmup_epochs must be an integer >= 0"),
])
def test_bad_configuration_names_the_argument(kwargs, message):
    args = {"num_examples": 10, "batch_size": 2, **kwargs}
    with pytest.raises(ValueError, match=message):
        PrioritizedSampler(args.pop("num_examples"), args.pop("batch_size"), **args)


def feedback_run(sampler, steps, start=0):
    """Draw `steps` batches with a loss that depends on index and step (so weights keep moving)."""
    out = []
    for step in range(start, start + steps):
        batch = sampler.next_batch()
        out.append(batch)
        sampler.feedback(batch, loss=np.sin(batch.indices * 0.7 + step) + 1.0)
    return out


@pytest.mark.parametrize("stop", [2, 5, 9, 11])  # inside the warm-up pass, at its end, mid-epoch, at an epoch end
def test_resume_mid_epoch_gives_the_identical_continuation(stop):
    make = lambda: PrioritizedSampler(20, 4, alpha=0.8, beta=LinearSchedule(0.4, 1.0, 10), uniform_fraction=0.2,
                                      update=LossDifference(), seed=7)  # noqa: E731
    whole = feedback_run(make(), 16)
    first = make()
    feedback_run(first, stop)
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    rest = feedback_run(resumed, 16 - stop, start=stop)
    for a, b in zip(whole[stop:], rest):
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.weights, b.weights)
        assert (a.epoch, a.step) == (b.epoch, b.step)


def test_load_state_dict_refuses_another_configuration():
    state = PrioritizedSampler(10, 2, seed=0).state_dict()
    with pytest.raises(ValueError, match="checkpoint has batch_size=2 but this sampler has batch_size=3"):
        PrioritizedSampler(10, 3, seed=0).load_state_dict(state)


def test_iteration_continues_the_current_epoch():
    sampler = PrioritizedSampler(10, 3, seed=0)
    iterator = iter(sampler)
    next(iterator)
    assert [len(b) for b in sampler] == [3, 3, 1]  # a new iter() picks up where the epoch stands
    assert isinstance(sampler.next_batch(), SampledBatch) and sampler.epoch == 1


def test_import_replayloader_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys, replayloader; assert 'torch' not in sys.modules; "
            "replayloader.PrioritizedSampler(3, 1, seed=0).next_batch(); assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_feature_based_initializer_rescores_examples_without_feedback():
    from replayloader.strategies import LinUCB

    features = np.random.default_rng(0).normal(size=(12, 3))
    with pytest.raises(ValueError, match="init 'linucb' is feature based: pass features= of shape \\(12, d\\)"):
        PrioritizedSampler(12, 4, init=LinUCB())
    sampler = PrioritizedSampler(12, 4, init=LinUCB(), features=features, seed=0)
    batch = sampler.next_batch()
    before = sampler.weights.copy()
    sampler.feedback(batch, loss=np.array([1.0, 2.0, 3.0, 4.0]))
    rest = np.setdiff1d(np.arange(12), batch.indices)
    np.testing.assert_allclose(sampler.weights[rest], sampler.init.scores(features[rest]))  # re-scored
    assert not np.allclose(sampler.weights[rest], before[rest])

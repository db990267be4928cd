"""MixtureSampler: proportions, draws without replacement inside a source, labels, feedback, bad input that
changes nothing, exact resume (also mid-pass and through a state file), world-size independence, the log."""
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from replayloader import InvalidState, load_state, save_state
from replayloader.mixing import ODM, ExcessLoss, FixedMixture, MixtureBatch, MixtureSampler
from tests.core.helpers import assert_state_equal


def loss_of(indices, step):
    """A deterministic per-example 'training loss' that differs by example and drifts with the step."""
    return 0.5 + (np.asarray(indices) % 7) * 0.3 + 0.01 * step


def run(sampler, steps, feed=True):
    """Draw ``steps`` batches, feeding each one's losses back; return them."""
    batches = []
    for _ in range(steps):
        batch = sampler.next_batch()
        if feed:
            sampler.feedback(batch.indices, loss=loss_of(batch.indices, batch.step))
        batches.append(batch)
    return batches


def same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.indices, y.indices)
        np.testing.assert_array_equal(x.sources, y.sources)
        np.testing.assert_array_equal(x.mixture, y.mixture)
        assert x.step == y.step


def test_source_counts_follow_the_weights_within_binomial_bounds():
    p = np.array([0.5, 0.3, 0.15, 0.05])
    sampler = MixtureSampler([40, 25, 30, 5], batch_size=64, rule=FixedMixture(p), seed=3)
    batches = run(sampler, 300, feed=False)
    counts = np.bincount(np.concatenate([b.sources for b in batches]), minlength=4)
    n = counts.sum()
    assert n == 300 * 64
    assert (np.abs(counts - n * p) <= 4.5 * np.sqrt(n * p * (1 - p))).all(), counts
    for b in batches:
        np.testing.assert_array_equal(b.mixture, p)
        np.testing.assert_array_equal(sampler.source_of[b.indices], b.sources)
        assert b.indices.dtype == np.int64 and b.sources.dtype == np.int64 and b.mixture.dtype == np.float64
    np.testing.assert_array_equal(sampler.stats()["drawn"], counts)


def test_a_source_of_weight_zero_is_never_drawn():
    sampler = MixtureSampler([5, 5, 5], batch_size=32, rule=FixedMixture([0.5, 0.0, 0.5]), seed=0)
    assert 1 not in np.concatenate([b.sources for b in run(sampler, 50, feed=False)])


def test_inside_a_source_every_example_comes_once_per_pass_in_a_fresh_order():
    sizes = [7, 13, 29]
    sampler = MixtureSampler(sizes, batch_size=10, rule=FixedMixture.stratified(3), seed=1)
    batches = run(sampler, 60, feed=False)
    for k, size in enumerate(sizes):
        seq = np.concatenate([b.indices[b.sources == k] for b in batches])
        passes = [seq[i:i + size] for i in range(0, len(seq) - size + 1, size)]
        assert len(passes) >= 3
        block = np.arange(sampler.offsets[k], sampler.offsets[k + 1])
        for one in passes:
            np.testing.assert_array_equal(np.sort(one), block)
        assert not np.array_equal(passes[0], passes[1])  # reshuffled at the end of a pass


def test_from_labels_draws_each_source_from_its_labelled_positions():
    labels = np.random.default_rng(0).integers(0, 3, size=200)
    sampler = MixtureSampler.from_labels(labels, batch_size=16, rule=ODM(), seed=0, names=["web", "code", "books"])
    for b in run(sampler, 40):
        np.testing.assert_array_equal(labels[b.indices], b.sources)
    assert sampler.stats()["names"] == ["web", "code", "books"] and sampler.num_examples == 200
    seen = np.concatenate([b.indices[b.sources == 2] for b in run(sampler, 40, feed=False)])
    assert set(seen) <= set(np.flatnonzero(labels == 2))


@pytest.mark.parametrize("labels, options, message", [
    ([0, 1, 3], {"num_sources": 3}, r"labels must lie in \[0, 3\) \(num_sources=3\); labels\[2\] = 3"),
    ([0, -1, 1], {}, r"labels\[1\] = -1"),
    ([0, 2, 2], {}, "source 1 is empty"),
    ([0, 1, 1], {"num_sources": 3}, "source 2 is empty"),
    ([], {}, "non-empty"),
    ([0.0, 1.0], {}, "integer"),
])
def test_bad_labels_are_refused_by_name(labels, options, message):
    with pytest.raises(ValueError, match=message):
        MixtureSampler.from_labels(np.array(labels), batch_size=2, rule=ODM(), **options)


@pytest.mark.parametrize("sources, options, error, message", [
    ([3, 0, 2], {}, ValueError, r"source 1 is empty"),
    ([3, 2], {"batch_size": 0}, ValueError, "batch_size"),
    ([3, 2], {"within": "sorted"}, ValueError, "within must be one of"),
    ([3, 2], {"names": ["a"]}, ValueError, "names must be 2 distinct"),
    ([3, 2], {"names": ["a", "a"]}, ValueError, "names must be 2 distinct"),
    ([3, 2, 4], {"rule": FixedMixture([0.5, 0.5])}, ValueError, "built for 2 sources but the sampler has 3"),
    ([3, 2], {"rule": "odm"}, TypeError, "rule must be a MixingRule"),
    ([3, 2], {"prioritized": {"alpha": 0.5}}, ValueError, "need within='prioritized'"),
    ([3, 2], {"within": "prioritized", "prioritized": {"batch_size": 4}}, ValueError, "must not set"),
    ([3, 2], {"seed": -1}, ValueError, "seed"),
    ([3.0, 2.0], {}, ValueError, "integer source sizes"),
])
def test_bad_construction_is_refused_by_name(sources, options, error, message):
    with pytest.raises(error, match=message):
        MixtureSampler(sources, **{"batch_size": 4, "rule": ODM(), **options})


@pytest.mark.parametrize("within", ["uniform", "prioritized"])
@pytest.mark.parametrize("indices, losses, message", [
    (lambda b: b.indices, lambda b: np.where(np.arange(len(b)) == 2, np.nan, 1.0), r"loss\[2\] = nan"),
    (lambda b: b.indices, lambda b: np.full(len(b), np.inf), r"loss\[0\] = inf"),
    (lambda b: b.indices, lambda b: np.ones(len(b) - 1), "loss must have shape"),
    (lambda b: b.indices, lambda b: np.ones((len(b), 1)), "loss must have shape"),
    (lambda b: np.append(b.indices, 10_000), lambda b: np.ones(len(b) + 1), r"must lie in \[0, 60\)"),
    (lambda b: b.indices[:, None], lambda b: np.ones(len(b)), "1-D integer"),
    (lambda b: b.indices.astype(float), lambda b: np.ones(len(b)), "1-D integer"),
    (lambda b: np.array([], np.int64), lambda b: np.ones(0), "non-empty"),
])
def test_bad_feedback_raises_by_name_and_changes_nothing(within, indices, losses, message):
    sampler = MixtureSampler([20, 30, 10], batch_size=8, rule=ODM(), seed=0, within=within)
    run(sampler, 3)
    batch = sampler.next_batch()
    before = sampler.state_dict()
    with pytest.raises(ValueError, match=message):
        sampler.feedback(indices(batch), loss=losses(batch))
    assert_state_equal(sampler.state_dict(), before)


def test_feedback_for_an_index_never_drawn_and_negative_losses_are_refused():
    sampler = MixtureSampler([20, 30], batch_size=4, rule=ODM(), seed=0, within="prioritized")
    batch = sampler.next_batch()
    never = next(i for i in range(50) if i not in batch.indices)
    before = sampler.state_dict()
    with pytest.raises(ValueError, match=f"= {never} was never drawn"):
        sampler.feedback(np.array([batch.indices[0], never]), loss=np.ones(2))
    with pytest.raises(ValueError, match="finite and >= 0"):
        sampler.feedback(batch.indices, loss=-np.ones(4))
    assert_state_equal(sampler.state_dict(), before)
    uniform = MixtureSampler([20, 30], batch_size=4, rule=ODM(warmup_steps=0), seed=0)
    b = uniform.next_batch()
    before = uniform.state_dict()
    with pytest.raises(ValueError, match=r"loss must be finite and >= 0 \(training losses\); loss\[0\] = -1.0"):
        uniform.feedback(b, loss=-np.ones(4))  # one rule for both within modes: a training loss is never negative
    assert_state_equal(uniform.state_dict(), before)


def test_feedback_gives_the_rule_each_sources_mean_loss_and_count():
    rule = ExcessLoss([0.0, 0.0, 0.0], step_size=0.5, smoothing=0.0)
    sampler = MixtureSampler([4, 4, 4], batch_size=6, rule=rule, seed=0, names=["a", "b", "c"])
    batch = sampler.next_batch()
    losses = np.arange(6, dtype=float)
    sampler.feedback(batch, loss=losses)
    counts = np.bincount(batch.sources, minlength=3)
    means = np.array([losses[batch.sources == k].mean() if counts[k] else 0.0 for k in range(3)])
    expected = np.where(counts > 0, np.exp(0.5 * means), 1.0)
    np.testing.assert_allclose(rule.weights(), expected / expected.sum())
    stats = sampler.stats()
    np.testing.assert_array_equal(stats["fed_back"], counts)
    np.testing.assert_allclose(stats["mean_loss"][counts > 0], means[counts > 0])
    assert np.isnan(stats["mean_loss"][counts == 0]).all() and stats["feedback_calls"] == 1


def test_prioritized_within_composes_example_and_source_importance():
    """Source 0's example 3 keeps a high loss: after the warm-up pass its source's PrioritizedSampler draws it
    far more often than its neighbours, while the source proportions still follow the rule."""
    sampler = MixtureSampler([10, 10], batch_size=8, rule=FixedMixture([0.5, 0.5]), seed=0, within="prioritized")
    counts = np.zeros(20)
    for step in range(300):
        batch = sampler.next_batch()
        losses = np.where(batch.indices == 3, 20.0, 1.0)
        sampler.feedback(batch.indices, loss=losses)
        if step >= 10:
            np.add.at(counts, batch.indices, 1)
    assert counts[3] > 5 * np.delete(counts[:10], 3).mean()
    assert abs(counts[:10].sum() / counts.sum() - 0.5) < 0.05
    assert sampler.samplers[0].weights[3] == 20.0 and sampler.samplers[1].weights.max() == 1.0


@pytest.mark.parametrize("within", ["uniform", "prioritized"])
@pytest.mark.parametrize("rule", [lambda: ODM(smoothing=0.5), lambda: ExcessLoss([1.0, 1.5, 2.0]),
                                  lambda: FixedMixture([0.2, 0.3, 0.5])], ids=["odm", "excess", "fixed"])
def test_resume_mid_pass_continues_the_identical_stream(within, rule, tmp_path):
    def make():
        return MixtureSampler.from_labels(np.arange(45) % 3, batch_size=7, rule=rule(), seed=5, within=within)

    sampler = make()
    run(sampler, 9)  # mid-pass in every source (15 examples each)
    assert (sampler.cursor[:3] % 15 != 0).any() or within == "prioritized"
    state = sampler.state_dict()
    save_state(state, tmp_path / "mixture.npz")
    uninterrupted = run(sampler, 25)
    for loaded in (state, load_state(tmp_path / "mixture.npz")):
        resumed = make()
        resumed.load_state_dict(loaded)
        same_batches(run(resumed, 25), uninterrupted)
        assert_state_equal(resumed.state_dict(), sampler.state_dict())


def test_a_refused_state_names_its_field_and_changes_nothing():
    sampler = MixtureSampler([6, 9], batch_size=5, rule=ODM(), seed=0, within="prioritized")
    run(sampler, 4)
    good = sampler.state_dict()
    fresh = MixtureSampler([6, 9], batch_size=5, rule=ODM(), seed=0, within="prioritized")
    before = fresh.state_dict()
    bad_source = {**good["sources"][1], "weights": np.full(9, np.nan)}
    for bad, message in [
        ({**good, "rng": np.zeros(4, np.uint64)}, "all zero"),
        ({**good, "cursor": np.array([7, 0])}, "cursor"),
        ({**good, "drawn": np.ones(3, bool)}, "shape"),
        ({**good, "step": -2}, "'step'"),
        ({**good, "config": {**good["config"], "seed": 1}}, "seed=1"),
        ({**good, "rule": {**good["rule"], "rewards": np.array([np.inf, 0.0])}}, "finite"),
        ({**good, "sources": [good["sources"][0], bad_source]}, "weights"),  # the rule and source 0 loaded first
        ({**good, "sources": good["sources"][:1]}, "list of 2"),
    ]:
        with pytest.raises(InvalidState, match=message):
            fresh.load_state_dict(bad)
        assert_state_equal(fresh.state_dict(), before)
    uniform = MixtureSampler([6, 9], batch_size=5, rule=ODM(), seed=0)
    state = uniform.state_dict()
    order = state["order"].copy()
    order[6:] = 0  # source 0's permutation intact, source 1's not
    with pytest.raises(InvalidState, match="permutation of source 1's 9 positions"):
        uniform.load_state_dict({**state, "order": order})


def test_slices_of_two_ranks_concatenated_are_the_one_process_batch_with_the_same_feedback():
    def make():
        return MixtureSampler([30, 50, 20], batch_size=12, rule=ODM(), seed=9)

    one, ranks = make(), [make(), make()]
    for _ in range(40):
        whole = one.next_batch()
        parts = [r.next_batch().share(rank, 2) for rank, r in enumerate(ranks)]
        joined = MixtureBatch(np.concatenate([p.indices for p in parts]), np.concatenate([p.sources for p in parts]),
                              parts[0].mixture, parts[0].step)
        same_batches([joined], [whole])
        losses = loss_of(whole.indices, whole.step)
        one.feedback(whole.indices, loss=losses)
        for r in ranks:  # what the DDP batch sampler does: every rank applies the gathered global feedback
            r.feedback(joined.indices, loss=losses)
    assert_state_equal(ranks[0].state_dict(), one.state_dict())
    with pytest.raises(ValueError, match="not divisible|cannot be split"):
        whole.share(0, 5)


def test_the_log_has_one_line_per_logged_step_with_the_weights_by_name(tmp_path):
    log = tmp_path / "logs" / "weights.jsonl"
    sampler = MixtureSampler([5, 5], batch_size=4, rule=ODM(), seed=0, names=["web", "code"], log_path=log,
                             log_every=3)
    batches = run(sampler, 10)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 3, 6, 9]
    for line in lines:
        assert list(line["weights"]) == ["web", "code"]
        assert list(line["weights"].values()) == batches[line["step"]].mixture.tolist()


@settings(max_examples=20, deadline=None)
@given(sizes=st.lists(st.integers(1, 12), min_size=1, max_size=4), batch_size=st.integers(1, 9),
       seed=st.integers(0, 1000), steps=st.integers(1, 12), cut=st.integers(0, 12),
       within=st.sampled_from(["uniform", "prioritized"]))
def test_any_sampler_draws_from_its_sources_and_resumes_exactly(sizes, batch_size, seed, steps, cut, within):
    def make():
        return MixtureSampler(sizes, batch_size=batch_size, rule=ODM(), seed=seed, within=within)

    sampler = make()
    cut = min(cut, steps)
    run(sampler, cut)
    state = sampler.state_dict()
    rest = run(sampler, steps - cut)
    for b in rest:
        assert len(b) == batch_size
        np.testing.assert_array_equal(sampler.source_of[b.indices], b.sources)
        assert ((b.indices >= sampler.offsets[b.sources]) & (b.indices < sampler.offsets[b.sources + 1])).all()
    resumed = make()
    resumed.load_state_dict(state)
    same_batches(run(resumed, steps - cut), rest)
    assert sampler.stats()["drawn"].sum() == steps * batch_size


class Greedy:
    """A user's rule in a few lines of numpy: all weight on the source with the highest last loss (and a bad
    variant whose weights do not sum to 1)."""

    def __init__(self, bad=False):
        self.num_sources, self.bad, self.last = None, bad, None

    def bind(self, num_sources):
        self.num_sources = num_sources
        self.last = np.zeros(num_sources)

    def weights(self):
        w = np.full(self.num_sources, 0.05 / (self.num_sources - 1))
        w[np.argmax(self.last)] = 0.95
        return w * (2.0 if self.bad else 1.0)

    def feedback(self, source_losses, source_counts):
        self.last = np.where(source_counts > 0, source_losses, self.last)

    def state_dict(self):
        return {"last": self.last.copy()}

    def load_state_dict(self, state):
        self.last = np.asarray(state["last"], float).copy()


def test_a_users_rule_drives_the_mixture_and_bad_weights_are_refused_before_a_draw():
    sampler = MixtureSampler([10, 10, 10], batch_size=20, rule=Greedy(), seed=0)
    batch = sampler.next_batch()  # nothing fed back yet: all weight on source 0
    assert np.bincount(batch.sources, minlength=3)[0] >= 15
    sampler.feedback(batch, loss=np.where(batch.sources == 0, 0.0, 2.0))  # source 0 now has the lowest last loss
    assert np.argmax(np.bincount(sampler.next_batch().sources, minlength=3)) != 0
    bad = MixtureSampler([10, 10], batch_size=4, rule=Greedy(bad=True), seed=0)
    before = bad.state_dict()
    with pytest.raises(ValueError, match=r"Greedy.weights\(\) must return 2 finite numbers >= 0 summing to 1"):
        bad.next_batch()
    assert_state_equal(bad.state_dict(), before)


def test_the_1_0_names_draw_and_feedback_indices_losses_still_work_with_a_deprecation_warning():
    """1.1 speaks the library's vocabulary (`next_batch()`, `feedback(batch, loss=...)`); 1.0's forms warn for one
    release, naming the new one, and do the same."""
    new, old = (MixtureSampler([20, 30], batch_size=4, rule=ODM(), seed=0) for _ in range(2))
    with pytest.warns(DeprecationWarning, match=r"MixtureSampler\.draw\(\) is deprecated .*use \.next_batch\(\)"):
        drawn = old.draw()
    batch = new.next_batch()
    same_batches([drawn], [batch])
    with pytest.warns(DeprecationWarning, match=r"MixtureSampler\.feedback\(\) .*use \.feedback\(batch, loss=\.\.\.\)"):
        old.feedback(drawn.indices, np.ones(4))
    with pytest.warns(DeprecationWarning, match="use .feedback"):
        old.feedback(indices=drawn.indices, losses=np.ones(4))
    new.feedback(batch, loss=np.ones(4))
    new.feedback(batch.indices, loss=np.ones(4))
    assert_state_equal(old.state_dict(), new.state_dict())
    with pytest.raises(TypeError):
        new.feedback(batch, np.ones(4), np.ones(4))


def test_a_state_with_feedback_for_a_source_never_drawn_is_refused_and_changes_nothing():
    sampler = MixtureSampler([6, 9], batch_size=5, rule=ODM(warmup_steps=0), seed=0)
    batch = sampler.next_batch()
    sampler.feedback(batch, loss=np.ones(5))
    state = sampler.state_dict()
    bad = {**state, "counts_drawn": np.array([5, 0]), "counts_fed_back": np.array([3, 2])}
    fresh = MixtureSampler([6, 9], batch_size=5, rule=ODM(warmup_steps=0), seed=0)
    before = fresh.state_dict()
    with pytest.raises(InvalidState, match="counts_fed_back'] holds feedback for a source never drawn from"):
        fresh.load_state_dict(bad)
    assert_state_equal(fresh.state_dict(), before)


def test_a_state_after_repeated_feedback_loads():
    """Feedback may name an example twice, in one call or in two (a batch fed back again): a source's entries
    then outnumber its draws, and the checkpoint must still load, and resume the same stream."""
    sampler = MixtureSampler([6, 9], batch_size=5, rule=ODM(warmup_steps=0), seed=0)
    batch = sampler.next_batch()
    sampler.feedback(np.concatenate([batch.indices, batch.indices]), loss=np.ones(10))
    sampler.feedback(batch, loss=np.full(5, 2.0))
    state = sampler.state_dict()
    assert (state["counts_fed_back"] > state["counts_drawn"]).any()
    resumed = MixtureSampler([6, 9], batch_size=5, rule=ODM(warmup_steps=0), seed=0)
    resumed.load_state_dict(state)
    same_batches(run(resumed, 4), run(sampler, 4))

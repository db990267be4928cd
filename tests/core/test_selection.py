"""Score-then-select (`replayloader.selection`: `selection.score_then_select`, `selection.irreducible`) against
plain-Python references, with bad input leaving every object unchanged."""
import copy

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from replayloader import PrioritizedSampler, ReplayBuffer, ReplayDataLoader
from replayloader.selection.irreducible import IrreducibleLosses, irreducible_losses
from replayloader.selection.score_then_select import BufferScoreThenSelect, ScoreThenSelect
from replayloader.selection import Proportional, ReducibleLoss, SelectiveBackprop, Selector, TopK
from replayloader.selection.rules import keep_probabilities

small_scores = st.lists(st.integers(0, 4), min_size=1, max_size=40).map(lambda v: np.array(v, float) / 2)


def reference_top_k(scores, k):
    """Highest first; equal scores in candidate order."""
    return sorted(range(len(scores)), key=lambda j: (-scores[j], j))[:k]


def reference_keep(scores, history, selectivity, min_keep):
    """P(keep) = max(min_keep, (share of history <= score)^selectivity), one candidate at a time."""
    return [max(min_keep, (sum(h <= s for h in history) / len(history)) ** selectivity) for s in scores]


def assert_same_state(a, b):
    """Two nested state dicts are equal (arrays compared exactly)."""
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same_state(a[key], b[key])
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b)
    else:
        assert a == b


@settings(max_examples=100, deadline=None)
@given(small_scores, st.integers(1, 40))
def test_top_k_equals_the_reference_with_ties(scores, k):
    k = min(k, len(scores))
    selection = Selector(TopK(k)).choose(scores)
    assert selection.positions.tolist() == reference_top_k(scores.tolist(), k)
    assert selection.weights.tolist() == [1.0] * k and selection.indices is None


@settings(max_examples=60, deadline=None)
@given(st.lists(small_scores, min_size=1, max_size=5), st.sampled_from([0.0, 0.5, 1.0, 3.0]),
       st.integers(1, 30), st.sampled_from([0.0, 0.2]))
def test_selective_backprop_keep_probabilities_follow_the_recent_history(batches, selectivity, history, min_keep):
    rule = SelectiveBackprop(selectivity=selectivity, history=history, min_keep=min_keep)
    selector, seen = Selector(rule, seed=1), []
    for scores in batches:
        seen += scores.tolist()
        window = seen[-history:]
        selection = selector.choose(scores)
        np.testing.assert_allclose(selection.probabilities, reference_keep(scores, window, selectivity, min_keep),
                                   rtol=1e-12)
        assert rule.recent.tolist() == window
        assert set(selection.positions.tolist()) <= set(range(len(scores)))


def test_selective_backprop_keeps_each_candidate_with_its_probability():
    scores = np.linspace(0.0, 1.0, 20)
    rule = SelectiveBackprop(selectivity=2.0, history=20)
    selector, kept = Selector(rule, seed=3), np.zeros(20)
    trials = 4000
    for _ in range(trials):
        kept[selector.choose(scores).positions] += 1
    expected = keep_probabilities(scores, scores, 2.0, 0.0)  # the history is these scores again and again
    assert np.abs(kept / trials - expected).max() < 4 * np.sqrt(0.25 / trials)


def test_proportional_probabilities_and_importance_weights_are_exact():
    scores = np.array([0.5, 0.0, 2.0, 1.0, -1.0, 0.5])
    alpha, beta = 0.7, 0.6
    selection = Selector(Proportional(5, alpha=alpha, beta=beta), seed=0).choose(scores, np.arange(6) + 10,
                                                                              np.full(6, 0.5))
    mass = np.array([0.5 ** alpha, 0.0, 2.0 ** alpha, 1.0, 0.0, 0.5 ** alpha])
    p = mass / mass.sum()
    np.testing.assert_array_equal(selection.probabilities, p)
    assert set(selection.positions.tolist()) <= {0, 2, 3, 5}  # zero (and negative) scores are never drawn
    np.testing.assert_array_equal(selection.weights, (p[p > 0].min() / p[selection.positions]) ** beta * 0.5)
    np.testing.assert_array_equal(selection.indices, selection.positions + 10)


def test_proportional_importance_weights_make_an_unbiased_estimate_of_the_candidate_mean():
    rng = np.random.default_rng(0)
    scores, values = rng.uniform(0.1, 3.0, 30), rng.normal(size=30)
    selector = Selector(Proportional(8, alpha=1.0, beta=1.0), seed=2)
    estimates = []
    for _ in range(3000):
        s = selector.choose(scores)
        p_min = s.probabilities.min()
        estimates.append((s.weights * values[s.positions]).mean() / (len(scores) * p_min))
    estimates = np.array(estimates)
    assert abs(estimates.mean() - values.mean()) < 4 * estimates.std() / np.sqrt(len(estimates))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 5), min_size=2, max_size=30), st.data())
def test_reducible_loss_is_training_loss_minus_the_irreducible_loss_of_each_index(losses, data):
    irreducible = np.array(data.draw(st.lists(st.floats(-2, 5), min_size=50, max_size=50)))
    indices = np.array(data.draw(st.lists(st.integers(0, 49), min_size=len(losses), max_size=len(losses))))
    k = data.draw(st.integers(1, len(losses)))
    selection = Selector(TopK(k), ReducibleLoss(irreducible)).choose(np.array(losses), indices)
    reducible = [loss - irreducible[i] for loss, i in zip(losses, indices)]
    assert selection.scores.tolist() == reducible
    assert selection.positions.tolist() == reference_top_k(reducible, k)
    assert selection.indices.tolist() == [indices[j] for j in selection.positions]


def dataset_mode(n=30, n_big=8, rule=None, seed=0, irreducible=None):
    sampler = PrioritizedSampler(n, n_big, alpha=1.0, beta=0.5, uniform_fraction=0.1, warmup_epochs=1, seed=seed)
    score = None if irreducible is None else ReducibleLoss(irreducible)
    return ScoreThenSelect(sampler, Selector(rule or TopK(3), score, seed=seed))


def fake_losses(indices, step):
    return (np.asarray(indices) * 7 % 11) / 10 + 0.01 * step


def test_dataset_mode_refreshes_the_sampler_with_clipped_scores_and_multiplies_candidate_weights():
    irreducible = np.linspace(0.0, 1.5, 30)
    select = dataset_mode(rule=Proportional(4), irreducible=irreducible)
    scored = 0
    for step in range(12):  # past the warm-up pass (4 batches): candidates come with importance weights < 1
        candidates = select.next_candidates()
        losses = fake_losses(candidates.indices, step)
        selection = select.choose(candidates, losses)
        scored += len(candidates)
        scores = losses - irreducible[candidates.indices]
        np.testing.assert_array_equal(selection.scores, scores)
        last = {i: s for i, s in zip(candidates.indices, scores)}  # a repeated index counts once, its last value
        for i, s in last.items():
            assert select.sampler.weights[i] == max(s, select.sampler.floor)
        p = selection.probabilities
        np.testing.assert_array_equal(selection.weights, (p[p > 0].min() / p[selection.positions])
                                      * candidates.weights[selection.positions])
    assert select.selector.stats()["scored"] == scored == 30 + 8 * 8 and select.selector.stats()["selected"] == 12 * 4


def test_a_restored_dataset_mode_continues_the_same_candidate_and_selection_stream():
    def run(select, steps, start):
        out = []
        for step in range(start, start + steps):
            candidates = select.next_candidates()
            s = select.choose(candidates, fake_losses(candidates.indices, step))
            out.append((candidates.indices.tolist(), s.positions.tolist()))
        return out

    whole = run(dataset_mode(rule=SelectiveBackprop(selectivity=1.0, history=10)), 15, 0)
    first = dataset_mode(rule=SelectiveBackprop(selectivity=1.0, history=10))
    head = run(first, 6, 0)
    resumed = dataset_mode(rule=SelectiveBackprop(selectivity=1.0, history=10), seed=5)  # another seed: state decides
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    assert head + run(resumed, 9, 6) == whole


def test_bad_input_raises_naming_the_argument_and_changes_nothing():
    with pytest.raises(ValueError, match=r"k \(n_b\) = 9 exceeds the candidate batch size \(n_B\) = 8"):
        dataset_mode(rule=TopK(9))
    with pytest.raises(ValueError, match=r"irreducible must have one loss per training example \(30\), got 29"):
        dataset_mode(irreducible=np.zeros(29))
    with pytest.raises(ValueError, match=r"irreducible must be finite; irreducible\[2\] = nan"):
        ReducibleLoss([0.0, 1.0, np.nan])
    with pytest.raises(ValueError, match="irreducible must be a non-empty 1-D array"):
        ReducibleLoss(np.zeros((3, 2)))
    with pytest.raises(ValueError, match="k must be an integer >= 1, got 0"):
        TopK(0)
    with pytest.raises(ValueError, match="selectivity must be a finite number >= 0"):
        SelectiveBackprop(selectivity=-1)

    select = dataset_mode(rule=SelectiveBackprop(selectivity=1.0, history=10), irreducible=np.zeros(30))
    for step in range(5):
        candidates = select.next_candidates()
        select.choose(candidates, fake_losses(candidates.indices, step))
    candidates = select.next_candidates()
    before = copy.deepcopy(select.state_dict())
    bad_calls = [
        ((candidates, np.ones(7)), r"losses must have shape \(8,\), one per candidate, got \(7,\)"),
        ((candidates, np.ones((8, 1))), r"losses must be a non-empty 1-D array.*shape \(8, 1\)"),
        ((candidates, np.r_[np.ones(7), np.inf]), r"losses must be finite; losses\[7\] = inf"),
        ((candidates.indices, np.ones(8)), "candidates must be the SampledBatch"),
    ]
    for args, message in bad_calls:
        with pytest.raises((ValueError, TypeError), match=message):
            select.choose(*args)
        assert_same_state(select.state_dict(), before)
    with pytest.raises(ValueError, match=r"k \(n_b\) = 3 exceeds the candidate batch size \(n_B\) = 2"):
        Selector(TopK(3)).choose(np.ones(2))
    selector = Selector(TopK(2), ReducibleLoss(np.zeros(5)))
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 5\) of irreducible; indices\[1\] = 5"):
        selector.choose(np.ones(3), np.array([0, 5, 1]))
    with pytest.raises(ValueError, match="indices are needed"):
        selector.choose(np.ones(3))

    def refuse(selection):
        raise RuntimeError("the refresh failed")

    rule = SelectiveBackprop(history=4)
    selector = Selector(rule, seed=0)
    state = copy.deepcopy(selector.state_dict())
    with pytest.raises(RuntimeError):
        selector.choose(np.ones(3), before_commit=refuse)
    assert_same_state(selector.state_dict(), state)
    with pytest.raises(ValueError, match="checkpoint has rule"):
        Selector(TopK(2)).load_state_dict(state)


def test_buffer_mode_chooses_among_buffered_examples_and_feeds_every_score_back():
    buffer = ReplayBuffer(50, strategy=None, seed=0)
    buffer.add({"index": np.arange(50), "x": np.arange(50, dtype=float)})
    irreducible = np.linspace(0, 1, 50)
    select = BufferScoreThenSelect(buffer, Selector(TopK(4), ReducibleLoss(irreducible)), candidate_size=16)
    candidates = select.next_candidates()
    losses = candidates.data["x"] / 50
    selection = select.choose(candidates, losses, indices=candidates.data["index"])
    scores = losses - irreducible[candidates.data["index"]]
    assert selection.positions.tolist() == reference_top_k(scores.tolist(), 4)
    assert buffer.stats()["stale_feedback"] == 0 and (buffer.visits[candidates.ids % 50] > 0).all()
    with pytest.raises(ValueError, match=r"k \(n_b\) = 4 exceeds the candidate batch size \(n_B\) = 3"):
        BufferScoreThenSelect(buffer, Selector(TopK(4)), candidate_size=3)
    with pytest.raises(ValueError, match=r"candidate_size is not set"):
        BufferScoreThenSelect(buffer, Selector(TopK(4))).next_candidates()


def test_the_0_1_next_candidates_with_a_size_still_draws_that_pool_with_a_warning():
    buffer = ReplayBuffer(50, strategy=None, seed=0)
    buffer.add({"x": np.arange(50, dtype=float)})
    select = BufferScoreThenSelect(buffer, Selector(TopK(4)))
    with pytest.warns(DeprecationWarning, match=r"next_candidates\(candidate_size\) is deprecated"):
        assert len(select.next_candidates(16).ids) == 16


def test_buffer_mode_over_a_replay_data_loader_uses_its_batches_as_candidates():
    rng = np.random.default_rng(0)
    loader = ReplayDataLoader(lambda: {"x": rng.normal(size=(8, 2))}, ReplayBuffer(64, seed=0), batch_size=12,
                              steps=10)
    select = BufferScoreThenSelect(loader, Selector(Proportional(3), seed=0))
    chosen = 0
    for batch in loader:
        losses = np.abs(batch.data["x"]).sum(1)
        chosen += len(select.choose(batch, losses))
    assert chosen == 30 and loader.buffer.stats()["mean_visits"] > 0
    with pytest.raises(TypeError, match="target must be a ReplayDataLoader"):
        BufferScoreThenSelect(object(), Selector(TopK(1)))


def test_irreducible_losses_are_computed_once_saved_atomically_and_loaded(tmp_path):
    calls = []

    def train():
        calls.append("train")
        return 0.25

    path = tmp_path / "irreducible.npz"
    first = irreducible_losses(path, 4, train, lambda model: np.arange(4) * model)
    again = irreducible_losses(path, 4, train, lambda model: pytest.fail("must not rescore"))
    assert calls == ["train"] and first.losses.tolist() == again.losses.tolist() == [0.0, 0.25, 0.5, 0.75]
    assert again.train_cpu_s == first.train_cpu_s >= 0 and again.score_wall_s == first.score_wall_s >= 0
    assert isinstance(IrreducibleLosses.load(path), IrreducibleLosses)
    assert [p.name for p in tmp_path.iterdir()] == ["irreducible.npz"]  # no temporary file left
    with pytest.raises(ValueError, match="holds 4 irreducible losses, expected num_examples = 5"):
        irreducible_losses(path, 5, train, lambda model: np.zeros(5))
    with pytest.raises(ValueError, match=r"non-finite loss: losses\[1\] = nan"):
        irreducible_losses(tmp_path / "bad.npz", 2, train, lambda model: np.array([0.0, np.nan]))
    with pytest.raises(ValueError, match=r"shape \(3,\), got \(2,\)"):
        irreducible_losses(tmp_path / "short.npz", 3, train, lambda model: np.zeros(2))
    assert not (tmp_path / "bad.npz").exists() and not (tmp_path / "short.npz").exists()


def test_a_rejected_sampler_state_leaves_the_selector_as_it_was():
    select = dataset_mode(rule=SelectiveBackprop(history=10))
    candidates = select.next_candidates()
    select.choose(candidates, fake_losses(candidates.indices, 0))
    state = copy.deepcopy(select.state_dict())
    other = dataset_mode(n=31, rule=SelectiveBackprop(history=10))
    before = copy.deepcopy(other.state_dict())
    with pytest.raises(ValueError, match="num_examples"):
        other.load_state_dict(state)
    assert_same_state(other.state_dict(), before)


def test_the_short_last_batch_of_a_pass_gives_at_most_its_size():
    select = dataset_mode(n=20, n_big=8, rule=TopK(6))  # the warm-up pass: batches of 8, 8 and 4
    sizes = []
    for step in range(3):
        candidates = select.next_candidates()
        selection = select.choose(candidates, fake_losses(candidates.indices, step))
        sizes.append((len(candidates), len(selection)))
        assert selection.positions.tolist() == reference_top_k(selection.scores.tolist(), len(selection))
    assert sizes == [(8, 6), (8, 6), (4, 4)]


def split_rules():
    """(rule for the split selector with k = n_b, the same rule with k = n_b / S for one slice at a time)."""
    return st.sampled_from([
        lambda s: (TopK(2 * s), TopK(2)),
        lambda s: (Proportional(3 * s, alpha=0.7, beta=0.5), Proportional(3, alpha=0.7, beta=0.5)),
        lambda s: (SelectiveBackprop(selectivity=1.5, history=7), SelectiveBackprop(selectivity=1.5, history=7)),
    ])


@settings(max_examples=60, deadline=None)
@given(split_rules(), st.integers(1, 3), st.integers(1, 4), st.data())
def test_a_split_choice_is_one_choice_per_slice_in_order(make, slices, batches, data):
    """S slices with k = n_b equal S plain calls with k = n_b / S, one per slice, sharing generator and memory."""
    split_rule, slice_rule = make(slices)
    split, one = Selector(split_rule, seed=3), Selector(slice_rule, seed=3)
    for _ in range(batches):
        size = data.draw(st.integers(3, 6))
        losses = [data.draw(st.lists(st.integers(0, 9), min_size=size, max_size=size)) for _ in range(slices)]
        losses = [np.array(part, float) / 3 for part in losses]
        weights = [np.linspace(0.5, 1.0, size) * (s + 1) for s in range(slices)]
        indices = [np.arange(size) + 10 * s for s in range(slices)]
        got = split.choose_split(losses, indices, weights)
        expected = [one.choose(*part) for part in zip(losses, indices, weights)]
        for a, b in zip(got, expected):
            assert a.positions.tolist() == b.positions.tolist() and a.indices.tolist() == b.indices.tolist()
            assert a.weights.tolist() == b.weights.tolist() and a.scores.tolist() == b.scores.tolist()
        assert_same_state(split.rng_state, one.rng_state)
        assert_same_state(split.rule.state_dict(), one.rule.state_dict())
    assert split.stats()["batches"] == batches and split.stats()["selected"] == one.stats()["selected"]


def test_a_rejected_split_choice_names_the_slice_and_changes_nothing():
    selector = Selector(SelectiveBackprop(history=5), seed=0)
    selector.choose_split([np.ones(3), np.zeros(3)])
    before = copy.deepcopy(selector.state_dict())
    with pytest.raises(ValueError, match=r"slice 1 of 2 \(rank 1\): losses must be finite; losses\[0\] = nan"):
        selector.choose_split([np.ones(3), np.r_[np.nan, 1.0, 1.0]])
    assert_same_state(selector.state_dict(), before)

    def refuse(selections):
        raise RuntimeError("the refresh failed")

    with pytest.raises(RuntimeError):  # the first slice's history was committed for the second; rolled back
        selector.choose_split([np.full(3, 2.0), np.full(3, 4.0)], before_commit=refuse)
    assert_same_state(selector.state_dict(), before)
    with pytest.raises(ValueError, match=r"k \(n_b\) = 3 is not divisible by the 2 slices \(ranks\)"):
        Selector(TopK(3)).choose_split([np.ones(4), np.ones(4)])
    with pytest.raises(ValueError, match=r"k \(n_b\) = 4 exceeds the candidate batch size \(n_B\) = 2"):
        Selector(TopK(4)).choose_split([np.ones(1), np.ones(1)])
    with pytest.raises(ValueError, match=r"indices must hold one entry per slice \(2\), got 1"):
        Selector(TopK(2)).choose_split([np.ones(2), np.ones(2)], [np.arange(2)])


@pytest.mark.parametrize("bad", [{"version": 99}, {"rng": np.zeros(4, np.uint64)}, {"rng": np.ones(3, np.uint64)},
                                 {"counters": {"batches": -1}}, {"memory": None}, {"score": "reducible_loss"}])
def test_a_refused_selector_state_raises_invalid_state_and_changes_nothing(bad):
    """Selector loads go through the shared state checks (issue 33): the one error type every load raises."""
    from replayloader import InvalidState

    selector = Selector(SelectiveBackprop(selectivity=1.0, history=8), seed=0)
    selector.choose(np.linspace(0.0, 1.0, 16))
    before = selector.state_dict()
    state = {**before, **bad}
    if "memory" in bad:
        state.pop("memory")
    with pytest.raises(InvalidState):
        selector.load_state_dict(state)
    after = selector.state_dict()
    assert after["counters"] == before["counters"] and np.array_equal(after["rng"], before["rng"])
    assert np.array_equal(after["memory"]["recent"], before["memory"]["recent"])


def test_selective_backprops_1_0_beta_is_selectivity_now_with_a_deprecation_warning():
    """This library's ``beta`` is always the importance exponent: SelectiveBackprop's exponent (Jiang et al.'s β)
    is ``selectivity`` since 1.1. ``beta=`` and ``.beta`` warn for one release; a 1.0 checkpoint still loads."""
    with pytest.warns(DeprecationWarning, match=r"SelectiveBackprop\(beta=\.\.\.\) is deprecated .*use selectivity="):
        old = SelectiveBackprop(beta=2.0, history=8)
    assert old.config() == SelectiveBackprop(selectivity=2.0, history=8).config()
    with pytest.warns(DeprecationWarning, match=r"SelectiveBackprop\.beta is deprecated .*use \.selectivity"):
        assert old.beta == 2.0
    with pytest.raises(TypeError, match="both beta= and selectivity="):
        SelectiveBackprop(beta=2.0, selectivity=2.0)
    selector = Selector(SelectiveBackprop(selectivity=2.0, history=8), seed=0)
    selector.choose(np.linspace(0.0, 1.0, 6))
    state = selector.state_dict()
    state["rule"] = {("beta" if key == "selectivity" else key): value for key, value in state["rule"].items()}
    resumed = Selector(SelectiveBackprop(selectivity=2.0, history=8), seed=1)
    resumed.load_state_dict(state)  # written by 1.0
    assert resumed.choose(np.linspace(0.0, 1.0, 6)).positions.tolist() == \
        selector.choose(np.linspace(0.0, 1.0, 6)).positions.tolist()


class LoggingSelector:
    """A selector of a user's own, not a `Selector` subclass: it delegates to one and records each choice."""

    def __init__(self, inner):
        self.inner, self.choices = inner, []
        self.rule, self.score = inner.rule, inner.score

    def check_candidates(self, candidate_size, num_examples=None):
        self.inner.check_candidates(candidate_size, num_examples)

    def choose(self, losses, indices=None, candidate_weights=None, before_commit=None, short_batch=False):
        picked = self.inner.choose(losses, indices, candidate_weights, before_commit, short_batch)
        self.choices.append(picked.positions.tolist())
        return picked

    def choose_split(self, losses, indices=None, candidate_weights=None, before_commit=None, short_batch=False):
        return self.inner.choose_split(losses, indices, candidate_weights, before_commit, short_batch)

    def stats(self):
        return self.inner.stats()

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, state):
        self.inner.load_state_dict(state)


def test_a_selector_of_ones_own_is_taken_by_its_protocol_and_anything_else_is_named():
    from replayloader.selection import SelectorLike

    own = LoggingSelector(Selector(TopK(3), seed=0))
    assert isinstance(own, SelectorLike) and isinstance(Selector(TopK(3)), SelectorLike)
    select = ScoreThenSelect(PrioritizedSampler(40, 8, seed=0), own)
    candidates = select.next_candidates()
    losses = np.arange(8, dtype=np.float64)
    picked = select.choose(candidates, losses)
    assert own.choices == [picked.positions.tolist()] and sorted(picked.positions.tolist()) == [5, 6, 7]
    with pytest.raises(TypeError, match=r"selector must be a Selector \(or a SelectorLike: .*\), got TopK"):
        ScoreThenSelect(PrioritizedSampler(40, 8, seed=0), TopK(3))

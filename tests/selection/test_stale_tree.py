"""The stale reducible-loss tree (`ReducibleLossUpdate`, `ReducibleLossPrior`, `stale_reducible_sampler`,
`stale_rows`) against plain-numpy references: weights from the trained rows' losses, unseen rows at the prior,
the stalest rows first, exact resume, and bad input refused with the sampler unchanged."""
import copy

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from replayloader import InvalidState, PrioritizedSampler
from replayloader.selection import stale_reducible_sampler, stale_rows
from replayloader.strategies import LossValue, ReducibleLossPrior, ReducibleLossUpdate

from .helpers import assert_same_state, stream_of

N = 30
IRREDUCIBLE = np.round(np.linspace(0.1, 1.3, N) ** 1.5, 3)  # rows 24.. have an IL above the initial loss 0.69


def sampler(seed=0, floor=0.01, **options):
    return stale_reducible_sampler(IRREDUCIBLE, batch_size=6, initial_loss=0.69, floor=floor, seed=seed,
                                   **options)


def reference_weight(loss, il, floor):
    return max(loss - il, 0.0) + floor


def test_unseen_rows_start_at_the_prior_and_the_draws_follow_it_from_the_first_step():
    s = sampler()
    prior = [reference_weight(0.69, il, 0.01) for il in IRREDUCIBLE]
    np.testing.assert_allclose(s.weights, prior, rtol=0, atol=1e-15)
    assert not s.in_warmup and s.measured.sum() == 0
    counts = np.zeros(N)
    for _ in range(400):
        np.add.at(counts, s.next_batch().indices, 1)
    high = IRREDUCIBLE > 0.69  # implausible labels for the IL model: at the floor, rarely drawn
    share = s.weights[high].sum() / s.weights.sum()
    assert high.sum() == 13 and share < 0.05  # 13 of 30 rows, under 5% of the draws
    assert counts[high].sum() / counts.sum() < 2 * share and counts[~high].min() > 0


@settings(max_examples=50, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.lists(st.integers(0, N - 1), min_size=1, max_size=8),
                          st.lists(st.floats(0, 3), min_size=8, max_size=8)), min_size=1, max_size=6),
       st.sampled_from([0.01, 0.5]))
def test_feedback_sets_each_trained_rows_weight_to_its_reducible_loss_plus_the_floor(calls, floor):
    s = sampler(floor=floor)
    expected = s.weights.copy()
    last_fed = np.full(N, -1)
    drawn = s.next_batch()  # every index handed out once so plain-index feedback is accepted
    s.last_drawn_epoch[:] = 0
    for call, (indices, losses) in enumerate(calls):
        losses = np.array(losses[:len(indices)])
        s.feedback(np.array(indices), loss=losses)
        final = dict(zip(indices, losses))  # a repeated index counts once, its last value
        for i, loss in final.items():
            expected[i] = reference_weight(loss, IRREDUCIBLE[i], floor)
            last_fed[i] = call
    np.testing.assert_allclose(s.weights, expected, rtol=0, atol=1e-12)
    assert s.update_rule.last_fed.tolist() == last_fed.tolist() and len(drawn) == 6


def test_stale_rows_are_the_longest_unfed_first_among_rows_handed_out():
    s = sampler()
    steps = []
    for step in range(5):
        batch = s.next_batch()
        s.feedback(batch, loss=stream_of(batch.indices, step))
        steps.append(batch.indices)
    update = s.update_rule
    handed = np.flatnonzero(s.last_drawn_epoch >= 0)
    rank = np.argsort(np.random.default_rng(0).permutation(N))  # the fixed tie order of seed 0
    expected = sorted(handed, key=lambda i: (update.last_fed[i], rank[i]))
    assert stale_rows(s, 7).tolist() == expected[:7]
    assert stale_rows(s, 1000).tolist() == expected  # fewer if fewer qualify
    rows = stale_rows(s, 4)
    s.feedback(rows, loss=np.full(4, 2.0))  # the refresh: plain indices, always fresh
    np.testing.assert_allclose(s.weights[rows], [reference_weight(2.0, IRREDUCIBLE[i], 0.01) for i in rows])
    assert set(rows) & set(stale_rows(s, len(handed) - 4)) == set()  # just refreshed: now the freshest
    torch = pytest.importorskip("torch")
    from replayloader import PrioritizedBatchSampler
    assert stale_rows(PrioritizedBatchSampler(s), 3).tolist() == stale_rows(s, 3).tolist()
    assert torch is not None


def run(s, steps, start=0):
    out = []
    for step in range(start, start + steps):
        batch = s.next_batch()
        s.feedback(batch, loss=stream_of(batch.indices, step))
        if step % 4 == 3:
            rows = stale_rows(s, 5)
            s.feedback(rows, loss=stream_of(rows, -step))
        out.append((batch.indices.tolist(), batch.weights.tolist()))
    return out


def test_a_checkpoint_resumes_the_draws_refreshes_and_weights_exactly():
    whole_sampler = sampler(beta=0.5, uniform_fraction=0.1)
    whole = run(whole_sampler, 20)
    first = sampler(beta=0.5, uniform_fraction=0.1)
    head = run(first, 9)
    resumed = sampler(seed=4, beta=0.5, uniform_fraction=0.1)  # another seed: the state decides
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    assert head + run(resumed, 11, start=9) == whole
    assert_same_state(resumed.state_dict(), whole_sampler.state_dict())


@pytest.mark.parametrize("bad", [
    {"last_fed": np.full(N, 5)},  # must be < calls
    {"last_fed": np.zeros(3, np.int64)},
    {"calls": -1},
    {"irreducible_digest": "0" * 16},
])
def test_a_refused_update_state_raises_invalid_state_and_changes_nothing(bad):
    s = sampler()
    run(s, 3)
    state = copy.deepcopy(s.state_dict())
    state["update"] = {**state["update"], **bad}
    before = copy.deepcopy(s.state_dict())
    with pytest.raises(InvalidState):
        s.load_state_dict(state)
    assert_same_state(s.state_dict(), before)


@pytest.mark.parametrize("build, message", [
    (lambda: ReducibleLossUpdate(np.zeros(3), floor=0.0), "floor must be a finite number > 0.0, got 0.0"),
    (lambda: ReducibleLossUpdate([0.0, np.nan]), r"irreducible must be finite; irreducible\[1\] = nan"),
    (lambda: ReducibleLossUpdate(np.zeros((2, 2))), "irreducible must be a non-empty 1-D array"),
    (lambda: ReducibleLossUpdate(np.zeros(3), seed=-1), "seed must be an integer >= 0, got -1"),
    (lambda: PrioritizedSampler(4, 2, update=ReducibleLossUpdate(np.zeros(3))),
     r"irreducible must have one loss per dataset index \(4\), got 3"),
    (lambda: ReducibleLossPrior(initial_loss=float("inf")), "initial_loss must be a finite number, got inf"),
    (lambda: PrioritizedSampler(3, 2, init=ReducibleLossPrior(initial_loss=0.7), features=np.zeros((3, 2))),
     "ReducibleLossPrior reads one feature per row"),
    (lambda: PrioritizedSampler(3, 2, init=ReducibleLossPrior(initial_loss=0.7)), "is feature based: pass features="),
    (lambda: stale_reducible_sampler(np.zeros(3), batch_size=2, initial_loss=0.7, warmup_epochs=1),
     "stale_reducible_sampler sets warmup_epochs= itself"),
    (lambda: stale_rows(PrioritizedSampler(3, 2, update=LossValue()), 2), "needs a sampler whose update is a "
                                                                           "ReducibleLossUpdate, got LossValue"),
    (lambda: stale_rows(object(), 2), "sampler must be a PrioritizedSampler"),
    (lambda: stale_rows(sampler(), 0), "count must be an integer >= 1, got 0"),
])
def test_bad_input_is_refused_naming_the_argument(build, message):
    with pytest.raises((ValueError, TypeError), match=message):
        build()


def test_bad_feedback_leaves_the_tree_unchanged():
    s = sampler()
    run(s, 2)
    before = copy.deepcopy(s.state_dict())
    batch = s.next_batch()
    after_draw = copy.deepcopy(s.state_dict())
    for bad, message in [({"loss": np.r_[np.nan, np.ones(5)]}, "loss"), ({"loss": np.ones(3)}, r"shape \(6,\)"),
                         ({"weight": np.ones(6)}, "unknown feedback keyword 'weight'")]:
        with pytest.raises((ValueError, TypeError), match=message):
            s.feedback(batch, **bad)
        assert_same_state(s.state_dict(), after_draw)
    assert before["update"]["calls"] == after_draw["update"]["calls"] == 2

"""Built-in strategy parts, whose rules are Numba kernels, agree with user-defined parts written in plain numpy.

A user's own initializer, update or eviction has no kernel; the buffer calls it exactly as it calls the built-in
ones. Each test runs the same random add / sample / update sequence through both and requires identical ids,
samples, weights and trees; the plain versions below are written from the rules' definitions, as a user would.
The built-in parts also hand the buffer a fused compiled step (`fused_step`, `fused_place`); the buffer's generic
path (the part's own `compute` / `choose` between the buffer's kernels) must give the same results.
"""
import copy

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from replayloader import ReplayBuffer
from replayloader.kernels.rng import seed_state, uniforms
from replayloader.strategies import (FIFO, EvictLowest, GradBound, GradNorm, Initializer, LinUCB, LossDifference,
                                     LossValue, MaxWeight, MeanWeight, SetWeight, Strategy)

from .helpers import assert_state_equal


class PythonLossDifference(LossDifference):
    def compute(self, slots, values):
        previous = self.last_loss[slots]
        self.last_loss[slots] = values
        seen = ~np.isnan(previous)
        change = previous[seen] - values[seen]
        change = np.abs(change) if self.mode == "abs" else change
        return seen, np.maximum(change, self.floor)


class PythonGradNorm(GradNorm):
    def compute(self, slots, values):
        return np.ones(len(slots), bool), np.array([max(v, self.floor) for v in values])


class PythonFIFO(FIFO):
    def choose(self, tree, k):
        return np.array([(self.next_slot + j) % tree.capacity for j in range(k)], np.int64)


class PythonLowest(EvictLowest):
    def choose(self, tree, k):
        live = np.flatnonzero(np.isfinite(tree.get_keys(np.arange(tree.capacity))))
        keys = tree.get_keys(live)
        return live[np.lexsort((live, keys))[:k]]


class PythonMean(MeanWeight):
    def initial_weights(self, view, n, features):
        return np.full(n, view.mean_weight() if view.size else self.default)  # an array, not one number


def run(strategy, key, steps=40, capacity=24, seed=7):
    buf = ReplayBuffer(capacity, alpha=0.7, beta=0.5, strategy=strategy, seed=3)
    rng = np.random.default_rng(seed)
    trace = []
    for _ in range(steps):
        n = int(rng.integers(1, capacity // 2))
        ids = buf.add({"x": rng.integers(0, 50, (n, 3))})
        s = buf.sample(int(rng.integers(1, 16)))
        feedback = rng.uniform(0.0, 2.0, len(s.ids))
        feedback[rng.random(len(s.ids)) < 0.2] = 0.0
        changed = buf.feedback(s.ids, **{key: feedback})
        trace.append((ids, s.ids, s.probabilities, s.weights, s.data["x"], changed))
    return buf, trace


def assert_same_runs(a, b):
    (buf_a, trace_a), (buf_b, trace_b) = a, b
    for step_a, step_b in zip(trace_a, trace_b):
        for x, y in zip(step_a, step_b):
            np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(buf_a.weights, buf_b.weights)
    np.testing.assert_array_equal(buf_a.tree.nodes, buf_b.tree.nodes)
    assert buf_a.stats() == buf_b.stats()


@pytest.mark.parametrize("kernel,python,key", [
    (LossDifference(), PythonLossDifference(), "loss"),
    (LossDifference(mode="decrease", floor=0.05), PythonLossDifference(mode="decrease", floor=0.05), "loss"),
    (GradNorm(), PythonGradNorm(), "grad_norm"),
])
def test_update_rules_in_kernel_match_their_python_compute(kernel, python, key):
    assert_same_runs(run(Strategy(MeanWeight(), kernel, EvictLowest()), key),
                     run(Strategy(MeanWeight(), python, EvictLowest()), key))


@pytest.mark.parametrize("kernel,python", [(FIFO(), PythonFIFO()), (EvictLowest(), PythonLowest())])
def test_evictions_in_kernel_match_their_python_choose(kernel, python):
    assert_same_runs(run(Strategy(MaxWeight(), SetWeight(), kernel), "weight"),
                     run(Strategy(MaxWeight(), SetWeight(), python), "weight"))


def test_constant_initializer_matches_an_overridden_initial_weights():
    assert_same_runs(run(Strategy(MeanWeight(), LossDifference(), EvictLowest()), "loss"),
                     run(Strategy(PythonMean(), LossDifference(), EvictLowest()), "loss"))


def test_generator_is_seeded_uniform_and_restartable():
    state = seed_state(11)
    first = uniforms(state.copy(), 100_000)
    assert first.min() >= 0.0 and first.max() < 1.0
    assert abs(first.mean() - 0.5) < 0.005 and abs(first.var() - 1 / 12) < 0.002
    np.testing.assert_array_equal(first, uniforms(seed_state(11), 100_000))  # same seed, same stream
    assert not np.array_equal(first[:100], uniforms(seed_state(12), 100))
    resumed = state.copy()
    head = uniforms(resumed, 40_000)  # advancing the state in place continues the same stream
    np.testing.assert_array_equal(np.concatenate([head, uniforms(resumed, 60_000)]), first)


def test_an_update_that_transforms_its_feedback_is_not_bypassed():
    class SquaredLoss(LossValue):
        def values(self, feedback):
            return feedback["loss"] ** 2

    class CountingLossDifference(LossDifference):
        def on_add(self, slots):
            super().on_add(slots)
            self.forgotten = getattr(self, "forgotten", 0) + len(slots)

    buf = ReplayBuffer(4, strategy=Strategy(MeanWeight(), SquaredLoss(), FIFO()), seed=0)
    ids = buf.add({"x": np.zeros((4, 1))})
    buf.feedback(ids, loss=np.array([1.0, 2.0, 3.0, 0.5]))
    np.testing.assert_allclose(buf.weights, [1.0, 4.0, 9.0, 0.25])
    counting = CountingLossDifference()
    buf = ReplayBuffer(4, strategy=Strategy(MeanWeight(), counting, FIFO()), seed=0)
    buf.add({"x": np.zeros((3, 1))})
    buf.add({"x": np.zeros((2, 1))})
    assert counting.forgotten == 5


# ---------------------------------------------------------------- fused steps against the generic path
def unfused(part):
    """The same part with its fused steps switched off: the buffer then runs the generic path."""
    hooks = [hook for hook in ("fused_step", "fused_on_add", "fused_place") if hasattr(part, hook)]
    cls = type(f"Unfused{type(part).__name__}", (type(part),), {hook: lambda self: None for hook in hooks})
    twin = copy.deepcopy(part)
    twin.__class__ = cls
    return twin


BUILT_IN_UPDATES = [  # (part, keyword); every built-in rule, with and without a floor that bites
    (LossDifference(), "loss"), (LossDifference(mode="decrease", floor=0.3), "loss"), (LossValue(floor=0.5), "loss"),
    (GradNorm(), "grad_norm"), (GradBound(), "grad_bound"), (SetWeight(), "weight"), (SetWeight(floor=0.2), "weight"),
]


def test_built_in_parts_offer_a_fused_step_and_a_part_with_its_own_rule_does_not():
    for part, _ in BUILT_IN_UPDATES:
        assert part.fused_step() is not None
    assert FIFO().fused_place() is not None and EvictLowest().fused_place() is not None
    assert PythonLossDifference().fused_step() is None and PythonGradNorm().fused_step() is None
    assert PythonFIFO().fused_place() is None and PythonLowest().fused_place() is None

    class OwnStep(PythonGradNorm):  # a subclass may bring its rule and a step for it together
        def fused_step(self):
            return GradNorm.fused_step(self)

    assert OwnStep().fused_step() is not None

    class Forgetful(LossDifference):  # its own on_add is called, not replaced by the add kernel's forgetting
        def on_add(self, slots):
            super().on_add(slots)

    assert LossDifference().fused_on_add() is not None and Forgetful().fused_on_add() is None
    assert Forgetful().fused_step() is not None  # compute is still the parent's


def feedback_steps(capacity):
    """Random rounds of (add size, sample size, stale ids to mix in, duplicates to mix in, values, bad position)."""
    return st.lists(st.tuples(
        st.integers(1, capacity), st.integers(1, 2 * capacity), st.integers(0, 3), st.integers(0, 3),
        st.lists(st.floats(0.0, 3.0), min_size=4 * capacity + 6, max_size=4 * capacity + 6),
        st.sampled_from([None, None, None, np.nan, -1.0, np.inf]), st.integers(0, 10**6)), min_size=1, max_size=8)


def run_feedback(buf, key, rounds):
    """Drive a buffer through `rounds`; returns what every call gave (ids, samples, counts, or the error)."""
    trace, issued = [], []
    for n, k, n_stale, n_dup, values, bad_value, pick in rounds:
        issued.extend(buf.add({"x": np.full((n, 1), float(len(issued)))}).tolist())
        sample = buf.sample(k)
        ids = np.concatenate([sample.ids, np.array(issued[:n_stale], np.int64), sample.ids[:n_dup]])
        ids = np.random.default_rng(pick).permutation(ids)
        feedback = np.array(values[:len(ids)])
        if bad_value is not None:
            feedback[pick % len(ids)] = bad_value
        before = copy.deepcopy(buf.state_dict())
        try:
            trace.append((sample.ids, sample.probabilities, sample.weights, buf.feedback(ids, **{key: feedback})))
        except ValueError as error:
            trace.append(str(error))
            assert_state_equal(buf.state_dict(), before)  # a refused update writes nothing
    return trace


@pytest.mark.parametrize("part,key", BUILT_IN_UPDATES, ids=lambda p: getattr(p, "name", p))
@settings(max_examples=25, deadline=None)
@given(rounds=feedback_steps(capacity=6), alpha=st.sampled_from([1.0, 0.5]))
def test_fused_update_steps_match_the_generic_path(part, key, rounds, alpha):
    bufs = [ReplayBuffer(6, alpha=alpha, beta=0.5, strategy=Strategy(MeanWeight(), p, EvictLowest()), seed=1)
            for p in (copy.deepcopy(part), unfused(part))]
    traces = [run_feedback(buf, key, rounds) for buf in bufs]
    assert_state_equal(traces[0], traces[1])
    assert_state_equal(bufs[0].state_dict(), bufs[1].state_dict())
    np.testing.assert_array_equal(bufs[0].tree.nodes, bufs[1].tree.nodes)


@pytest.mark.parametrize("evict", [FIFO(), EvictLowest()], ids=lambda e: e.name)
@settings(max_examples=15, deadline=None)
@given(rounds=feedback_steps(capacity=5))
def test_fused_placements_match_the_generic_path(evict, rounds):
    bufs = [ReplayBuffer(5, beta=0.5, strategy=Strategy(MaxWeight(), SetWeight(), e), seed=2)
            for e in (copy.deepcopy(evict), unfused(evict))]
    traces = [run_feedback(buf, "weight", rounds) for buf in bufs]
    assert_state_equal(traces[0], traces[1])
    assert_state_equal(bufs[0].state_dict(), bufs[1].state_dict())


def test_grad_bound_from_logits_takes_the_fused_step_with_the_same_result():
    rng = np.random.default_rng(5)
    bufs = [ReplayBuffer(8, strategy=Strategy(MeanWeight(), p, FIFO()), seed=0) for p in (GradBound(),
                                                                                           unfused(GradBound()))]
    for _ in range(4):
        for buf in bufs:
            buf.add({"x": np.zeros((3, 1))})
        ids = [buf.sample(6).ids for buf in bufs]
        np.testing.assert_array_equal(ids[0], ids[1])
        logits, targets = rng.normal(size=(6, 4, 5)), rng.integers(0, 5, (6, 4))
        changed = [buf.feedback(i, logits=logits, targets=targets) for buf, i in zip(bufs, ids)]
        assert changed[0] == changed[1] > 0
    assert_state_equal(bufs[0].state_dict(), bufs[1].state_dict())


def test_a_user_part_without_any_kernel_still_works():
    class HalfLoss(LossValue):  # its own rule in numpy: no fused step, so the buffer calls compute
        def compute(self, slots, values):
            return values > 0.1, values[values > 0.1] / 2

    class Counting(MeanWeight):  # hooks the base leaves as no-ops are called once overridden
        observed = refreshed = 0

        def observe(self, view, slots, weights):
            self.observed += len(slots)

        def refresh(self, view):
            self.refreshed += 1

    init = Counting()
    buf = ReplayBuffer(4, strategy=Strategy(init, HalfLoss(), PythonFIFO()), seed=0)
    ids = buf.add({"x": np.zeros((4, 1))})
    assert buf.feedback(ids, loss=np.array([1.0, 0.05, 0.4, 2.0])) == 3
    np.testing.assert_allclose(buf.weights, [0.5, 1.0, 0.2, 1.0])
    assert (init.observed, init.refreshed) == (3, 1)
    buf.add({"x": np.ones((2, 1))})
    assert buf.strategy.evict.next_slot == 2 and buf.visits.tolist() == [0, 0, 1, 1]
    assert Initializer.observes is False and Counting.observes and Counting.refreshes
    assert MaxWeight.observes and not MaxWeight.refreshes and LinUCB.refreshes and not MeanWeight.observes

"""Built-in strategy parts, whose rules are Numba kernels, agree with user-defined parts written in plain numpy.

A user's own initializer, update or eviction has no kernel; the buffer calls it exactly as it calls the built-in
ones. Each test runs the same random add / sample / update sequence through both and requires identical ids,
samples, weights and trees; the plain versions below are written from the rules' definitions, as a user would.
"""
import numpy as np
import pytest

from replayloader import ReplayBuffer
from replayloader.kernels.rng import seed_state, uniforms
from replayloader.strategies import (FIFO, EvictLowest, GradNorm, LossDifference, LossValue, MaxWeight, MeanWeight,
                                     SetWeight, Strategy)


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
        changed = buf.update(s.ids, **{key: feedback})
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
    buf.update(ids, loss=np.array([1.0, 2.0, 3.0, 0.5]))
    np.testing.assert_allclose(buf.weights, [1.0, 4.0, 9.0, 0.25])
    counting = CountingLossDifference()
    buf = ReplayBuffer(4, strategy=Strategy(MeanWeight(), counting, FIFO()), seed=0)
    buf.add({"x": np.zeros((3, 1))})
    buf.add({"x": np.zeros((2, 1))})
    assert counting.forgotten == 5

"""ReplayBuffer: ids and generations, eviction, validation that leaves the buffer untouched."""
import copy

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from replayloader import ReplayBuffer
from replayloader.strategies import EvictLowest, FIFO, MeanWeight, SetWeight, Strategy

from .helpers import assert_state_equal


def set_weight_buffer(capacity=8, evict=None, **kw):
    return ReplayBuffer(capacity, seed=0, strategy=Strategy(MeanWeight(), SetWeight(), evict or EvictLowest()), **kw)


def batch(n, start=0):
    return {"tokens": np.arange(start, start + n, dtype=np.int64)[:, None].repeat(3, 1),
            "label": np.arange(start, start + n, dtype=np.float32)}


def test_add_sample_roundtrip_keeps_rows_together():
    buf = set_weight_buffer(16)
    buf.add(batch(10))
    s = buf.sample(32)
    np.testing.assert_array_equal(s.data["tokens"][:, 0], s.data["label"].astype(np.int64))
    assert s.data["tokens"].dtype == np.int64 and s.data["label"].dtype == np.float32


def test_stale_feedback_is_ignored_and_counted():
    buf = set_weight_buffer(4, evict=FIFO())
    ids = buf.add(batch(4))
    sampled = buf.sample(4).ids
    buf.add(batch(2, start=100))  # FIFO overwrites slots 0 and 1
    before = buf.weights.copy()
    applied = buf.feedback(sampled, weight=np.full(4, 9.0))
    stale = np.isin(sampled % 4, [0, 1])
    assert applied == len(np.unique(sampled[~stale]))
    assert buf.stats()["stale_feedback"] == stale.sum()
    np.testing.assert_array_equal(buf.weights[[0, 1]], before[[0, 1]])  # the new examples kept their weights
    assert not np.isin(ids[:2], buf.sample(64).ids).any()


def test_evict_lowest_replaces_lowest_weights_among_old_examples():
    buf = set_weight_buffer(5)
    ids = buf.add(batch(5))
    buf.feedback(ids, weight=np.array([5.0, 0.5, 3.0, 0.1, 4.0]))
    new_ids = buf.add(batch(2, start=10))
    assert sorted((new_ids % 5).tolist()) == [1, 3]
    # mean weight of the 5 before the add: (5 + .5 + 3 + .1 + 4) / 5
    np.testing.assert_allclose(buf.weights[[1, 3]], 12.6 / 5)
    # a batch as large as the buffer evicts every old example, never its own
    newest = buf.add(batch(5, start=50))
    assert sorted((newest % 5).tolist()) == [0, 1, 2, 3, 4]


def test_duplicate_ids_in_one_update_last_value_wins():
    buf = set_weight_buffer(4)
    ids = buf.add(batch(4))
    buf.feedback(np.array([ids[1], ids[2], ids[1]]), weight=np.array([1.0, 2.0, 3.0]))
    assert buf.weights[1] == 3.0 and buf.weights[2] == 2.0


def test_torch_tensors_stay_on_their_device():
    torch = pytest.importorskip("torch")
    buf = set_weight_buffer(8)
    buf.add({"x": torch.arange(6).reshape(3, 2), "y": torch.ones(3, dtype=torch.bfloat16)})
    s = buf.sample(5)
    assert isinstance(s.data["x"], torch.Tensor) and s.data["y"].dtype == torch.bfloat16
    assert (s.data["x"][:, 1] == s.data["x"][:, 0] + 1).all()
    buf.feedback(s.ids, weight=torch.rand(5))


BAD_CALLS = {  # name -> (call(buffer, ids sampled before the snapshot), error, message pattern)
    "capacity": (lambda b, ids: ReplayBuffer(0), ValueError, "capacity"),
    "alpha": (lambda b, ids: ReplayBuffer(4, alpha=-1), ValueError, "alpha"),
    "empty batch": (lambda b, ids: b.add({"tokens": np.zeros((0, 3), np.int64), "label": np.zeros(0, np.float32)}),
                    ValueError, "at least one example"),
    "field names": (lambda b, ids: b.add({"tokens": np.zeros((2, 3), np.int64)}), ValueError, "fields"),
    "shape": (lambda b, ids: b.add({"tokens": np.zeros((2, 4), np.int64), "label": np.zeros(2, np.float32)}),
              ValueError, r"batch\['tokens'\]"),
    "dtype": (lambda b, ids: b.add({"tokens": np.zeros((2, 3), np.int32), "label": np.zeros(2, np.float32)}),
              ValueError, "int32"),
    "ragged batch": (lambda b, ids: b.add({"tokens": np.zeros((2, 3), np.int64), "label": np.zeros(3, np.float32)}),
                     ValueError, "examples"),
    "too large": (lambda b, ids: b.add(batch(9)), ValueError, "capacity 8"),
    "k=0": (lambda b, ids: b.sample(0), ValueError, "k must be"),
    "nan weight": (lambda b, ids: b.feedback(ids, weight=np.array([1.0, np.nan, 1.0])), ValueError,
                   r"weight\[1\] = nan"),
    "inf weight": (lambda b, ids: b.feedback(ids, weight=np.array([np.inf, 1.0, 1.0])), ValueError,
                   r"weight\[0\] = inf"),
    "negative weight": (lambda b, ids: b.feedback(ids, weight=np.array([1.0, 1.0, -2.0])), ValueError,
                        r"weight\[2\] = -2"),
    "never issued": (lambda b, ids: b.feedback(np.array([0, 10**9]), weight=np.ones(2)), ValueError, "never issued"),
    "negative id": (lambda b, ids: b.feedback(np.array([-1]), weight=np.ones(1)), ValueError, "never issued"),
    "huge id": (lambda b, ids: b.feedback(np.array([0, 2**63 - 1]), weight=np.ones(2)), ValueError, r"ids\[1\]"),
    "next id": (lambda b, ids: b.feedback(np.array([6 * 8]), weight=np.ones(1)), ValueError, "never issued"),
    "wrong slot": (lambda b, ids: b.feedback(np.array([5 * 8 + 6]), weight=np.ones(1)), ValueError, "never issued"),
    "wrong length": (lambda b, ids: b.feedback(ids, weight=np.ones(2)), ValueError, r"shape \(3,\)"),
    "another update's keyword": (lambda b, ids: b.feedback(ids, loss=np.ones(3)), TypeError,
                                 r"unknown feedback keyword 'loss' for SetWeight; accepted: \['weight'\]"),
    "typo keyword": (lambda b, ids: b.feedback(ids, wieght=np.ones(3)), TypeError, "'wieght'.*accepted"),
    "missing keyword": (lambda b, ids: b.feedback(ids), TypeError, "needs the keyword 'weight'"),
    "no ids": (lambda b, ids: b.feedback(np.array([], np.int64), weight=np.ones(0)), ValueError, "non-empty"),
    "float ids": (lambda b, ids: b.feedback(ids.astype(float), weight=np.ones(3)), ValueError, "integer"),
}


@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_bad_input_raises_clearly_and_changes_nothing(name):
    call, error, message = BAD_CALLS[name]
    buf = set_weight_buffer(8)
    buf.add(batch(6))
    ids = buf.sample(3).ids
    before = copy.deepcopy(buf.state_dict())
    with pytest.raises(error, match=message):
        call(buf, ids)
    assert_state_equal(buf.state_dict(), before)


def test_sampling_an_empty_buffer_is_an_error():
    with pytest.raises(ValueError, match="empty buffer"):
        set_weight_buffer(4).sample(1)


class ReferenceBuffer:
    """Plain-Python model of SetWeight + EvictLowest semantics."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.slots = {}  # slot -> (serial, weight)
        self.serial = 0

    def add(self, n, slots_taken):
        """Check the buffer's slot choice (free slots in order, then victims among the lowest weights) and apply it.

        Equal weights may differ in the last bit between the buffer's running mean and np.mean, so victims are
        compared by weight (with a tolerance), not by slot.
        """
        mean = np.mean([w for _, w in self.slots.values()]) if self.slots else 1.0
        free = [s for s in range(self.capacity) if s not in self.slots][:n]
        assert list(slots_taken[: len(free)]) == free
        victims = list(slots_taken[len(free):])
        lowest = sorted(w for _, w in self.slots.values())[: len(victims)]
        np.testing.assert_allclose(sorted(self.slots[v][1] for v in victims), lowest, rtol=1e-9, atol=1e-12)
        out = []
        for s in free + victims:
            self.slots[s] = (self.serial, mean)
            out.append(self.serial * self.capacity + s)
            self.serial += 1
        return out

    def update(self, ids, weights):
        for i, w in zip(ids, weights):
            s = i % self.capacity
            if self.slots[s][0] == i // self.capacity:
                self.slots[s] = (self.slots[s][0], w)


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 24), data=st.data())
def test_random_add_update_sample_sequences_match_reference(capacity, data):
    buf, ref = set_weight_buffer(capacity), ReferenceBuffer(capacity)
    issued, largest = [], 1.0
    for _ in range(data.draw(st.integers(1, 15))):
        op = data.draw(st.sampled_from(["add", "update", "sample"]))
        if op == "add" or not issued:
            n = data.draw(st.integers(1, capacity))
            ids = buf.add(batch(n))
            assert ids.tolist() == ref.add(n, ids % capacity)
            issued.extend(ids.tolist())
        elif op == "update":
            ids = data.draw(st.lists(st.sampled_from(issued), min_size=1, max_size=10))
            w = data.draw(st.lists(st.floats(0, 100), min_size=len(ids), max_size=len(ids)))
            buf.feedback(np.array(ids), weight=np.array(w))
            ref.update(ids, w)
            largest = max(largest, *w)
        else:
            s = buf.sample(data.draw(st.integers(1, 20)))
            slots = s.ids % capacity
            live = {sl: w for sl, (_, w) in ref.slots.items()}
            assert all(sl in live for sl in slots)
            if sum(live.values()) > 0:
                assert all(live[sl] > 0 for sl in slots)
        want = np.array([ref.slots[s][1] for s in range(len(buf))])
        # the running sum behind the mean is exact up to rounding relative to the largest weight it has held
        np.testing.assert_allclose(buf.weights[: len(buf)], want, rtol=1e-9, atol=1e-12 * largest)
        assert buf.tree.total == pytest.approx(buf.weights[: len(buf)].sum(), rel=1e-12, abs=1e-300)
        np.testing.assert_allclose(buf.mean_weight(), want.mean(), rtol=1e-9, atol=1e-12 * largest)


class _FixedVictims(FIFO):
    """A user eviction that returns whatever it was given (to check the buffer's guard on victims)."""

    def __init__(self, victims):
        super().__init__()
        self.victims = victims

    def choose(self, tree, k):
        return np.array(self.victims[:k], np.int64)


@pytest.mark.parametrize("victims", [[1, 1], [0, 9], [-1, 0], [0]])  # repeated, out of range, negative, too few
def test_a_user_eviction_that_returns_bad_slots_is_refused_and_changes_nothing(victims):
    buf = ReplayBuffer(4, strategy=Strategy(MeanWeight(), SetWeight(), _FixedVictims(victims)), seed=0)
    buf.add({"x": np.arange(4.0)[:, None]})
    before = copy.deepcopy(buf.state_dict())
    with pytest.raises(ValueError, match="eviction 'fifo' chose"):
        buf.add({"x": np.zeros((2, 1))})
    assert_state_equal(buf.state_dict(), before)
    assert buf.strategy.evict.next_slot == 0  # nothing committed


class _WritingEviction(EvictLowest):
    """A user eviction that tries to change the tree it was shown, one way or another."""

    def __init__(self, how):
        super().__init__()
        self.how = how

    def choose(self, tree, k):
        if self.how == "array":
            tree.keys[tree.n_leaves] = 0.0
        elif self.how == "nodes":
            tree.nodes[1, 0] = 0.0
        else:
            tree.pop_min(k)
        return tree.lowest(k)


@pytest.mark.parametrize("how, error, message", [
    ("array", ValueError, "read-only"), ("nodes", ValueError, "read-only"),
    ("method", AttributeError, "SumTree.pop_min is not available to an eviction: it sees the buffer's tree read-only"),
])
def test_an_eviction_sees_the_tree_read_only_and_a_write_changes_nothing(how, error, message):
    buf = ReplayBuffer(4, strategy=Strategy(MeanWeight(), SetWeight(), _WritingEviction(how)), seed=0)
    ids = buf.add({"x": np.arange(4.0)[:, None]})
    buf.feedback(ids, weight=np.array([3.0, 1.0, 2.0, 4.0]))
    before = copy.deepcopy(buf.state_dict())
    with pytest.raises(error, match=message):
        buf.add({"x": np.zeros((2, 1))})
    assert_state_equal(buf.state_dict(), before)
    np.testing.assert_array_equal(buf.tree.get_keys(np.arange(4)), [3.0, 1.0, 2.0, 4.0])


def test_an_eviction_reads_what_it_needs_through_the_view():
    class ReadEverything(EvictLowest):
        def choose(self, tree, k):
            keys = tree.get_keys(np.arange(tree.capacity))
            assert tree.argmin() == int(np.argmin(keys)) and tree.min_key() == keys.min()
            assert tree.total == pytest.approx(tree.get(np.arange(tree.capacity)).sum())
            assert not tree.keys.flags.writeable
            return tree.lowest(k)

    buf = ReplayBuffer(4, beta=0.5, strategy=Strategy(MeanWeight(), SetWeight(), ReadEverything()), seed=0)
    ids = buf.add({"x": np.arange(4.0)[:, None]})
    buf.feedback(ids, weight=np.array([3.0, 1.0, 2.0, 4.0]))
    new = buf.add({"x": np.zeros((2, 1))})
    assert sorted(new % 4) == [1, 2]  # the two lowest weights were overwritten


def test_beta_anneals_on_a_schedule_of_the_sample_calls_and_resumes_exactly():
    """ReplayBuffer takes a β schedule as PrioritizedSampler does (issue 33; the project's own PER experiment had
    annealed β by hand): β = the schedule at the number of samples drawn so far, checkpointed with them."""
    from replayloader import InvalidState, LinearSchedule
    from replayloader.strategies import by_name

    def make(steps=4):
        return ReplayBuffer(16, alpha=1.0, beta=LinearSchedule(0.0, 1.0, steps=steps), strategy=by_name("per"),
                            seed=0)

    buffer = make()
    buffer.add({"x": np.arange(16.0)[:, None]})
    buffer.feedback(buffer.sample(64).ids, weight=np.ones(64))  # one call, β 0: every weight 1
    ids = np.unique(buffer.sample(64).ids)
    buffer.feedback(ids, weight=1.0 + ids % 4.0)  # two calls so far
    betas = []
    for _ in range(4):
        betas.append(buffer.current_beta())
        sample = buffer.sample(32)
        stored = buffer.state_dict()["weights"]
        w_min = stored[stored > 0].min()
        slot_weight = sample.probabilities * stored.sum()  # alpha 1: P_i = w_i / sum
        np.testing.assert_allclose(sample.weights, (w_min / slot_weight) ** betas[-1], rtol=1e-9)
    assert betas == [0.5, 0.75, 1.0, 1.0]
    state = buffer.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    assert resumed.current_beta() == buffer.current_beta() == 1.0
    with pytest.raises(InvalidState, match="beta"):  # another schedule is another configuration
        make(steps=5).load_state_dict(state)

"""SumTree against a plain-numpy reference: totals, minima, argmin, valid positive samples."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from replayloader.sumtree import SumTree

finite_weights = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)


class ReferenceTree:
    def __init__(self, capacity):
        self.p = np.zeros(capacity)
        self.k = np.full(capacity, np.inf)

    def set(self, slots, prios, keys):
        for s, p, k in zip(slots, prios, keys):  # in order: last write wins
            self.p[s], self.k[s] = p, k

    def pop_min(self, n):
        out = []
        for _ in range(n):
            s = int(np.argmin(self.k))  # np.argmin returns the first (lowest) index among ties
            out.append(s)
            self.p[s], self.k[s] = 0.0, np.inf
        return np.array(out)


KERNELS = ["levels", "walks"]  # every test of the tree runs on both write kernels


@pytest.mark.parametrize("kernels", KERNELS)
@settings(max_examples=150, deadline=None)
@given(capacity=st.integers(1, 70), data=st.data())
def test_random_operation_sequences_match_reference(kernels, capacity, data):
    tree, ref = SumTree(capacity, kernels=kernels), ReferenceTree(capacity)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    for _ in range(data.draw(st.integers(1, 12))):
        op = data.draw(st.sampled_from(["set", "set", "pop", "replace", "sample"]))
        if op == "set":
            n = data.draw(st.integers(1, 2 * capacity))
            slots = np.array(data.draw(st.lists(st.integers(0, capacity - 1), min_size=n, max_size=n)))
            prios = np.array(data.draw(st.lists(finite_weights, min_size=n, max_size=n)))
            keys = prios + rng.random(n)
            tree.set(slots, prios, keys)
            ref.set(slots, prios, keys)
        elif op == "pop":
            n = data.draw(st.integers(0, int(np.isfinite(ref.k).sum())))
            np.testing.assert_array_equal(tree.pop_min(n), ref.pop_min(n))
        elif op == "replace":  # evict-then-write: the n lowest keys get new values, in one pass
            n = data.draw(st.integers(0, int(np.isfinite(ref.k).sum())))
            prios = np.array(data.draw(st.lists(finite_weights, min_size=n, max_size=n)))
            victims = ref.pop_min(n)
            ref.set(victims, prios, prios)
            np.testing.assert_array_equal(tree.replace_min(n, prios), victims)
        elif ref.p.sum() > 0:
            slots = tree.sample(rng.random(64), stratified=data.draw(st.booleans()))
            assert slots.min() >= 0 and slots.max() < capacity
            assert (ref.p[slots] > 0).all()
        assert tree.total == pytest.approx(ref.p.sum(), rel=1e-12, abs=1e-300)
        positive = ref.p[ref.p > 0]
        assert tree.min_priority() == (positive.min() if len(positive) else np.inf)
        assert tree.min_key() == ref.k.min()
        if np.isfinite(ref.k).any():
            assert tree.argmin() == int(np.argmin(ref.k))
        np.testing.assert_array_equal(tree.get(np.arange(capacity)), ref.p)
        assert_parents_are_children_recomputed(tree)


def assert_parents_are_children_recomputed(tree):
    """Every internal node holds exactly (bit for bit) what its children give: sums added, minima taken."""
    p = tree.n_leaves
    for column, combine in ((tree.sums, np.add), (tree.raw, np.add), (tree.minp, np.minimum),
                            (tree.keys, np.minimum)):
        if column.shape[0]:
            np.testing.assert_array_equal(column[1:p], combine(column[2:2 * p:2], column[3:2 * p:2]))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("columns", [(True, True, True), (True, False, False), (False, False, False),
                                     (False, True, False)])
@settings(max_examples=60, deadline=None, derandomize=True)
@given(capacity=st.integers(1, 3000), data=st.data())
def test_write_kernels_give_bit_identical_trees_and_draws(dtype, columns, capacity, data):
    # The level-by-level writes ("levels") against the original walk-by-walk ones ("walks") and a numpy
    # reference: the same node values bit for bit after every batch (K from 1 to past the leaf count, so both
    # regimes of each ascent run, duplicates included), the same leaf for every uniform, exact totals.
    min_priority, min_key, raw_sum = columns
    trees = [SumTree(capacity, dtype, min_priority=min_priority, min_key=min_key, raw_sum=raw_sum, kernels=name)
             for name in KERNELS]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    leaves = np.zeros(capacity, dtype)
    for _ in range(data.draw(st.integers(1, 6))):
        k = data.draw(st.sampled_from([1, 2, 7, 64, 300, 2 * capacity]))
        slots = rng.integers(0, capacity, k)
        prios = (rng.random(k) * 10.0 ** rng.integers(-6, 6, k)).astype(dtype)
        prios[rng.random(k) < 0.2] = 0.0
        for tree in trees:
            tree.set(slots, prios, prios + 1, prios * 2)
        for s, v in zip(slots, prios):
            leaves[s] = v
        np.testing.assert_array_equal(trees[0].nodes, trees[1].nodes)
        np.testing.assert_array_equal(trees[0].get(np.arange(capacity)), leaves)
        assert_parents_are_children_recomputed(trees[0])
        if leaves.sum() > 0:
            u = rng.random(256)
            for stratified in (True, False):
                drawn = trees[0].sample(u, stratified)
                np.testing.assert_array_equal(drawn, trees[1].sample(u, stratified))
                assert (leaves[drawn] > 0).all()


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_edges_never_return_zero_or_out_of_range_leaves(dtype, kernels):
    # Mass concentrated at the ends with zeros between, and uniforms at the very edge of [0, 1).
    tree = SumTree(1000, dtype, kernels=kernels)
    prios = np.zeros(1000)
    prios[[0, 3, 998]] = [1e-30, 1.0, 1e-7]
    tree.set(np.arange(1000), prios)
    edge = np.array([0.0, np.nextafter(1.0, 0.0), 1.0 - 1e-17, 0.5, 0.999999999])
    for stratified in (True, False):
        slots = tree.sample(np.resize(edge, 64), stratified=stratified)
        assert set(slots.tolist()) <= {0, 3, 998}
    # capacity not a power of two: the padding leaves past the end must never be returned
    tree = SumTree(5, dtype, kernels=kernels)
    tree.set(np.arange(5), np.array([0.0, 0.0, 0.0, 0.0, 1e-3]))
    assert (tree.sample(np.array([np.nextafter(1.0, 0.0)] * 8)) == 4).all()


@pytest.mark.parametrize("kernels", KERNELS)
def test_duplicate_slots_last_write_wins(kernels):
    tree = SumTree(8, kernels=kernels)
    tree.set(np.array([2, 5, 2, 2]), np.array([1.0, 2.0, 3.0, 7.0]))
    assert tree.get(np.array([2, 5])).tolist() == [7.0, 2.0]
    assert tree.total == 9.0


@pytest.mark.parametrize("kernels", KERNELS)
def test_parents_recomputed_without_drift(kernels):
    # Delta-updated trees accumulate error; recomputing from children must give the exact sum of the leaves.
    rng = np.random.default_rng(0)
    tree = SumTree(4096, kernels=kernels)
    leaves = np.zeros(4096)
    for _ in range(2000):
        slots = rng.integers(0, 4096, 64)
        prios = rng.random(64) * 10.0 ** rng.integers(-8, 8, 64)
        tree.set(slots, prios)
        leaves[slots] = prios
    assert_parents_are_children_recomputed(tree)
    tree.set(np.arange(4096), np.zeros(4096))
    assert tree.total == 0.0
    assert tree.min_priority() == np.inf


@pytest.mark.parametrize("kernels", KERNELS)
def test_pop_min_breaks_ties_by_lowest_slot_and_skips_empty(kernels):
    tree = SumTree(6, kernels=kernels)
    tree.set(np.arange(4), np.array([2.0, 1.0, 1.0, 3.0]))
    assert tree.pop_min(3).tolist() == [1, 2, 0]
    assert tree.argmin() == 3


def test_untracked_columns_are_not_stored_and_say_so():
    tree = SumTree(8, min_priority=False, min_key=False, raw_sum=False)
    assert tree.sums.shape == (16,) and tree.keys.shape == tree.minp.shape == tree.raw.shape == (0,)
    tree.set(np.arange(8), np.arange(8.0))
    assert tree.total == 28.0
    with pytest.raises(RuntimeError, match="min_key=True"):
        tree.pop_min(1)


def test_bad_arguments():
    with pytest.raises(ValueError, match="capacity"):
        SumTree(0)
    with pytest.raises(ValueError, match="dtype"):
        SumTree(4, np.int32)
    with pytest.raises(ValueError, match="kernels"):
        SumTree(4, kernels="wide")
    tree = SumTree(4)
    with pytest.raises(IndexError, match="slots"):
        tree.set(np.array([4]), np.array([1.0]))
    with pytest.raises(ValueError, match="total priority is 0"):
        tree.sample(np.array([0.5]))


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("capacity,k", [(1000, 128), (1000, 3), (64, 64), (100, 50)])
def test_pop_min_gives_key_then_slot_order(capacity, k, kernels):
    rng = np.random.default_rng(capacity + k)
    keys = rng.integers(0, 20, capacity).astype(float)  # many ties
    tree = SumTree(capacity, kernels=kernels)
    tree.set(np.arange(capacity), keys + 1, keys)
    want = np.lexsort((np.arange(capacity), keys))[:k]
    np.testing.assert_array_equal(tree.pop_min(k), want)
    assert tree.total == pytest.approx(np.delete(keys + 1, want).sum())


@pytest.mark.parametrize("kernels", KERNELS)
def test_pop_min_without_emptying_keeps_priorities_until_set(kernels):
    tree = SumTree(4, kernels=kernels)
    tree.set(np.arange(4), np.array([4.0, 1.0, 3.0, 2.0]))
    assert tree.pop_min(2, empty=False).tolist() == [1, 3]
    assert tree.total == 10.0 and tree.argmin() == 2
    tree.set(np.array([1, 3]), np.array([5.0, 6.0]))
    assert tree.total == 18.0 and tree.argmin() == 2


@pytest.mark.parametrize("kernels", KERNELS)
def test_taking_more_lowest_leaves_than_hold_keys_is_an_error_and_changes_nothing(kernels):
    tree = SumTree(8, kernels=kernels)
    tree.set(np.arange(3), np.array([3.0, 1.0, 2.0]))
    before = (tree.sums.copy(), tree.keys.copy())
    for take in (lambda: tree.pop_min(4), lambda: tree.replace_min(4, 1.0)):
        with pytest.raises(ValueError, match="fewer than 4"):
            take()
        np.testing.assert_array_equal(tree.sums, before[0])
        np.testing.assert_array_equal(tree.keys, before[1])
    with pytest.raises(ValueError, match="k must be"):
        tree.replace_min(9, 1.0)
    assert tree.replace_min(2, np.array([7.0, 8.0])).tolist() == [1, 2]
    assert tree.total == 18.0 and tree.argmin() == 0

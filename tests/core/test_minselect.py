"""select_min_keys against a plain-numpy reference: the k smallest finite leaves in (key, slot) order, keys untouched."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from replayloader.kernels.minselect import select_min_keys


def build_tree(leaves, dtype=np.float64, columns=0):
    """Min tree over `leaves` (padded with +inf to a power of two): returns (keys, n_leaves). With columns > 0 the
    keys are column 1 of a (2P, columns) array (a strided view, as sumtree's rows of side-by-side quantities)."""
    leaves = np.asarray(leaves, dtype)
    n_leaves = 1 << max(0, int(len(leaves) - 1).bit_length())
    keys = np.full(2 * n_leaves, np.inf, dtype)
    keys[n_leaves:n_leaves + len(leaves)] = leaves
    width = n_leaves // 2
    while width >= 1:
        keys[width:2 * width] = np.minimum(keys[2 * width:4 * width:2], keys[2 * width + 1:4 * width:2])
        width //= 2
    if columns:
        rows = np.zeros((2 * n_leaves, columns), dtype)
        rows[:, 1] = keys
        keys = rows[:, 1]
    return keys, n_leaves


def reference(leaves, k):
    """The k finite leaves of lowest (key, slot): lexsort's last key is the primary one."""
    leaves = np.asarray(leaves)
    slots = np.flatnonzero(np.isfinite(leaves))
    return slots[np.lexsort((slots, leaves[slots]))][:k]


def check(leaves, k, dtype=np.float64, columns=0):
    keys, n_leaves = build_tree(leaves, dtype, columns)
    before = keys.copy()
    got = select_min_keys(keys, n_leaves, k)
    assert got.dtype == np.int64 and got.shape == (k,)
    np.testing.assert_array_equal(got, reference(np.asarray(leaves, dtype), k))
    np.testing.assert_array_equal(keys, before)  # read only
    return got


@settings(max_examples=500, deadline=None)
@given(capacity=st.integers(1, 300), data=st.data())
def test_random_trees_match_reference(capacity, data):
    dtype = data.draw(st.sampled_from([np.float64, np.float32]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    kind = data.draw(st.sampled_from(["few values", "few values", "uniform", "wide"]))
    if kind == "few values":  # many ties, including -0.0 against 0.0
        leaves = rng.choice(np.array([-2.0, -0.0, 0.0, 0.5, 1.0, 3.0]), capacity)
        leaves = leaves[rng.permutation(capacity)] if rng.random() < 0.5 else np.sort(leaves)
    elif kind == "uniform":
        leaves = rng.random(capacity)
    else:  # spread over many orders of magnitude, both signs
        leaves = rng.choice([-1.0, 1.0], capacity) * 10.0 ** rng.uniform(-30, 30, capacity)
    leaves[rng.random(capacity) < data.draw(st.floats(0.0, 1.0))] = np.inf  # empty slots
    n_finite = int(np.isfinite(leaves).sum())
    k = data.draw(st.integers(0, n_finite))
    check(leaves, k, dtype, columns=data.draw(st.sampled_from([0, 0, 2, 4])))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_large_random(dtype):
    rng = np.random.default_rng(0)
    leaves = rng.uniform(0.01, 1.0, 100_000)
    for k in (1, 128, 1024):
        check(leaves, k, dtype)
    check(leaves, 1024, dtype, columns=4)


def _ties_half(n, rng):  # half the slots share the minimum; the winners are the lowest such slots
    leaves = 1.0 - rng.uniform(0.0, 0.5, n)
    leaves[rng.random(n) < 0.5] = 0.5
    return leaves


def _cluster(n, rng):  # every winner in one run of slots, surrounded by larger keys
    leaves = rng.uniform(0.01, 1.0, n)
    leaves[n // 3:n // 3 + 4096] = rng.uniform(0.001, 0.01, 4096)
    return leaves


@pytest.mark.parametrize("make", [
    _ties_half,
    lambda n, rng: np.full(n, 0.5),  # all equal: the first k slots
    _cluster,
    lambda n, rng: np.sort(rng.uniform(0.01, 1.0, n)),  # increasing with slot
    lambda n, rng: np.sort(rng.uniform(0.01, 1.0, n))[::-1].copy(),  # decreasing with slot
    lambda n, rng: np.where(rng.random(n) < 0.1, rng.uniform(0.01, 1.0, n), np.inf),  # 90% empty
    lambda n, rng: np.round(rng.uniform(0, 1, n), 2),  # 101 distinct values
    lambda n, rng: 2.0 ** -rng.integers(0, 1000, n).astype(float),  # keys over 300 orders of magnitude
    lambda n, rng: rng.standard_normal(n) * 1e-310,  # subnormal keys of both signs
], ids=["ties-half", "all-equal", "cluster", "sorted", "reversed", "sparse", "101-values", "geometric",
        "subnormal"])
def test_large_structured(make):
    rng = np.random.default_rng(1)
    leaves = make(100_000, rng)
    for k in (1, 1024, 5000):
        check(leaves, k)


def test_periodic_minima_defeat_the_selection_sample():
    # Start-level minima (8 leaves each) are 0 exactly where the sampled selection looks (every 16th), 1
    # elsewhere: the sample brackets the wrong value and the plain quickselect takes over.
    leaves = ((np.arange(32768) // 8) % 16 != 0).astype(float)
    check(leaves, 1024)
    check(leaves + np.random.default_rng(3).uniform(0, 1e-3, 32768), 1024)


def test_k_equal_to_the_number_of_finite_leaves():
    rng = np.random.default_rng(2)
    leaves = np.where(rng.random(5000) < 0.3, rng.random(5000), np.inf)
    check(leaves, int(np.isfinite(leaves).sum()))
    check(rng.random(1000), 1000)


def test_edges():
    assert select_min_keys(np.full(2, np.inf), 1, 0).shape == (0,)
    check([3.0], 1)
    check([np.inf, 2.0], 1)
    keys, n_leaves = build_tree([1.0, np.inf, 0.5])
    with pytest.raises(ValueError):
        select_min_keys(keys, n_leaves, 3)  # only two finite leaves
    keys, n_leaves = build_tree([-np.inf, 1.0, -np.inf, 0.0])  # -inf counts as the smallest key
    np.testing.assert_array_equal(select_min_keys(keys, n_leaves, 3), [0, 2, 3])

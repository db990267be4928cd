"""The buffer's random numbers: xoshiro256++ (Blackman & Vigna) run inside Numba kernels.

Why not `numpy.random.Generator`: passing one into a compiled kernel boxes it (several µs a call), and drawing
uniforms in Python first costs a separate numpy call per sample. This generator's whole state is four uint64
words in a numpy array: kernels advance it in place, and a checkpoint saves and restores it exactly.
"""
from __future__ import annotations

import numpy as np
from numba import njit

_TO_UNIT = 1.0 / 9007199254740992.0  # 2**-53: the top 53 bits of a draw make a double in [0, 1)


def seed_state(seed: int | None) -> np.ndarray:
    """Four uint64 words from `numpy.random.SeedSequence` (fresh entropy when seed is None; never all zero)."""
    state = np.random.SeedSequence(seed).generate_state(4, np.uint64)
    if not state.any():
        state[0] = 1
    return state


@njit(cache=True, nogil=True, inline="always")
def _rotl(x, k):
    return (x << np.uint64(k)) | (x >> np.uint64(64 - k))


@njit(cache=True, nogil=True)
def fill_uniforms(state, out):
    """Fill `out` with doubles uniform in [0, 1) and advance `state` (uint64[4]) past them."""
    s0, s1, s2, s3 = state[0], state[1], state[2], state[3]
    for j in range(out.shape[0]):
        result = _rotl(s0 + s3, 23) + s0
        t = s1 << np.uint64(17)
        s2 ^= s0
        s3 ^= s1
        s1 ^= s2
        s0 ^= s3
        s2 ^= t
        s3 = _rotl(s3, 45)
        out[j] = np.float64(result >> np.uint64(11)) * _TO_UNIT
    state[0], state[1], state[2], state[3] = s0, s1, s2, s3


def uniforms(state: np.ndarray, k: int) -> np.ndarray:
    """k uniforms in [0, 1) from `state` (advanced in place)."""
    out = np.empty(k, np.float64)
    fill_uniforms(state, out)
    return out



_RADIX_BITS = 11  # 5 passes cover a uniform's 53 bits
_SMALL = 32  # below this many keys an insertion sort beats the radix passes' bucket sweeps


@njit(cache=True, nogil=True)
def fill_permutation(state, out):
    """Fill `out` with a random permutation of 0 .. len(out) - 1 and advance `state` past len(out) uniforms:
    the stable argsort of those uniforms, bit for bit what ``np.argsort(uniforms(state, n), kind="stable")``
    gives (a stable sort has one answer), in O(n).

    Why not that numpy call: it sorts n doubles by comparison, and a shuffled pass over n examples pays it once
    per pass, so per example drawn. A uniform is ``r / 2**53`` for a 53-bit integer r (`fill_uniforms`), so
    ordering the uniforms is ordering the r's, which a least-significant-digit radix sort does stably in five
    passes of 11 bits."""
    n = out.shape[0]
    u = np.empty(n, np.float64)
    fill_uniforms(state, u)
    keys = np.empty(n, np.int64)
    for j in range(n):
        keys[j] = np.int64(u[j] * 9007199254740992.0)  # exact: u = r * 2**-53
        out[j] = j
    if n < _SMALL:  # a stable insertion sort
        for j in range(1, n):
            key, at = keys[j], out[j]
            i = j - 1
            while i >= 0 and keys[i] > key:
                keys[i + 1] = keys[i]
                out[i + 1] = out[i]
                i -= 1
            keys[i + 1] = key
            out[i + 1] = at
        return
    buckets = 1 << _RADIX_BITS
    order = out.copy()
    keys_to = np.empty(n, np.int64)
    order_to = np.empty(n, np.int64)
    starts = np.empty(buckets, np.int64)
    for shift in range(0, 53, _RADIX_BITS):
        starts[:] = 0
        for j in range(n):
            starts[(keys[j] >> shift) & (buckets - 1)] += 1
        acc = 0
        for d in range(buckets):
            c = starts[d]
            starts[d] = acc
            acc += c
        for j in range(n):  # in order within a bucket: the pass is stable
            d = (keys[j] >> shift) & (buckets - 1)
            keys_to[starts[d]] = keys[j]
            order_to[starts[d]] = order[j]
            starts[d] += 1
        keys, keys_to = keys_to, keys
        order, order_to = order_to, order
    out[:] = order


def permutation(state: np.ndarray, n: int) -> np.ndarray:
    """A random permutation of 0 .. n - 1 from `state` (advanced past n uniforms); see `fill_permutation`."""
    out = np.empty(n, np.int64)
    fill_permutation(state, out)
    return out

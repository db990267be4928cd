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


"""The one rule for per-example feedback values (losses, gradient norms, weights): one finite value >= 0 per
example. `PrioritizedSampler` checks its feedback here; the buffer keeps an identical copy for now
(`buffer.py`'s `_check_feedback_array`, `buffer_kernels.first_invalid`) that can become an import of this module.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from .storage import to_numpy


@njit(cache=True, nogil=True)
def first_invalid(values):
    """Position of the first NaN, infinite or negative value, or -1."""
    for j in range(values.shape[0]):
        v = values[j]
        if not (v >= 0.0 and v < np.inf):
            return j
    return -1


def check_feedback_array(name: str, value: Any, k: int, against: str = "ids") -> np.ndarray:
    """``value`` (numpy or torch) as a contiguous float64 array of shape (k,), all finite and >= 0; otherwise a
    ValueError naming ``name`` and the first bad value. ``against`` names what k counts, for the message."""
    arr = to_numpy(value, name)
    if arr.shape != (k,):
        raise ValueError(f"{name} must have shape ({k},) to match {against}, got {arr.shape}")
    arr = np.ascontiguousarray(arr, np.float64)
    bad = first_invalid(arr)
    if bad >= 0:
        raise ValueError(f"{name} must be finite and >= 0; {name}[{bad}] = {float(arr[bad])}")
    return arr

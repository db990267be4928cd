"""The one rule for per-example feedback values (losses, gradient norms, weights): one finite value >= 0 per
example. The buffer and `PrioritizedSampler` both check their feedback here."""
from __future__ import annotations

from typing import Any

import numpy as np

from .kernels.buffer import first_invalid
from .storage import to_numpy


def as_feedback_array(name: str, value: Any, k: int, against: str = "ids") -> np.ndarray:
    """``value`` (numpy or torch) as a contiguous float64 array of shape (k,); its values are not checked yet
    (`check_feedback_array`, or a kernel that checks them on the way). ``against`` names what k counts."""
    arr = value if type(value) is np.ndarray else to_numpy(value, name)
    if arr.shape != (k,):
        raise ValueError(f"{name} must have shape ({k},) to match {against}, got {arr.shape}")
    if arr.dtype != np.float64 or not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr, np.float64)
    return arr


def invalid_value(name: str, values: np.ndarray, bad: int) -> ValueError:
    """The error for the first value that is NaN, infinite or negative."""
    return ValueError(f"{name} must be finite and >= 0; {name}[{bad}] = {float(values[bad])}")


def check_feedback_array(name: str, value: Any, k: int, against: str = "ids") -> np.ndarray:
    """`as_feedback_array`, then every value finite and >= 0 (otherwise a ValueError naming ``name`` and the
    first bad value)."""
    arr = as_feedback_array(name, value, k, against)
    bad = first_invalid(arr)
    if bad >= 0:
        raise invalid_value(name, arr, bad)
    return arr

"""The one rule for a feedback call (``update(ids, loss=...)``), shared by the buffer and `PrioritizedSampler`.

The keywords a call may carry are the ones the strategy's `WeightUpdate` declares (`value_keywords`,
`array_keywords`), so a user's update that reads a new signal (say ``margin=``) gets it through, and a typo is
refused with the accepted keywords listed. A value keyword carries one finite value >= 0 per example; an array
keyword (e.g. ``logits=``) is an array of any shape that the update itself reads and checks.

It lives with the strategies (1.1; ``replayloader.buffer.feedback`` before) because the rule is the update's: the
buffer, the samplers and the Ray servers all call it, and none of them owns it.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..kernels.buffer import first_invalid
from .._arrays import to_numpy

if TYPE_CHECKING:
    from .updates import WeightUpdate


def read_feedback(update: WeightUpdate, feedback: Mapping[str, Any], k: int,
                  against: str = "ids") -> tuple[np.ndarray | None, str]:
    """The values a `WeightUpdate` reads from a feedback call of k examples, and the keyword that names them in errors.

    Every keyword must be one the update declares (else a TypeError listing those it accepts). Value keywords
    must have shape (k,); those the update does not return are checked for NaN, inf and negatives here. The
    returned values (a contiguous float64 array of shape (k,), or None when the update reads nothing) are *not*
    yet checked for those: the caller checks them on the way (`resolve_ids`, or `check_values`), so the usual
    call passes over them once. ``against`` names what k counts, for errors.
    """
    value_keywords = update.value_keywords
    if len(feedback) == 1:  # the usual call: one value keyword, often already as the kernels want it
        (name, value), = feedback.items()
        if (type(value) is np.ndarray and value.dtype == np.float64 and value.shape == (k,)
                and value.flags.c_contiguous and name in value_keywords):
            values = update.values(feedback)
            if values is value:
                return values, name
            return _read_values(update, values, feedback, k, against)
    arrays = {}
    for name, value in feedback.items():
        if name in value_keywords:
            arrays[name] = as_feedback_array(name, value, k, against)
        elif name in update.array_keywords:
            arrays[name] = to_numpy(value, name)
        else:
            accepted = [*value_keywords, *update.array_keywords]
            raise TypeError(f"unknown feedback keyword {name!r} for {type(update).__name__}; accepted: "
                            f"{accepted or 'none'}")
    return _read_values(update, update.values(arrays), arrays, k, against)


def _read_values(update: WeightUpdate, values: Any, arrays: Mapping[str, np.ndarray], k: int,
                 against: str) -> tuple[np.ndarray | None, str]:
    """`read_feedback` once the update has read the checked keywords: the value keywords it did not return are
    checked for bad values, and values it derived (e.g. from logits) are checked for shape."""
    returned = None  # the value keyword whose checked array the update returned as it is
    for name, array in arrays.items():
        if name in update.value_keywords:
            if array is values:
                returned = name
            else:  # a value keyword the update does not return is still checked
                check_values(name, array)
    if values is None or returned is not None:
        return values, returned or ""
    source = update.feedback_key or "feedback"  # what an invalid derived value is called in the error
    return as_feedback_array(source, values, k, against), source  # derived by the update, e.g. from logits


def as_feedback_array(name: str, value: Any, k: int, against: str = "ids") -> np.ndarray:
    """``value`` (numpy or torch) as a contiguous float64 array of shape (k,); its values are not checked yet
    (`check_values`, or a kernel that checks them on the way). ``against`` names what k counts."""
    arr = value if type(value) is np.ndarray else to_numpy(value, name)
    if arr.shape != (k,):
        raise ValueError(f"{name} must have shape ({k},) to match {against}, got {arr.shape}")
    if arr.dtype != np.float64 or not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr, np.float64)
    return arr


#: The bound of values that are checked but do not become weights themselves: any finite float64.
FINITE = float(np.finfo(np.float64).max)


def invalid_value(name: str, values: np.ndarray, bad: int, limit: float = FINITE) -> ValueError:
    """The error for the first value that is NaN, infinite, negative or above ``limit`` (`first_invalid`)."""
    value = float(values[bad])
    if 0.0 <= value < np.inf:  # finite and >= 0, so above a weight bound
        return ValueError(f"{name} must be <= {limit:.6g}, the largest weight whose priority w^alpha stays finite "
                          f"in this sum tree (`max_weight`); {name}[{bad}] = {value}")
    return ValueError(f"{name} must be finite and >= 0; {name}[{bad}] = {value}")


def check_values(name: str, values: np.ndarray, limit: float = FINITE) -> None:
    """Every value finite, >= 0 and at most ``limit`` (where the values become weights: the tree's
    `SumTree.max_weight`), otherwise a ValueError naming ``name`` and the first bad value."""
    bad = first_invalid(values, limit)
    if bad >= 0:
        raise invalid_value(name, values, bad, limit)

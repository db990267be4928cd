"""Argument checks, written once: every public constructor and call checks its arguments here, before any state
changes, and a bad value gets the same sentence everywhere, naming the argument and the value.

(Checks of a *loaded state* are a different rule with their own error type: ``replayloader.state.checks``.)
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ._arrays import to_numpy

_INTEGERS = (int, np.integer)
_NUMBERS = (int, float, np.integer, np.floating)


def integer(name: str, value: Any, low: int, high: int | None = None, why: str = "") -> int:
    """``value`` as an int, if it is an integer (not a bool) in [low, high]; else a ValueError naming ``name``."""
    ok = isinstance(value, _INTEGERS) and not isinstance(value, bool) and value >= low
    if not ok or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an integer {bound}{f' ({why})' if why else ''}, got {value!r}")
    return int(value)


def optional_integer(name: str, value: Any, low: int) -> int | None:
    """None, or ``value`` as an int >= ``low``."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, _INTEGERS) or value < low):
        raise ValueError(f"{name} must be None or an integer >= {low}, got {value!r}")
    return None if value is None else int(value)


def number(name: str, value: Any, low: float = -math.inf, high: float = math.inf, *, low_open: bool = False) -> float:
    """``value`` as a float, if it is a finite real number (not a bool) above ``low`` (strictly with ``low_open``)
    and at most ``high``; else a ValueError naming ``name``."""
    ok = isinstance(value, _NUMBERS) and not isinstance(value, bool)
    ok = ok and bool(np.isfinite(value)) and (value > low if low_open else value >= low) and value <= high
    if not ok:
        bound = (f"> {low}" if low_open else f">= {low}") if low > -math.inf else ""
        bound += (" and " if bound else "") + f"<= {high}" if high < math.inf else ""
        raise ValueError(f"{name} must be a finite number{' ' + bound if bound else ''}, got {value!r}")
    return float(value)


def all_finite(name: str, values: np.ndarray) -> None:
    """A ValueError naming the first non-finite entry of the 1-D array ``values`` (NaN or ±inf), if any."""
    bad = np.flatnonzero(~np.isfinite(values))
    if len(bad):
        raise ValueError(f"{name} must be finite; {name}[{bad[0]}] = {float(values[bad[0]])}")


def one_of(name: str, value: Any, allowed: tuple) -> Any:
    """``value`` if it is one of ``allowed``; else a ValueError naming ``name``, the choices and the value."""
    if not isinstance(value, str | int) or value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def index_array(name: str, value: Any, *, length: int | None = None, why: str = "") -> np.ndarray:
    """``value`` (numpy, torch or a sequence) as a contiguous int64 array, if it is a non-empty 1-D integer array
    (of exactly ``length`` entries when given); else a ValueError naming ``name``, the dtype and the shape it got.
    Ids, indices and positions all pass here; their range is the caller's rule."""
    arr = to_numpy(value, name)
    if arr.ndim != 1 or arr.dtype.kind not in "iu" or (arr.size == 0 if length is None else len(arr) != length):
        size = "non-empty" if length is None else f"{length}-long"
        raise ValueError(f"{name} must be a {size} 1-D integer array{f' ({why})' if why else ''}, got dtype "
                         f"{arr.dtype} shape {arr.shape}")
    return np.ascontiguousarray(arr, np.int64)


def path(name: str, value: Any) -> Path:
    """``value`` as a `Path`, if it is a str or an ``os.PathLike`` of one; else a TypeError naming ``name``."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str or os.PathLike, got {value!r}")
    return Path(value)


def function(name: str, value: Any) -> Callable:
    """``value`` if it is callable; else a TypeError naming ``name`` and the type it got."""
    if not callable(value):
        raise TypeError(f"{name} must be callable, got {type(value).__name__}")
    return value

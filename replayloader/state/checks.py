"""Checks for loaded state: every value a checkpoint hands back is checked here before anything changes.

A state dict comes from a file a user may have truncated, edited or mixed up, and its values end up inside
compiled kernels that trust their input (an out-of-range slot there is memory corruption, not an exception).
So each `load_state_dict` first builds every new value through these functions, which raise `InvalidState`
naming the field and the bad value, and only then assigns. The functions return fresh copies with the dtype the
object keeps, so nothing loaded aliases the caller's arrays.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


class InvalidState(ValueError):
    """A state dict that cannot be loaded; the object it was offered to is unchanged."""


def field(state: Any, key: str, where: str) -> Any:
    """``state[key]``, or a clear error when ``state`` is not a mapping or lacks the key."""
    if not isinstance(state, Mapping):
        raise InvalidState(f"{where} must be a mapping, got {type(state).__name__}")
    if key not in state:
        raise InvalidState(f"{where} has no {key!r} entry (keys: {sorted(map(str, state))})")
    return state[key]


def field_names(state: Any, where: str) -> set[str]:
    """The keys of a state mapping (an error if it is not one)."""
    if not isinstance(state, Mapping):
        raise InvalidState(f"{where} must be a mapping, got {type(state).__name__}")
    return set(state)


def integer(state: Any, key: str, where: str, low: int, high: int | None = None) -> int:
    """An integer entry in [low, high]."""
    value = field(state, key, where)
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidState(f"{where}[{key!r}] must be an integer, got {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise InvalidState(f"{where}[{key!r}] must be {bound}, got {value}")
    return value


def number(state: Any, key: str, where: str, low: float = -np.inf) -> float:
    """A finite number >= low."""
    value = field(state, key, where)
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidState(f"{where}[{key!r}] must be a number, got {value!r}")
    value = float(value)
    if not np.isfinite(value) or value < low:
        raise InvalidState(f"{where}[{key!r}] must be a finite number >= {low}, got {value!r}")
    return value


_KINDS = {"f": "floating-point", "i": "integer", "b": "boolean", "u": "unsigned integer"}


def array(state: Any, key: str, where: str, shape: tuple, kinds: str, dtype: Any) -> np.ndarray:
    """An array entry of exactly ``shape`` (-1: any length) whose dtype kind is one of ``kinds``, copied to
    ``dtype``. Integer and boolean kinds convert exactly; floats only from floats."""
    value = field(state, key, where)
    if not isinstance(value, np.ndarray):
        if type(value).__module__.startswith("torch"):
            value = value.detach().cpu().numpy()
        elif isinstance(value, (list, tuple)):
            value = np.asarray(value)
        else:
            raise InvalidState(f"{where}[{key!r}] must be an array, got {type(value).__name__}")
    if value.dtype.kind not in kinds:  # kinds never include "O": object arrays are refused here
        want = " or ".join(_KINDS[k] for k in kinds)
        if not (value.size == 0 and value.dtype.kind == "f" and "i" in kinds):  # np.asarray([]) is float
            raise InvalidState(f"{where}[{key!r}] must hold {want} values, got dtype {value.dtype}")
    if value.ndim != len(shape) or any(want != -1 and got != want for got, want in zip(value.shape, shape)):
        raise InvalidState(f"{where}[{key!r}] must have shape {tuple('any' if s == -1 else s for s in shape)}, "
                           f"got {value.shape}")
    if value.dtype.kind == "u" and np.dtype(dtype).kind == "i" and value.size and value.max() > np.iinfo(dtype).max:
        raise InvalidState(f"{where}[{key!r}] holds a value too large for {np.dtype(dtype)}: {value.max()}")
    return np.array(value, dtype=dtype, copy=True)


def boolean(state: Any, key: str, where: str) -> bool:
    """A True / False entry (numpy's 0-d booleans too; 0 and 1 are refused: a flag read as a number is a mixup)."""
    value = field(state, key, where)
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidState(f"{where}[{key!r}] must be True or False, got {value!r}")
    return bool(value)


def first_bad(mask: np.ndarray) -> int:
    """Index of the first True in ``mask``, or -1."""
    bad = np.flatnonzero(mask)
    return int(bad[0]) if len(bad) else -1


def require(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidState(message)


def finite(values: np.ndarray, name: str) -> None:
    """Every value finite (a loss may be negative, never NaN or infinite)."""
    bad = first_bad(~np.isfinite(values))
    require(bad < 0, f"{name}[{bad}] = {float(values[bad]) if bad >= 0 else None} must be finite")


def finite_nonnegative(values: np.ndarray, name: str, allow_nan: bool = False) -> None:
    """Every value finite and >= 0 (NaN allowed where it means "none yet")."""
    bad_mask = ~(np.isfinite(values) & (values >= 0))
    if allow_nan:
        bad_mask &= ~np.isnan(values)
    bad = first_bad(bad_mask)
    require(bad < 0, f"{name}[{bad}] = {float(values[bad]) if bad >= 0 else None} must be finite and >= 0")


def rng_words(state: Any, key: str, where: str) -> np.ndarray:
    """The generator's state: four uint64 words, not all zero (xoshiro's one invalid state)."""
    value = field(state, key, where)
    value = np.asarray(value) if not isinstance(value, np.ndarray) else value
    require(value.shape == (4,) and value.dtype == np.uint64,
            f"{where}[{key!r}] (the RNG state) must be 4 uint64 words, got dtype {value.dtype} shape {value.shape}")
    require(bool(value.any()), f"{where}[{key!r}] (the RNG state) is all zero, which is not a valid state")
    return value.copy()


def counters(state: Any, key: str, where: str, names: Mapping[str, int]) -> dict[str, int]:
    """A dict with exactly the keys of ``names``, each a non-negative integer."""
    value = field(state, key, where)
    require(isinstance(value, Mapping), f"{where}[{key!r}] must be a mapping, got {type(value).__name__}")
    require(set(value) == set(names), f"{where}[{key!r}] must have the keys {sorted(names)}, got {sorted(value)}")
    return {name: integer(value, name, f"{where}[{key!r}]", 0) for name in names}


def check_header(state: Any, version: int, config: Mapping[str, Any], what: str) -> str:
    """A state mapping of this ``version`` whose saved config equals ``config``; returns the name used in errors."""
    where = f"{what} state"
    require(isinstance(state, Mapping), f"{where} must be a mapping, got {type(state).__name__}")
    saved = state.get("version")
    require(saved == version, f"state version {saved!r} is not supported (expected {version})")
    same_config(field(state, "config", where), config, where, what)
    return where


def same_config(saved: Any, mine: Mapping[str, Any], where: str, what: str) -> None:
    """The saved configuration equals this object's, key by key."""
    require(isinstance(saved, Mapping), f"{where}['config'] must be a mapping, got {type(saved).__name__}")
    for key, value in mine.items():
        require(key in saved, f"{where}['config'] has no {key!r} entry")
        require(saved[key] == value, f"checkpoint has {key}={saved[key]!r} but this {what} has {key}={value!r}")

"""Spearman's rank correlation: how well the proxy's ranking of rows tracks the main model's, whatever the
scales (numpy only, so it is cheap to call every step)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..._arrays import to_numpy


def ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing their average rank."""
    order = np.argsort(values, kind="stable")
    ranked = np.empty(len(values))
    ranked[order] = np.arange(1, len(values) + 1)
    unique, inverse = np.unique(values, return_inverse=True)
    if len(unique) < len(values):
        ranked = (np.bincount(inverse, ranked) / np.bincount(inverse))[inverse]
    return ranked


def rank_correlation(a: Any, b: Any) -> float:
    """Spearman's rank correlation of two equally long score vectors (NaN when either is constant or shorter
    than 2): how well one ranking tracks the other, whatever the scales."""
    x = np.asarray(to_numpy(a, "a"), np.float64).ravel()
    y = np.asarray(to_numpy(b, "b"), np.float64).ravel()
    if x.shape != y.shape:
        raise ValueError(f"a and b must have the same length, got {len(x)} and {len(y)}")
    if len(x) < 2:
        return math.nan
    rx, ry = ranks(x) - (len(x) + 1) / 2, ranks(y) - (len(y) + 1) / 2
    scale = math.sqrt(float(rx @ rx) * float(ry @ ry))
    return float(rx @ ry) / scale if scale > 0 else math.nan

"""Numbers the reports share: a mean with its sample spread, as a table cell, and Spearman's correlation with
the GLUE convention for a constant side (0, so averages over runs stay finite)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None for a single value); the one place tables get their spread."""
    values = np.asarray(values, dtype=np.float64)
    if values.size < 2:
        return float(values.mean()), None
    return float(values.mean()), float(values.std(ddof=1))


def format_mean_std(values: Sequence[float], digits: int = 3, scale: float = 1.0) -> str:
    """A table cell: "mean ± sample std" of the finite values times ``scale`` (just the mean for one value, "–"
    for none)."""
    finite = [scale * v for v in values if v is not None and np.isfinite(v)]
    if not finite:
        return "–"
    mean, std = mean_std(finite)
    return f"{mean:.{digits}f}" if std is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def spearman(x, y) -> float:
    """Spearman rank correlation (ties share their average rank); 0 when undefined (a constant side), so that
    averages over runs stay finite (the GLUE convention for STS-B)."""
    from scipy import stats

    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.size < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return 0.0
    return float(stats.spearmanr(x, y).statistic)

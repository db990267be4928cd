"""Reading a pretraining run's metrics.jsonl for the probe summaries: one batch's ranking AUC is noisy, so the
summaries average over a window of steps, and L_D is read against the entropy of the replaced-token share (the
loss of a discriminator that predicts only the base rate)."""
from __future__ import annotations

import math
from pathlib import Path

from replayloader_electra.pretrain.metrics import base_rate_entropy as prior_entropy  # noqa: E402,F401 (re-exported)
from replayloader_electra.pretrain.metrics import read_metrics  # noqa: E402


def read_rows(path: str | Path) -> list[dict]:
    """A run's records; a last line torn by a kill (a run still writing) is dropped."""
    return read_metrics(path)


def window_mean(rows: list[dict], key: str, step: int, half: int = 25) -> float:
    """Mean of ``key`` over the steps within ±half of ``step`` (step 1: that step alone); NaN when none."""
    values = [r[key] for r in rows if (r["step"] == step if step == 1 else abs(r["step"] - step) <= half)
              and r.get(key) is not None and not math.isnan(r[key])]
    return sum(values) / len(values) if values else float("nan")


def tail_mean(rows: list[dict], key: str, n: int = 100) -> float:
    """Mean of ``key`` over the last n steps (NaN when none)."""
    values = [r[key] for r in rows[-n:] if r.get(key) is not None and not math.isnan(r[key])]
    return sum(values) / len(values) if values else float("nan")

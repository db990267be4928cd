"""What a run reports: one JSON record per step, drift views of a sampled batch, curves and a summary.

`step_record` is the single place a step's numbers are gathered, so a distributed run can reduce that one dict
across ranks before it is written.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from scipy.stats import entropy
from sklearn.metrics import roc_auc_score

from replayloader.state import StateFileError
from replayloader.strategies import grad_bound_sigmoid

from ..errors import UserError
from ..jsonl import JsonLinesWriter, read_json_lines, rewrite_json_lines
from .losses import DiscriminatorLosses


class MetricsLog:
    """One JSON object per step in metrics.jsonl, appended safely (`jsonl.JsonLinesWriter`).

    On resume the records after the checkpoint's step are dropped (the resumed run recomputes them) and the
    rest kept as they are; ``resume_step`` must be the step of a checkpoint that verified, so no line the
    checkpoint does not account for is ever removed. A fresh run (``resume_step`` None) starts an empty log.
    """

    def __init__(self, path: Path, resume_step: int | None, enabled: bool = True) -> None:
        self.path = path
        self.file = None
        if not enabled:  # a distributed run's other ranks: rank 0 writes the log
            return
        kept = []
        if resume_step is not None and path.exists():
            try:
                kept = [r for r in read_json_lines(path) if r["step"] <= resume_step]
            except StateFileError as error:  # a damaged line before the end: keep the file, say which line
                raise UserError(f"{error}; the resumed run leaves this log alone: repair or move it") from None
        rewrite_json_lines(path, kept)
        self.file = JsonLinesWriter(path)

    def write(self, record: dict) -> None:
        if self.file is None:
            return
        self.file.write({k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()})

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a metrics.jsonl (a last line torn by a kill is dropped)."""
    return read_json_lines(path)


def _fraction(numerator: torch.Tensor, denominator: torch.Tensor) -> float:
    d = float(denominator)
    return float(numerator) / d if d > 0 else float("nan")


def drift_metrics(data: Mapping[str, torch.Tensor], losses: DiscriminatorLosses, fresh: np.ndarray) -> dict:
    """Distribution-drift view of a sampled batch: how many masked tokens differ, fresh vs replayed, and accuracy."""
    masked = data["masked"]
    changed = (data["input_ids"] != data["original_ids"]) & masked
    fresh_rows = torch.from_numpy(np.asarray(fresh, dtype=bool)).to(masked.device)
    predicted = (losses.logits > 0).float()
    real = losses.mask.bool()
    replaced = losses.labels.bool() & real
    original = ~losses.labels.bool() & real
    return {
        "changed_fraction_fresh": _fraction(changed[fresh_rows].sum(), masked[fresh_rows].sum()),
        "changed_fraction_replayed": _fraction(changed[~fresh_rows].sum(), masked[~fresh_rows].sum()),
        "fresh_fraction": float(fresh_rows.float().mean()),
        "replaced_fraction": _fraction(replaced.sum(), real.sum()),
        "discriminator_accuracy": _fraction(((predicted == losses.labels) & real).sum(), real.sum()),
        "replaced_accuracy": _fraction((predicted.bool() & replaced).sum(), replaced.sum()),
        # Drift: how well D spots the current generator's replacements (fresh rows) against older ones (replayed)
        "replaced_accuracy_fresh": _fraction((predicted.bool() & replaced & fresh_rows[:, None]).sum(),
                                             (replaced & fresh_rows[:, None]).sum()),
        "replaced_accuracy_replayed": _fraction((predicted.bool() & replaced & ~fresh_rows[:, None]).sum(),
                                                (replaced & ~fresh_rows[:, None]).sum()),
        "original_accuracy": _fraction((~predicted.bool() & original).sum(), original.sum()),
        "replaced_auc": ranking_auc(losses.logits[replaced], losses.logits[original]),
        # On fresh rows only: examples D has never trained on, comparable across variants (replayed rows were
        # trained on before, which flatters the sampled-batch numbers of TMR).
        "discriminator_loss_fresh": float(losses.per_example[fresh_rows].detach().mean()) if fresh_rows.any() else None,
        "replaced_auc_fresh": ranking_auc(losses.logits[replaced & fresh_rows[:, None]],
                                          losses.logits[original & fresh_rows[:, None]]),
    }


def ranking_auc(positive: torch.Tensor, negative: torch.Tensor) -> float:
    """P(score of a replaced token > score of an original one), ties counting half: shows D learning before any
    logit crosses 0. NaN when either side is empty."""
    if positive.numel() == 0 or negative.numel() == 0:
        return float("nan")
    scores = torch.cat([positive, negative]).detach().double().cpu().numpy()
    labels = np.r_[np.ones(positive.numel()), np.zeros(negative.numel())]
    return float(roc_auc_score(labels, scores))


def base_rate_entropy(replaced_share: float) -> float:
    """Binary entropy (nats) of the replaced share: the L_D of a discriminator that has learned only the base
    rate, the line a collapsed discriminator sits on."""
    return float(entropy([replaced_share, 1 - replaced_share]))


def plot_metrics(runs: Mapping[str, list[dict]], path: str | Path) -> None:
    """Loss and drift curves of one or more runs in one PNG (moving average over ~2% of the steps)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("generator_loss", "generator loss L_G"), ("discriminator_loss", "discriminator loss L_D"),
              ("replaced_auc", "D ranking AUC, replaced vs original"),
              ("changed_fraction_fresh", "masked tokens changed (fresh)"),
              ("changed_fraction_replayed", "masked tokens changed (replayed)"),
              ("sample_age_mean", "age of sampled examples (steps)")]
    fig, axes = plt.subplots(2, 3, figsize=(14, 7))
    for ax, (key, title) in zip(axes.flat, panels):
        for index, (name, records) in enumerate(runs.items()):
            points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
            if not points:
                continue
            steps, values = map(np.asarray, zip(*points))
            window = max(1, len(values) // 50)
            smooth = np.convolve(values, np.ones(window) / window, mode="valid")
            ax.plot(steps[window - 1:], smooth, label=name, color=f"C{index}")  # same colour in every panel
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes.flat[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def summarize(records: list[dict], tail: float = 0.1) -> dict:
    """Means over the last ``tail`` fraction of steps (losses, accuracies, drift) and timing over all but the first."""
    if not records:
        return {}
    last = records[-max(1, int(len(records) * tail)):]
    timed = records[1:] or records

    def mean(rows: list[dict], key: str) -> float | None:
        values = [r[key] for r in rows if r.get(key) is not None]
        return float(np.mean(values)) if values else None

    keys = ["loss", "generator_loss", "discriminator_loss", "generator_accuracy", "discriminator_accuracy",
            "replaced_accuracy", "replaced_accuracy_fresh", "replaced_accuracy_replayed", "replaced_auc",
            "discriminator_loss_fresh", "replaced_auc_fresh", "heldout_auc", "heldout_loss",
            "changed_fraction_produced", "changed_fraction_fresh",
            "changed_fraction_replayed", "fresh_fraction", "sample_age_mean", "buffer_weight_std",
            "buffer_mean_visits", "example_grad_norm_mean", "bound_vs_norm_spearman"]
    out = {f"final_{k}": mean(last, k) for k in keys}
    out.update(steps=records[-1]["step"], seconds_per_step=mean(timed, "step_seconds"),
               data_seconds_per_step=mean(timed, "data_seconds"),
               produce_seconds_per_step=mean(timed, "produce_seconds"))
    return out


def step_record(step: int, lr: float, loss: torch.Tensor, generator_loss: torch.Tensor, d: DiscriminatorLosses,
                batch, feedback_report: dict, total_grad_norm: torch.Tensor, buffer_stats: dict,
                seconds: dict) -> dict:
    """Everything logged for one step: losses, the produced and the sampled batch, the buffer, timings, and what
    the run's feedback reports (`feedback.LossFeedback.report`)."""
    aux = batch.aux
    ages = batch.ages + aux.get("delay_age", 0)  # steps since the generator made each row (`delay.DelayLine`)
    bound = grad_bound_sigmoid(d.logits.detach(), d.labels, d.mask)  # K&F bound, for every variant's log
    record = {
        "step": step, "lr": lr, "loss": loss.item(),
        "generator_loss": generator_loss.item(), "discriminator_loss": d.loss.item(),
        "generator_accuracy": float(aux["generator_accuracy"]),
        "changed_fraction_produced": float(aux["changed_fraction"]),
        **drift_metrics(batch.data, d, ages == 0),
        "grad_total_norm": float(total_grad_norm), "sample_age_mean": float(ages.mean()),
        "example_loss_std": float(d.per_example.detach().std()) if len(d.per_example) > 1 else 0.0,
        "example_bound_mean": float(bound.mean()),
        "buffer_size": buffer_stats["size"], "buffer_weight_mean": buffer_stats.get("weight_mean"),
        "buffer_weight_std": buffer_stats.get("weight_std"), "buffer_weight_min": buffer_stats.get("weight_min"),
        "buffer_weight_max": buffer_stats.get("weight_max"), "buffer_mean_visits": buffer_stats.get("mean_visits"),
        "buffer_stale_feedback": buffer_stats.get("stale_feedback"),
        "produce_seconds": aux["produce_seconds"], **seconds, **feedback_report,
    }
    return record

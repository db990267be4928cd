"""Summary of the regime search (experiments/regime_search.py): for every probe folder with a metrics.jsonl, the
fresh-example ranking AUC of the discriminator along training, whether it reached and held 0.8, L_D against the
base-rate entropy, the generator's accuracy and the speed; a markdown table on stdout (and in
OUT/regime_search_table.md) and the curves in a PNG.

    python -m experiments.regime_search_summary runs/regime_search [--plot results/regime_search/regime_search.png]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from experiments.probe_metrics import prior_entropy, read_rows, tail_mean, window_mean  # noqa: E402
from experiments.regime_search import PROBES, heldout_text  # noqa: E402

AUC_KEY = "replaced_auc_fresh"  # examples the discriminator never trained on (for ELECTRA: its whole batch)
MARKS = [100, 250, 500, 1000, 2000, 3000, 5000, 10000]
TARGET = 0.8
SMOOTH = 100  # steps in the moving average that decides "reached" and "held"


def smoothed(rows: list[dict], key: str, window: int = SMOOTH) -> tuple[np.ndarray, np.ndarray]:
    """(steps, moving average over `window` steps) of a metric, NaN-free."""
    points = [(r["step"], r[key]) for r in rows if r.get(key) is not None and not math.isnan(r[key])]
    if len(points) < window:
        return np.array([]), np.array([])
    steps, values = map(np.asarray, zip(*points))
    return steps[window - 1:], np.convolve(values, np.ones(window) / window, mode="valid")


def reached_and_held(steps: np.ndarray, auc: np.ndarray) -> tuple[str, str]:
    """First step where the smoothed AUC is >= TARGET, and its lowest value from then on."""
    above = np.nonzero(auc >= TARGET)[0]
    if len(above) == 0:
        return "—", "—"
    return str(int(steps[above[0]])), f"{auc[above[0]:].min():.3f}"


def heldout(out: Path, name: str) -> dict | None:
    """Held-out AUC of a finished probe (experiments/heldout_auc.py), computed once and kept in heldout.json."""
    run = out / name
    cached = run / "heldout.json"
    if not cached.exists():
        if name not in PROBES or not (run / "summary.json").exists() or not (run / "generator").is_dir():
            return None
        from heldout_auc import heldout_auc

        text, skip = heldout_text(out, name)
        result = heldout_auc(run, text, skip)
        cached.write_text(json.dumps({**result, "text": text, "skip_lines": skip}))
    return json.loads(cached.read_text())


def describe(name: str) -> str:
    if name not in PROBES:
        return "?"
    corpus, steps, flags = PROBES[name]
    return f"{corpus} {' '.join(flags) or '(baseline)'}"


def table(out: Path) -> str:
    names = [n for n in PROBES if (out / n / "metrics.jsonl").exists()]
    names += sorted(p.parent.name for p in out.glob("*/metrics.jsonl") if p.parent.name not in PROBES)
    head = ["probe", "settings", "steps done", *(f"AUC @ {m}" for m in MARKS), f"best AUC (smoothed {SMOOTH})",
            f"first step AUC ≥ {TARGET}", "lowest AUC after", "AUC, last 10%", "L_D, last 100",
            "H(replaced share)", "gen. MLM acc., last 100", "replaced-token acc., last 100", "held-out AUC (L_D / H)", "s/step", "status"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name in names:
        rows = read_rows(out / name / "metrics.jsonl")
        done = rows[-1]["step"]
        planned = PROBES[name][1] if name in PROBES else done
        steps, auc = smoothed(rows, AUC_KEY)
        best = f"{auc.max():.3f} @ {int(steps[auc.argmax()])}" if len(auc) else "—"
        reached, held = reached_and_held(steps, auc)
        last = rows[-max(1, len(rows) // 10):]
        state = "done" if (out / name / "summary.json").exists() else "unfinished"
        held_out = heldout(out, name)
        held_out = (f"{held_out['auc']:.3f} ({held_out['discriminator_loss']:.3f} / {held_out['prior_entropy']:.3f})"
                    if held_out else "")
        cells = [name, describe(name), f"{done}/{planned}",
                 *(f"{window_mean(rows, AUC_KEY, m):.3f}" if m <= done else "" for m in MARKS), best, reached, held,
                 f"{tail_mean(last, AUC_KEY, len(last)):.3f}", f"{tail_mean(rows, 'discriminator_loss'):.3f}",
                 f"{prior_entropy(tail_mean(rows, 'replaced_fraction')):.3f}",
                 f"{tail_mean(rows, 'generator_accuracy'):.3f}", f"{tail_mean(rows, 'replaced_accuracy'):.3f}", held_out,
                 f"{tail_mean(rows[1:], 'step_seconds', len(rows)):.3f}", state]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(out: Path, path: Path) -> None:
    """Fresh AUC, L_D minus the base-rate entropy, and generator accuracy along training, one line per probe."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in PROBES if (out / n / "metrics.jsonl").exists()]
    fig, axes = plt.subplots(1, 3, figsize=(18, 6))
    for index, name in enumerate(names):
        rows = read_rows(out / name / "metrics.jsonl")
        for row in rows:
            share = row.get("replaced_fraction")
            row["ld_gap"] = row["discriminator_loss"] - prior_entropy(share) if share else None
        style = dict(label=name, color=plt.cm.tab20(index % 20), linestyle="-" if index < 10 else "--")
        for ax, key in zip(axes, (AUC_KEY, "ld_gap", "generator_accuracy")):
            steps, values = smoothed(rows, key, 50)
            if len(steps):
                ax.plot(steps, values, **style)
    titles = ["D ranking AUC on fresh examples (moving avg. 50 steps)",
              "L_D − H(replaced share)  (0 = base rate only)", "generator MLM accuracy"]
    for ax, title in zip(axes, titles):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
    axes[0].axhline(TARGET, color="k", linewidth=0.8, linestyle=":")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", default="runs/regime_search")
    parser.add_argument("--plot", default=str(Path(__file__).resolve().parents[1] / "results" / "regime_search" / "regime_search.png"))
    args = parser.parse_args()
    out = Path(args.out)
    markdown = table(out)
    (out / "regime_search_table.md").write_text(markdown + "\n")
    print(markdown)
    plot(out, Path(args.plot))
    print(f"wrote {out / 'regime_search_table.md'} and {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Table of experiments/prioritized_glue.sh: dev accuracy against steps for uniform and prioritized sampling.

Reads ``<run dir>/<sampling>_e<epochs>/results_runs.jsonl`` of one or more run directories (the finetune command's per-run rows) and writes
mean ± sample std over seeds, the paired difference (prioritized − uniform, same seed), and seconds per step.

    python -m experiments.prioritized_glue_summary runs/prioritized_glue --out results/prioritized_glue/prioritized_glue.md
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
from pathlib import Path

import numpy as np
from scipy.stats import ttest_rel

from replayloader_electra.common import format_mean_std  # noqa: E402


def percent_cell(values) -> str:
    """Accuracies (fractions) as "mean ± sample std" in percent."""
    return format_mean_std(values, digits=2, scale=100)


def load_rows(run_dirs: list[Path]) -> list[dict]:
    rows = []
    for path in sorted(p for run_dir in run_dirs for p in run_dir.glob("*_e*/results_runs.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def render(rows: list[dict], command: str) -> str:
    steps = sorted({r["train_steps"] for r in rows})
    by = {(r["sampling"], r["train_steps"], r["seed"]): r for r in rows}
    first = rows[0]
    seeds = sorted({r["seed"] for r in rows})
    lines = ["# Prioritized vs uniform sampling: SST-2 through `finetune --sampling`", "",
             f"Command: `{command}`  ",
             f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC  ",
             f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores (shared with other jobs), no GPU, one torch "
             "thread  ",
             f"Task: SST-2, {first['train_examples']:,} of {first['train_examples_total']:,} training examples "
             f"(subset seed {first['subset_seed']}), full dev set ({first['eval_examples']}); max length "
             f"{first['max_length']}, batch {first['batch_size']}, lr {first['learning_rate']}, ELECTRA's recipe "
             "otherwise (warm-up 10%, linear decay, layer decay). Each step budget is its own run.  ",
             "Model: tiny ELECTRA-shaped encoder (hidden 64, 2 layers), random weights, no pretraining.  ",
             "Prioritized: one shuffled pass, then P ∝ latest loss (alpha 1), 10% uniform draws, importance weights "
             f"with beta 0.4 → 1. Seeds {seeds}.", "",
             "Dev accuracy (%), mean ± sample std over seeds; Δ = prioritized − uniform, paired by seed:", "",
             "| sampling | " + " | ".join(f"{s} steps" for s in steps) + " |", "|---|" + "---|" * len(steps)]
    for sampling in ("uniform", "prioritized"):
        cells = [percent_cell([by[(sampling, s, seed)]["accuracy"] for seed in seeds if (sampling, s, seed) in by])
                 for s in steps]
        lines.append(f"| {sampling} | " + " | ".join(cells) + " |")
    deltas = [percent_cell([by[("prioritized", s, seed)]["accuracy"] - by[("uniform", s, seed)]["accuracy"]
                        for seed in seeds if ("prioritized", s, seed) in by and ("uniform", s, seed) in by])
              for s in steps]
    lines.append("| Δ | " + " | ".join(deltas) + " |")
    p_values = []
    for s in steps:
        pairs = [(by[("prioritized", s, seed)]["accuracy"], by[("uniform", s, seed)]["accuracy"]) for seed in seeds
                 if ("prioritized", s, seed) in by and ("uniform", s, seed) in by]
        p_values.append(f"{ttest_rel(*zip(*pairs)).pvalue:.2f}" if len(pairs) > 1 else "–")
    lines.append("| paired t-test p | " + " | ".join(p_values) + " |")
    lines += ["", "Training time per step (ms), mean over runs (the machine is shared; compare with care):", "",
              "| sampling | ms per step |", "|---|---|"]
    for sampling in ("uniform", "prioritized"):
        per_step = [r["train_seconds"] / r["train_steps"] for r in rows if r["sampling"] == sampling]
        lines.append(f"| {sampling} | {1e3 * np.mean(per_step):.1f} ± {1e3 * np.std(per_step, ddof=1):.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", type=Path, nargs="+", help="output directories of prioritized_glue.sh")
    parser.add_argument("--command", default="bash experiments/prioritized_glue.sh")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    text = render(load_rows(args.run_dirs), args.command)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()

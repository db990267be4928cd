"""How well do the saved irreducible losses of the noisy-SST-2 runs single out the flipped labels?

    python -m experiments.noisy_sst2_irreducible runs/noisy_sst2 --out results/noisy_sst2/noisy_sst2_irreducible.md

For each saved ``irreducible_noiseNN_seedS.npz`` (written by the `rho` arm of `noisy_sst2.py`): the mean
irreducible loss of the training examples whose label was flipped and of the others, and the AUC of the
irreducible loss as a detector of flipped labels (Mann-Whitney U / (n_flipped * n_clean); 0.5 = no signal).
RHO-LOSS can only skip a mislabelled example if its irreducible loss is high.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from scipy.stats import mannwhitneyu

from experiments.noisy_sst2 import DEFAULT_GLUE, Config, load_data  # noqa: E402
from experiments.noisy_sst2_summary import emit, table  # noqa: E402

from replayloader.selection.irreducible import IrreducibleLosses  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("--glue-dir", type=Path, default=DEFAULT_GLUE)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows, flipped_of = [], {}
    for path in sorted(args.runs.glob("irreducible_noise*_seed*.npz")):
        noise, seed = map(int, re.match(r"irreducible_noise(\d+)_seed(\d+)", path.stem).groups())
        if noise not in flipped_of:
            flipped_of[noise] = load_data(args.glue_dir, noise / 100, Config()).train_flipped
        flipped, il = flipped_of[noise], IrreducibleLosses.load(path)
        if flipped.any():
            auc = mannwhitneyu(il.losses[flipped], il.losses[~flipped]).statistic / (flipped.sum() * (~flipped).sum())
            row = (f"{il.losses[flipped].mean():.3f}", f"{il.losses[~flipped].mean():.3f}", f"{auc:.3f}")
        else:
            row = ("-", f"{il.losses.mean():.3f}", "-")
        rows.append([f"{noise}%", str(seed), *row, f"{il.train_cpu_s + il.score_cpu_s:.2f}"])
    text = "\n".join([
        "# Noisy SST-2: do the irreducible losses single out the flipped labels?", "",
        f"Command: `python -m experiments.noisy_sst2_irreducible {args.runs} --out {args.out}`. Date: 2026-11-24. "
        "Machine: 2-core CPU, no GPU.", "",
        "Irreducible-loss model: the run's architecture trained 2 epochs on the held-out 20% of the (noisy) training "
        "set, then scoring the 53,879 training examples. AUC: the irreducible loss as a detector of a flipped label.",
        "", *table(["noise", "seed", "mean IL, flipped", "mean IL, clean", "AUC", "CPU s"], rows), ""])
    emit(text, args.out)


if __name__ == "__main__":
    main()

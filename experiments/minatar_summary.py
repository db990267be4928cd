"""Every table of results/minatar/minatar.md and the curves of results/minatar/minatar.png, from the committed records alone.

    python -m experiments.minatar_summary results/minatar --out results/minatar/minatar.md

Reads ``<game>_<arm>_seed<seed>.jsonl.gz`` (one per finished run, `minatar_driver.py`). The protocol
(`results/minatar/minatar_protocol.md`, fixed before the runs) is copied to the top and the hand-written reading
(`results/minatar/minatar_reading.md`, if present) to the bottom; everything between is computed here. Differences are
per − uniform over the seeds both arms have finished, with paired-t 95% intervals.
"""
from __future__ import annotations

import argparse
import gzip
import json
import warnings
from pathlib import Path

import numpy as np

from experiments.noisy_sst2_summary import emit, mean_std, paired, table  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results" / "minatar"  # its protocol and reading, beside the records
PRIMARY_GAME, SEEDS = "breakout", 5  # the protocol's primary comparison and its number of pairs
LAST = 0.1  # the share of frames (and of training time) the end-of-run endpoints average over
BINS = 30  # frame bins of the learning curve and its area
ENDPOINTS = {"last_return": "training return, last 10% of frames", "auc": f"AUC ({BINS} frame bins, mean return)",
             "final_eval": "evaluation return at the last frame"}


def load_runs(folder: Path) -> dict[tuple[str, str, int], dict]:
    """(game, arm, seed) -> {"head": the run line, "episodes": [...], "evals": [...]}."""
    runs = {}
    for path in sorted(folder.glob("*.jsonl.gz")):
        with gzip.open(path, "rt") as f:
            records = [json.loads(line) for line in f if line.strip()]
        head = next(r for r in records if r["kind"] == "run")
        runs[head["game"], head["arm"], head["seed"]] = {
            "head": head, "episodes": [r for r in records if r["kind"] == "episode"],
            "evals": [r for r in records if r["kind"] == "eval"]}
    return runs


def curve(run: dict, bins: int = BINS) -> np.ndarray:
    """Mean training return of the episodes ending in each of ``bins`` equal frame bins (nan where none ends)."""
    frames = run["head"]["config"]["frames"]
    ends = np.array([e["frame"] for e in run["episodes"]])
    returns = np.array([e["return"] for e in run["episodes"]])
    which = np.minimum((ends - 1) * bins // frames, bins - 1)
    return np.array([returns[which == b].mean() if (which == b).any() else np.nan for b in range(bins)])


def window_return(episodes: list[dict], key: str, end: float) -> float:
    """Mean return of the episodes whose ``key`` (frame or cpu_s) lies in (1 - LAST) * end < key <= end."""
    inside = [e["return"] for e in episodes if (1 - LAST) * end < e[key] <= end]
    return float(np.mean(inside)) if inside else float("nan")


def endpoints(run: dict) -> dict[str, float]:
    frames = run["head"]["config"]["frames"]
    last_eval = run["evals"][-1]["returns"] if run["evals"] else []
    return {"last_return": window_return(run["episodes"], "frame", frames), "auc": float(np.nanmean(curve(run))),
            "final_eval": float(np.mean(last_eval)) if last_eval else float("nan")}


def equal_time(a: dict, b: dict) -> tuple[float, float, float]:
    """Both runs' mean return over the last 10% of T, T the smaller of their training CPU seconds."""
    budget = min(a["head"]["cpu_s"], b["head"]["cpu_s"])
    return window_return(a["episodes"], "cpu_s", budget), window_return(b["episodes"], "cpu_s", budget), budget


def render(runs: dict, source: Path) -> str:
    games = sorted({g for g, _, _ in runs}, key=lambda g: (g != PRIMARY_GAME, g))
    seeds = lambda game, arm: sorted(s for g, a, s in runs if g == game and a == arm)  # noqa: E731
    ends = {key: endpoints(run) for key, run in runs.items()}
    out = [(RESULTS / "minatar_protocol.md").read_text().rstrip(), "", "# Results", "",
           f"Tables: `python -m experiments.minatar_summary {source} --out results/minatar/minatar.md` (from the committed "
           "records). Date: 2026-11-24. Machine: 2-core CPU, no GPU, shared with other jobs (CPU seconds are the "
           "training process's own, one thread; evaluations not counted).", "",
           f"Finished runs: {len(runs)} ({', '.join(f'{g} {a}: {len(seeds(g, a))}' for g in games for a in ('uniform', 'per'))}).",
           ""]
    for game in games:
        common = sorted(set(seeds(game, "per")) & set(seeds(game, "uniform")))
        pairs = lambda q: ([ends[game, "per", s][q] for s in common],  # noqa: E731
                           [ends[game, "uniform", s][q] for s in common])
        out += [f"## {game}", ""]
        if game == PRIMARY_GAME:
            status = (f"**partial: {len(common)} of {SEEDS} pairs, not a verdict**" if len(common) < SEEDS
                      else f"{len(common)} pairs")
            result = paired(*pairs("last_return"), 2) if common else "no finished pair yet"
            out += [f"Primary endpoint ({status}): mean training return over the last 10% of frames, per − "
                    f"uniform, paired by seed: **{result}**.", ""]
        rows = []
        for arm in ("uniform", "per"):
            keys = [(game, arm, s) for s in seeds(game, arm)]
            if keys:
                rows.append([arm, str(len(keys)), *(mean_std([ends[k][q] for k in keys], 2) for q in ENDPOINTS),
                             mean_std([runs[k]["head"]["cpu_s"] / 60 for k in keys], 1)])
        out += ["Mean ± std over seeds:", ""]
        out += table(["arm", "seeds", *ENDPOINTS.values(), "training CPU min"], rows) + [""]
        if common:
            times = [equal_time(runs[game, "per", s], runs[game, "uniform", s]) for s in common]
            rows = [[label, paired(*pairs(q), 2)] for q, label in ENDPOINTS.items()]
            rows.append([f"training return, last 10% of equal CPU time T (T = {mean_std([t[2] for t in times], 0)} s)",
                         paired([t[0] for t in times], [t[1] for t in times], 2)])
            out += ["Paired differences, per − uniform (mean [95% paired-t CI], p):", ""]
            out += table(["quantity", "per − uniform"], rows) + [""]
        rows = [[f"{a} seed {s}", f"{runs[g, a, s]['head']['frames']:,}", str(runs[g, a, s]["head"]["episodes"]),
                 f"{ends[g, a, s]['last_return']:.2f}", f"{ends[g, a, s]['final_eval']:.2f}",
                 f"{runs[g, a, s]['head']['cpu_s']:.0f}", f"{runs[g, a, s]['head']['wall_s']:.0f}"]
                for g, a, s in sorted(runs) if g == game]
        out += table(["run", "frames", "episodes", "last-10% return", "final eval", "CPU s", "wall s"], rows) + [""]
    out += ["`results/minatar/minatar.png`: training return per frame bin, mean over seeds with ±1 std bands (per-seed "
            "lines for an arm with fewer than 3 seeds), and the evaluation returns, per game.", ""]
    reading = RESULTS / "minatar_reading.md"
    if reading.exists():
        out += [reading.read_text().rstrip(), ""]
    return "\n".join(out)


def plot(runs: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    games = sorted({g for g, _, _ in runs}, key=lambda g: (g != PRIMARY_GAME, g))
    fig, axes = plt.subplots(len(games), 2, figsize=(10, 3.6 * len(games)), squeeze=False)
    for row, game in zip(axes, games):
        for arm, color in (("uniform", "tab:blue"), ("per", "tab:orange")):
            keys = sorted(k for k in runs if k[0] == game and k[1] == arm)
            if not keys:
                continue
            frames = runs[keys[0]]["head"]["config"]["frames"]
            centers = (np.arange(BINS) + 0.5) * frames / BINS
            curves = np.array([curve(runs[k]) for k in keys])
            evals = [(np.array([e["frame"] for e in runs[k]["evals"]]),
                      np.array([np.mean(e["returns"]) if e["returns"] else np.nan for e in runs[k]["evals"]]))
                     for k in keys]
            if len(keys) < 3:
                for i, k in enumerate(keys):
                    row[0].plot(centers, curves[i], color=color, label=f"{arm} seed {k[2]}", alpha=0.8)
                    row[1].plot(*evals[i], color=color, marker=".", label=f"{arm} seed {k[2]}", alpha=0.8)
                continue
            for ax, x, ys in ((row[0], centers, curves), (row[1], evals[0][0], np.array([e[1] for e in evals]))):
                with warnings.catch_warnings():  # a bin where no seed (or one) has an episode is left blank
                    warnings.simplefilter("ignore", RuntimeWarning)
                    mean, std = np.nanmean(ys, 0), np.nanstd(ys, 0, ddof=1)
                ax.plot(x, mean, color=color, label=f"{arm} ({len(keys)} seeds)")
                ax.fill_between(x, np.maximum(mean - std, 0), mean + std, color=color, alpha=0.2)
        row[0].set_title(f"{game}: training return")
        row[1].set_title(f"{game}: evaluation return (eps 0.001)")
        for ax in row:
            ax.set_xlabel("frames")
            ax.set_ylabel("episode return")
            ax.set_ylim(bottom=0)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", type=Path, help="folder of <game>_<arm>_seed<seed>.jsonl.gz")
    parser.add_argument("--out", type=Path, help="the markdown page (the figure beside it, .png); else print")
    args = parser.parse_args(argv)
    runs = load_runs(args.records)
    emit(render(runs, args.records), args.out)
    if args.out and runs:
        plot(runs, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()

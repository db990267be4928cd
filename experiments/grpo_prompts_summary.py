"""Issue 39: the tables of the GRPO prompt study from its records alone (protocol:
``results/grpo_prompts/protocol.md``), written before any study run. From the checkout's root:

    python -m experiments.grpo_prompts_summary                              # results/grpo_prompts/runs, seeds 100-115
    python -m experiments.grpo_prompts_summary --out results/grpo_prompts/summary.md
    python -m experiments.grpo_prompts_summary --runs runs/grpo_prompts/pilot --seeds 0 1 2   # the pilot

Records: ``<runs>/<arm>-seed<s>.jsonl`` (or ``.jsonl.gz``) as ``experiments/grpo_prompts.py`` writes them.

- **Primary**: training CPU seconds until ``acc_2_5``, averaged over two consecutive evaluations, reaches
  ``TARGET``; a run that never does enters at its final evaluation's seconds (censored). Per prioritized arm
  (``learnability``, ``dapo``), paired with ``uniform`` by seed: geometric-mean ratio with its 95% paired-t
  interval, one-sided paired t and exact sign-flip p (``ratio_test`` of ``sb3_seconds_summary.py``), each
  Holm-adjusted over the arms present. The verdict line needs every seed of ``--seeds`` finished in every arm
  compared, otherwise the summary says PARTIAL.
- **Secondaries** (no verdict): the same on wall seconds (``clock``) and on generated tokens; the mean
  ``frac_reward_zero_std`` before the target; ``acc_2_5`` and ``acc_d5`` at B/4, B/2 and B CPU seconds; the
  sampler's CPU share of training (records from before the driver timed it in CPU seconds show "-"). Runs
  shorter than B (the pilot's seeds 0 and 1) give their last evaluation at B/2 and B.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
from pathlib import Path

import numpy as np

from experiments.sb3_seconds_summary import ratio_test

REPO = Path(__file__).resolve().parents[1]

RUNS = REPO / "results" / "grpo_prompts" / "runs"
SEEDS = tuple(range(100, 116))
TARGET = 0.88
METRIC = "acc_2_5"
WINDOW = 2
BUDGET = 150.0  # training CPU seconds per run
ALPHA = 0.01
PRIORITIZED = ("learnability", "dapo")


def record_path(runs: Path, arm: str, seed: int) -> Path | None:
    for name in (f"{arm}-seed{seed}.jsonl", f"{arm}-seed{seed}.jsonl.gz"):
        if (runs / name).is_file():
            return runs / name
    return None


def load(path: Path) -> dict[str, list]:
    """A record's lines by type (a record without an ``end`` line is unfinished)."""
    opener = gzip.open if path.suffix == ".gz" else open
    out: dict[str, list] = {"meta": [], "step": [], "eval": [], "log": [], "end": []}
    with opener(path, "rt") as f:
        for line in f:
            row = json.loads(line)
            out[row["type"]].append(row)
    return out


def time_to_target(rec: dict, clock: str, metric: str = METRIC, target: float = TARGET,
                   window: int = WINDOW) -> tuple[float, bool, int]:
    """(the ``clock`` value, reached, step) at the first evaluation whose ``metric`` averaged with the ``window - 1``
    before it is >= ``target``; else the final evaluation's (censored)."""
    evals = rec["eval"]
    values = np.array([e[metric] for e in evals], dtype=float)
    for i in range(window - 1, len(evals)):
        if values[i - window + 1:i + 1].mean() >= target - 1e-12:
            return float(evals[i][clock]), True, int(evals[i]["step"])
    return float(evals[-1][clock]), False, int(evals[-1]["step"])


def holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm-adjusted p values (step-down, monotone, capped at 1)."""
    order = sorted(pvalues, key=pvalues.get)
    out, running = {}, 0.0
    for rank, key in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * pvalues[key]))
        out[key] = running
    return out


def at_time(rec: dict, seconds: float, metric: str, clock: str = "cpu") -> float:
    """``metric`` at the last evaluation with ``clock`` <= ``seconds`` (+ half a second's tolerance, for B)."""
    evals = [e for e in rec["eval"] if e[clock] <= seconds + 0.5]
    return float(evals[-1][metric]) if evals else math.nan


def equal_time(recs: dict, arm: str, seeds: list[int], metric: str, clock: str, budget: float) -> list[tuple]:
    """Secondary 4: ``arm`` - uniform in ``metric`` at equal time, per fraction f of 1/4, 1/2, 1: on ``cpu`` at
    f x the budget, on ``clock`` (wall) at f x the pair's shorter run. (f, mean difference, 95% paired-t interval,
    pairs)."""
    from scipy import stats

    out = []
    pairs = [s for s in seeds if ("uniform", s) in recs and (arm, s) in recs]
    for f in (0.25, 0.5, 1.0):
        diffs = []
        for s in pairs:
            u, a = recs["uniform", s], recs[arm, s]
            t = f * (budget if clock == "cpu" else min(u["eval"][-1][clock], a["eval"][-1][clock]))
            diffs.append(at_time(a, t, metric, clock) - at_time(u, t, metric, clock))
        d = np.asarray(diffs, dtype=float)
        low, high = (stats.ttest_1samp(d, 0.0).confidence_interval(0.95) if len(d) >= 2 else (math.nan, math.nan))
        out.append((f, float(d.mean()) if len(d) else math.nan, float(low), float(high), len(d)))
    return out


def zero_share(rec: dict, until_step: int) -> float:
    vals = [g["frac_reward_zero_std"] for g in rec["log"] if g["step"] <= until_step]
    return float(np.mean(vals)) if vals else math.nan


def sampler_share(rec: dict) -> float:
    steps = rec["step"]
    if not steps or "sampler_cpu" not in steps[-1]:
        return math.nan
    return float(sum(s["sampler_cpu"] for s in steps) / max(steps[-1]["cpu"], 1e-9))


def summary(runs: Path, seeds: list[int], budget: float = BUDGET) -> str:
    recs: dict[tuple[str, int], dict] = {}
    for arm in ("uniform", *PRIORITIZED):
        for seed in seeds:
            path = record_path(runs, arm, seed)
            if path is not None:
                rec = load(path)
                if rec["end"]:
                    recs[arm, seed] = rec
    arms = [a for a in PRIORITIZED if any((a, s) in recs for s in seeds)]
    shown = runs.resolve().relative_to(REPO) if runs.resolve().is_relative_to(REPO) else runs
    lines = [f"# GRPO prompt study (issue 39): summary from `{shown}`", "",
             f"Target: `{METRIC}` >= {TARGET} (mean of {WINDOW} consecutive evaluations); budget {budget:g} training "
             f"CPU s; seeds {seeds[0]}-{seeds[-1]} ({len(seeds)}); finished runs: "
             + ", ".join(f"{a} {sum((a, s) in recs for s in seeds)}" for a in ("uniform", *arms)), ""]
    tests = {}
    for clock, title in (("cpu", "Primary: training CPU seconds to the target"),
                         ("clock", "Secondary 1: training wall seconds to the target"),
                         ("tokens", "Secondary 2: generated tokens to the target")):
        lines += [f"## {title}", ""]
        for arm in arms:
            pairs = [s for s in seeds if ("uniform", s) in recs and (arm, s) in recs]
            lines += [f"| seed | uniform | {arm} | ratio |", "|---:|---:|---:|---:|"]
            u_vals, p_vals, censored = [], [], {"uniform": 0, arm: 0}
            for s in pairs:
                (tu, ru, _), (tp, rp, _) = (time_to_target(recs[a, s], clock) for a in ("uniform", arm))
                u_vals.append(tu)
                p_vals.append(tp)
                censored["uniform"] += not ru
                censored[arm] += not rp
                lines.append(f"| {s} | {tu:.0f}{'' if ru else ' (censored)'} | {tp:.0f}{'' if rp else ' (censored)'} "
                             f"| {tp / tu:.3f} |")
            if len(pairs) >= 2:
                t = ratio_test(u_vals, p_vals)
                tests[clock, arm] = t
                lines += ["", f"{arm} / uniform: geometric-mean ratio {t['ratio']:.3f} [{t['low']:.3f}, "
                          f"{t['high']:.3f}], one-sided paired t p {t['p_t']:.3g}, exact sign-flip p "
                          f"{t['p_flip']:.3g}, {arm} faster in {t['ahead']} of {t['n']}; censored: uniform "
                          f"{censored['uniform']}, {arm} {censored[arm]}", ""]
            else:
                lines += ["", f"{arm}: fewer than 2 pairs", ""]
    primary = {arm: tests["cpu", arm] for arm in arms if ("cpu", arm) in tests}
    if primary:
        adj_t = holm({a: t["p_t"] for a, t in primary.items()})
        adj_f = holm({a: t["p_flip"] for a, t in primary.items()})
        lines += ["## Verdict (primary, Holm over the arms compared)", ""]
        for arm, t in primary.items():
            complete = t["n"] == len(seeds)
            pays = adj_t[arm] < ALPHA and adj_f[arm] < ALPHA
            status = ("PARTIAL: not a verdict" if not complete else
                      ("pays in seconds" + (" and meets the goal (<= 0.67)" if t["ratio"] <= 0.67 else
                                            ", short of the goal (<= 0.67)")) if pays else "not shown")
            lines.append(f"- {arm}: ratio {t['ratio']:.3f}, Holm-adjusted p: t {adj_t[arm]:.3g}, sign-flip "
                         f"{adj_f[arm]:.3g}, {t['n']} of {len(seeds)} pairs: **{status}**")
        lines.append("")
    lines += ["## Secondary 4: held-out accuracy at equal time (arm - uniform, paired t 95% CI)", "",
              "| arm | metric | clock | at 1/4 | at 1/2 | at 1 | pairs |", "|---|---|---|---:|---:|---:|---:|"]
    for arm in arms:
        for metric in (METRIC, "acc_d5"):
            for clock, what in (("cpu", f"CPU, x {budget:g} s"), ("clock", "wall, x the pair's shorter run")):
                cells = equal_time(recs, arm, seeds, metric, clock, budget)
                lines.append(f"| {arm} | {metric} | {what} | " + " | ".join(
                    f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]" for _, m, lo, hi, _ in cells) + f" | {cells[0][4]} |")
    lines.append("")
    lines += ["## Secondaries 3-5 (per arm: mean over its finished runs)", "",
              "| arm | runs | zero-variance share before the target | acc_2_5 at B/4, B/2, B | acc_d5 at B/4, B/2, B "
              "| sampler CPU share |", "|---|---:|---:|---:|---:|---:|"]
    for arm in ("uniform", *arms):
        rs = [recs[arm, s] for s in seeds if (arm, s) in recs]
        if not rs:
            continue
        zero = np.mean([zero_share(r, time_to_target(r, "cpu")[2]) for r in rs])
        acc = [np.mean([at_time(r, budget * f, METRIC) for r in rs]) for f in (0.25, 0.5, 1.0)]
        d5 = [np.mean([at_time(r, budget * f, "acc_d5") for r in rs]) for f in (0.25, 0.5, 1.0)]
        shares = [x for x in (sampler_share(r) for r in rs) if not math.isnan(x)] if arm != "uniform" else []
        share = f"{np.mean(shares):.2%}" if shares else "-"
        lines.append(f"| {arm} | {len(rs)} | {zero:.3f} | " + " / ".join(f"{a:.3f}" for a in acc) + " | "
                     + " / ".join(f"{a:.3f}" for a in d5) + f" | {share} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=Path, default=RUNS)
    p.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    p.add_argument("--budget", type=float, default=BUDGET)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    text = summary(a.runs, a.seeds, a.budget)
    if a.out:
        a.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()

"""Issue 42's endpoints from `experiments/sb3_minatar.py` records: does PER reach a return sooner, in seconds?

    python -m experiments.sb3_seconds_summary                  # results/sb3_seconds, seeds 100-114
    python -m experiments.sb3_seconds_summary --out results/sb3_seconds/summary.md
    python -m experiments.sb3_seconds_summary --pilot          # seeds 0-4 (results/sb3_minatar): the numbers and
                                                               # the power written into the protocol

Protocol: results/sb3_seconds/protocol.md. The primary endpoint is a run's training CPU seconds until the mean
training return of its last 100 episodes first reaches TARGET; a run that never reaches it enters at its total
training CPU seconds (censored: a lower bound). The test is on log(PER / uniform) paired by seed: one-sided paired
t (alternative: PER faster) and the exact sign-flip test over all 2^n sign assignments. The per-frame and
equal-CPU-time endpoints are `sb3_minatar`'s own functions (one computation of each quantity).
"""
from __future__ import annotations

import argparse
import gzip
import itertools
import json
import math
from pathlib import Path

import numpy as np

from experiments.sb3_minatar import (ARMS, equal_time_means, last_tenth_mean, paired_line, parse_seeds,  # noqa: E402
                                     record_path, shown)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "sb3_seconds"
PILOT = ROOT / "results" / "sb3_minatar"
TARGET, WINDOW, ALPHA = 14.0, 100, 0.01
SEEDS, PILOT_SEEDS = list(range(100, 115)), list(range(5))


def time_to_target(record: dict, target: float = TARGET, window: int = WINDOW, clock: str = "cpu") \
        -> tuple[float, bool]:
    """(seconds, reached): the ``clock`` ("cpu" or "wall") training seconds at the end of the first episode whose
    mean return over it and the ``window - 1`` episodes before it is >= ``target``; a run that never gets there
    gives its total training seconds and ``False`` (censored: a lower bound of its time). Wall seconds need the
    per-episode ``wall_s`` that records from issue 42 on carry (nan for older records)."""
    episodes = record["episodes"]
    key, total = ("cpu_s", record["train_cpu_s"]) if clock == "cpu" else ("wall_s", record.get("train_wall_s"))
    if key not in episodes or total is None:
        return math.nan, False
    returns, seconds = np.asarray(episodes["return"], dtype=float), np.asarray(episodes[key], dtype=float)
    if len(returns) >= window:
        sums = np.convolve(returns, np.ones(window), mode="valid")  # sums[i]: episodes i .. i + window - 1
        hit = np.nonzero(sums >= target * window - 1e-9)[0]
        if len(hit):
            return float(seconds[hit[0] + window - 1]), True
    return float(total), False


def sign_flip_p(log_ratios, alternative: str = "less") -> float:
    """Exact one-sided sign-flip p for the mean of the paired ``log_ratios``: the share of all 2^n sign assignments
    (the observed one included) whose mean is <= the observed mean ("less": PER faster) or >= it ("greater")."""
    d = np.asarray(log_ratios, dtype=float)
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(d))))
    means, observed = signs @ d / len(d), d.mean()
    tol = 1e-12 * max(1.0, np.abs(d).sum())
    hits = means <= observed + tol if alternative == "less" else means >= observed - tol
    return float(hits.mean())


def ratio_test(uniform_s, per_s) -> dict:
    """Paired comparison of seconds, PER / uniform: geometric-mean ratio with a two-sided 95% paired-t interval (on
    the logs, back-transformed), the one-sided paired t p (PER faster), the exact sign-flip p, pairs PER ahead."""
    from scipy import stats

    d = np.log(np.asarray(per_s, dtype=float)) - np.log(np.asarray(uniform_s, dtype=float))
    out = {"n": len(d), "ratio": float(np.exp(d.mean())), "ahead": int((d < 0).sum()), "log_ratios": d.tolist()}
    if len(d) >= 2:
        low, high = stats.ttest_1samp(d, 0.0).confidence_interval(0.95)
        out |= {"low": float(np.exp(low)), "high": float(np.exp(high)), "sd_log": float(d.std(ddof=1)),
                "p_t": float(stats.ttest_1samp(d, 0.0, alternative="less").pvalue), "p_flip": sign_flip_p(d)}
    return out


def ratio_line(test: dict) -> str:
    if test["n"] < 2:
        return f"{test['ratio']:.3f}x ({test['n']} pair)" if test["n"] else "no pair"
    return (f"{test['ratio']:.3f}x [{test['low']:.3f}, {test['high']:.3f}], one-sided paired t p = {test['p_t']:.3g}, "
            f"exact sign-flip p = {test['p_flip']:.3g}, PER faster in {test['ahead']} of {test['n']} pairs")


def t_power(n: int, sd_log: float, ratio: float, alpha: float = ALPHA) -> float:
    """Power of the one-sided paired t at level ``alpha`` with ``n`` pairs when log(PER / uniform) ~ N(log ratio,
    sd_log^2): the noncentral t."""
    from scipy import stats

    critical = stats.t.ppf(1 - alpha, n - 1)
    return float(stats.nct.sf(critical, n - 1, -math.log(ratio) * math.sqrt(n) / sd_log))


def simulated_power(n: int, sd_log: float, ratio: float, alpha: float = ALPHA, sims: int = 2_000,
                    seed: int = 0) -> tuple[float, float]:
    """(exact one-sided sign-flip test, both it and the one-sided paired t): power at level ``alpha`` under the
    same normal model as `t_power`, by simulation."""
    from scipy import stats

    rng = np.random.default_rng(seed)
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
    flip = both = 0
    for start in range(0, sims, 250):
        d = rng.normal(math.log(ratio), sd_log, size=(n, min(250, sims - start)))
        sums = signs @ d  # row 0 is all +1: the observed sums
        p_flip = (sums <= sums[0] + 1e-9).mean(axis=0)
        p_t = stats.ttest_1samp(d, 0.0, axis=0, alternative="less").pvalue
        flip += int((p_flip < alpha).sum())
        both += int(((p_flip < alpha) & (p_t < alpha)).sum())
    return flip / sims, both / sims


def load_pairs(results: Path, seeds: list[int]) -> dict[int, tuple[dict, dict]]:
    pairs = {}
    for seed in seeds:
        paths = [record_path(results, arm, seed) for arm in ARMS]
        if all(p.exists() for p in paths):
            pairs[seed] = tuple(json.load(gzip.open(p, "rt")) for p in paths)
    return pairs


def seconds_table(pairs: dict, clock: str, target: float) -> tuple[list[str], dict]:
    rows, uniform_s, per_s, censored = [], [], [], {arm: 0 for arm in ARMS}
    for seed, (u, p) in pairs.items():
        (tu, ru), (tp, rp) = time_to_target(u, target, clock=clock), time_to_target(p, target, clock=clock)
        if math.isnan(tu) or math.isnan(tp):
            continue
        censored["uniform"] += not ru
        censored["per"] += not rp
        uniform_s.append(tu)
        per_s.append(tp)
        rows.append(f"| {seed} | {tu:.0f}{'' if ru else ' (censored)'} | {tp:.0f}{'' if rp else ' (censored)'} "
                    f"| {tp / tu:.3f} |")
    if not rows:
        return [f"no pair has {clock} seconds per episode", ""], {"n": 0}
    test = ratio_test(uniform_s, per_s)
    table = [f"| seed | uniform {clock} s | per {clock} s | per / uniform |", "|---:|---:|---:|---:|", *rows, "",
             f"per / uniform: {ratio_line(test)}", "",
             f"Censored runs (never reached {target:g}): uniform {censored['uniform']}, per {censored['per']}", ""]
    return table, test


def summary(results: Path, seeds: list[int], target: float = TARGET, minimum: int = 15) -> str:
    pairs = load_pairs(results, seeds)
    partial = "" if len(pairs) >= minimum else f" (PARTIAL: fewer than {minimum} pairs, not a verdict)"
    lines = [f"Pairs finished: {len(pairs)} of {len(seeds)}{partial}", "",
             f"### Training CPU seconds to a {WINDOW}-episode mean training return >= {target:g} (primary)", ""]
    table, test = seconds_table(pairs, "cpu", target)
    lines += table
    if test["n"] >= 2:
        verdict = test["p_t"] < ALPHA and test["p_flip"] < ALPHA
        lines += [f"Primary at alpha {ALPHA}: {'PER faster in CPU seconds' if verdict else 'not shown'} "
                  f"(both tests below {ALPHA}: {verdict}){partial}", ""]
    lines += ["### Training wall seconds to the same target (secondary 1)", ""]
    lines += seconds_table(pairs, "wall", target)[0]
    secondaries = {"equal training CPU time, last 10% of it (secondary 2)": equal_time_means,
                   "last 10% of frames, mean training return (secondary 3, the earlier per-frame primary)":
                       lambda u, p: (last_tenth_mean(u), last_tenth_mean(p))}
    for name, measure in secondaries.items():
        values = {seed: measure(*records) for seed, records in pairs.items()}
        lines += [f"### {name}", "", "| seed | uniform | per | per - uniform |", "|---:|---:|---:|---:|"]
        lines += [f"| {seed} | {u:.2f} | {p:.2f} | {p - u:+.2f} |" for seed, (u, p) in values.items()]
        lines += ["", "per - uniform: " + paired_line([p - u for u, p in values.values()]), ""]
    lines += ["### Cost per run (descriptive)", "",
              "| seed | arm | training CPU s | training wall s | wall s | episodes |", "|---:|---|---:|---:|---:|---:|"]
    lines += [f"| {seed} | {r['arm']} | {r['train_cpu_s']:.0f} | {r.get('train_wall_s', math.nan):.0f} | "
              f"{r['wall_s']:.0f} | {len(r['episodes']['frame'])} |"
              for seed, records in pairs.items() for r in records]
    return "\n".join(lines)


def pilot(results: Path = PILOT, seeds: list[int] = PILOT_SEEDS, n: int = len(SEEDS)) -> str:
    """Seeds 0-4: time to each candidate target per arm, the primary's log ratios at TARGET, and the power of the
    confirmatory design (``n`` pairs) from their spread."""
    pairs = load_pairs(results, seeds)
    lines = ["Seeds " + ", ".join(map(str, pairs)) + f" from {shown(results)}/; training CPU s to a {WINDOW}-episode "
             "mean return >= target (c: censored)", "",
             "| target | " + " | ".join(f"{arm} s{seed}" for seed in pairs for arm in ARMS) + " | reached |",
             "|---:|" + "---:|" * (2 * len(pairs) + 1)]
    for target in (12.0, 13.0, 14.0, 15.0, 16.0):
        cells = [time_to_target(r, target) for records in pairs.values() for r in records]
        lines.append(f"| {target:g} | " + " | ".join(f"{s:.0f}{'' if ok else 'c'}" for s, ok in cells)
                     + f" | {sum(ok for _, ok in cells)} of {len(cells)} |")
    budgets = [r["train_cpu_s"] for records in pairs.values() for r in records]
    hits = [time_to_target(r, TARGET)[0] / r["train_cpu_s"] for records in pairs.values() for r in records]
    test = ratio_test(*zip(*((time_to_target(u)[0], time_to_target(p)[0]) for u, p in pairs.values())))
    from scipy import stats

    two_sided = stats.ttest_1samp(test["log_ratios"], 0.0).pvalue
    sd = test["sd_log"]
    lines += ["", f"Total training CPU s per run: {min(budgets):.0f}-{max(budgets):.0f}; target {TARGET:g} reached at "
              f"{min(hits):.2f}-{max(hits):.2f} of the run's own total.",
              f"At target {TARGET:g}: log(per / uniform) = " + ", ".join(f"{x:+.4f}" for x in test["log_ratios"])
              + f"; mean {np.mean(test['log_ratios']):+.4f}, sd {sd:.4f}",
              f"per / uniform {ratio_line(test)}; two-sided paired t p = {two_sided:.3g}", "",
              f"Power with {n} pairs, one-sided alpha {ALPHA}, log ratio ~ N(log r, {sd:.4f}^2):"]
    for label, ratio in (("true ratio 0.85", 0.85), (f"observed ratio {test['ratio']:.3f}", test["ratio"])):
        flip, both = simulated_power(n, sd, ratio)
        lines.append(f"- {label}: paired t {t_power(n, sd, ratio):.3f}; exact sign-flip {flip:.3f}; both below "
                     f"{ALPHA} (the protocol's rule) {both:.3f} (the last two from 2,000 simulations)")
    df = test["n"] - 1
    sd_high = sd * math.sqrt(df / stats.chi2.ppf(0.2, df))  # the sd's one-sided 80% upper confidence bound
    lines.append(f"- if the sd is its one-sided 80% upper bound from {test['n']} pairs, {sd_high:.4f}: paired t "
                 f"{t_power(n, sd_high, 0.85):.3f} at 0.85, {t_power(n, sd_high, test['ratio']):.3f} at "
                 f"{test['ratio']:.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=None)
    parser.add_argument("--seeds", nargs="+", type=parse_seeds, default=None, help="e.g. 100-114 or 100 101 102")
    parser.add_argument("--target", type=float, default=TARGET)
    parser.add_argument("--pilot", action="store_true", help="seeds 0-4: target choice and power (protocol)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    seeds = [s for group in args.seeds for s in group] if args.seeds else None
    if args.pilot:
        print(pilot(args.results or PILOT, seeds or PILOT_SEEDS))
        return
    results = args.results or RESULTS
    text = summary(results, seeds or SEEDS, args.target)
    print(text)
    if args.out is not None:
        args.out.write_text(f"# Does PER pay in seconds? SB3 DQN on MinAtar Breakout (issue 42, generated)\n\n"
                            f"Made by `python -m experiments.sb3_seconds_summary --out {shown(args.out)}` from the "
                            f"records in `{shown(results)}/`; protocol: `results/sb3_seconds/protocol.md`.\n\n"
                            f"{text}\n")


if __name__ == "__main__":
    main()

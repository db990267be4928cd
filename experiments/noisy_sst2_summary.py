"""Every table of results/noisy_sst2/noisy_sst2.md, recomputed from the committed per-evaluation records.

    python -m experiments.noisy_sst2_summary results/noisy_sst2/noisy_sst2.jsonl.gz --out results/noisy_sst2/noisy_sst2.md

The protocol (`results/noisy_sst2/noisy_sst2_protocol.md`, fixed before the grid ran) is copied to the top, and the
hand-written reading (`results/noisy_sst2/noisy_sst2_reading.md`, if present) to the bottom; everything between is computed
here. Paired differences are arm − uniform over the seeds both have, with paired-t 95% intervals.
"""
from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy import stats

ARMS = ("uniform", "prioritized", "topk", "sb", "rho")
TARGET = 0.70  # the primary endpoint's dev accuracy (fixed in the protocol)
CPU_BUDGET = 3.0  # CPU seconds of the equal-time comparison (fixed in the protocol)
RESULTS = Path(__file__).resolve().parents[1] / "results" / "noisy_sst2"  # its protocol and reading, beside the records


def load_runs(path: Path) -> dict[tuple[str, float, int], list[dict]]:
    runs = defaultdict(list)
    with gzip.open(path, "rt") as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                runs[record["arm"], record["noise"], record["seed"]].append(record)
    return {key: sorted(records, key=lambda r: r["step"]) for key, records in runs.items()}


def endpoints(records: list[dict]) -> dict[str, float]:
    """One run's quantities: steps and CPU seconds to the target (the run's end if never reached), accuracy at
    the end, at the CPU budget and at its peak, the share of trained rows that were mislabelled, rows per step."""
    reached = next((r for r in records if r["dev_accuracy"] >= TARGET), None)
    last = records[-1]
    hit = reached or last
    il = last.get("irreducible")
    il_cpu = il["train_cpu_s"] + il["score_cpu_s"] if il else 0.0
    in_budget = [r for r in records if r["cpu_s"] <= CPU_BUDGET]
    return {"steps_to_target": hit["step"], "cpu_to_target": hit["cpu_s"], "cpu_to_target_with_il": hit["cpu_s"]
            + il_cpu, "reached": reached is not None, "final_accuracy": last["dev_accuracy"],
            "accuracy_at_budget": in_budget[-1]["dev_accuracy"] if in_budget else float("nan"),
            "peak_accuracy": max(r["dev_accuracy"] for r in records),
            "mislabelled": last["selected_mislabelled"] / last["trained_rows"],
            "scored_per_step": last["scored_rows"] / last["step"], "trained_per_step": last["trained_rows"] / last["step"],
            "cpu_per_step_ms": 1000 * last["cpu_s"] / last["step"], "il_cpu": il_cpu, "steps": last["step"]}


DIGITS = {"steps_to_target": 0, "cpu_to_target": 2, "cpu_to_target_with_il": 2}  # else 3 (accuracies, shares)


def mean_std(values, digits: int = 3) -> str:
    values = np.asarray(values, float)
    return (f"{values.mean():.{digits}f} ± {values.std(ddof=1):.{digits}f}" if len(values) > 1
            else f"{values.mean():.{digits}f}")


def paired(a: list[float], b: list[float], digits: int = 3) -> str:
    """mean of a − b with a paired-t 95% CI and p (n pairs)."""
    d = np.asarray(a, float) - np.asarray(b, float)
    n = len(d)
    if n < 2:
        return f"{d.mean():+.{digits}f} (n = {n})"
    if np.all(d == d[0]):
        return f"{d[0]:+.{digits}f} [all pairs equal] (n = {n})"
    half = stats.t.ppf(0.975, n - 1) * d.std(ddof=1) / np.sqrt(n)
    p = stats.ttest_rel(a, b).pvalue
    return (f"{d.mean():+.{digits}f} [{d.mean() - half:+.{digits}f}, {d.mean() + half:+.{digits}f}], p = {p:.3f} "
            f"(n = {n})")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows)]


def render(runs: dict, source: Path) -> str:
    ends = {key: endpoints(records) for key, records in runs.items()}
    noises = sorted({noise for _, noise, _ in ends}, reverse=True)
    seeds = lambda arm, noise: sorted(s for a, n, s in ends if a == arm and n == noise)  # noqa: E731
    out = [(RESULTS / "noisy_sst2_protocol.md").read_text().rstrip(), "",
           "# Results", "",
           f"Tables: `python -m experiments.noisy_sst2_summary {source} --out results/noisy_sst2/noisy_sst2.md` "
           f"(from the committed records). Date: 2026-11-24. Machine: 2-core CPU, no GPU (shared; CPU seconds are the "
           f"training process's own, one thread).", "",
           f"Runs: {len(ends)} ({', '.join(f'{a}: {sum(1 for k in ends if k[0] == a)}' for a in ARMS)}).", ""]

    def pairs(arm, noise, quantity):
        common = sorted(set(seeds(arm, noise)) & set(seeds("uniform", noise)))
        return ([ends[arm, noise, s][quantity] for s in common], [ends["uniform", noise, s][quantity] for s in common])

    out += ["## Primary endpoint", ""]
    if ("rho", 0.2, 0) in ends or seeds("rho", 0.2):
        a, b = pairs("rho", 0.2, "steps_to_target")
        missed = sum(not ends[k]["reached"] for k in ends if k[1] == 0.2 and k[0] in ("rho", "uniform"))
        out += [f"Steps to dev accuracy {TARGET} on the 20% noise set, rho − uniform, paired by seed: **{paired(a, b, 0)}** "
                f"(rho {mean_std(a, 0)}, uniform {mean_std(b, 0)}; runs that never reached it: {missed}).", ""]
    for noise in noises:
        out += [f"## {round(noise * 100)}% of the training labels flipped", ""]
        rows = []
        for arm in ARMS:
            keys = [(arm, noise, s) for s in seeds(arm, noise)]
            if not keys:
                continue
            e = [ends[k] for k in keys]
            get = lambda q: [x[q] for x in e]  # noqa: E731
            rows.append([arm, str(len(e)), f"{sum(get('reached'))}/{len(e)}", mean_std(get("steps_to_target"), 0),
                         mean_std(get("cpu_to_target"), 2), mean_std(get("cpu_to_target_with_il"), 2),
                         mean_std(get("final_accuracy")), mean_std(get("accuracy_at_budget")),
                         mean_std(get("peak_accuracy")), mean_std(get("mislabelled")),
                         f"{np.mean(get('scored_per_step')):.0f} / {np.mean(get('trained_per_step')):.1f}",
                         f"{np.mean(get('cpu_per_step_ms')):.2f}"])
        out += ["Mean ± std over seeds. Steps and CPU s to reach dev accuracy "
                f"{TARGET} (the run's end when never reached); accuracy at the last step ({e[0]['steps']}) and at "
                f"the last evaluation within {CPU_BUDGET:g} CPU s; share of trained rows with a flipped label; rows "
                "scored / trained per step.", ""]
        out += table(["arm", "seeds", "reached", "steps to X", "CPU s to X", "CPU s to X + IL model",
                      "final acc", f"acc @ {CPU_BUDGET:g} CPU s", "peak acc", "mislabelled share",
                      "scored / trained", "CPU ms / step"], rows) + [""]
        rows = []
        for arm in ARMS[1:]:
            if not seeds(arm, noise) or not seeds("uniform", noise):
                continue
            rows.append([arm, *(paired(*pairs(arm, noise, q), DIGITS.get(q, 3)) for q in
                                ("steps_to_target", "cpu_to_target", "final_accuracy", "accuracy_at_budget"))])
        out += ["Paired differences, arm − uniform (mean [95% paired-t CI], p):", ""]
        out += table(["arm", "steps to X", "CPU s to X", "final acc", f"acc @ {CPU_BUDGET:g} CPU s"], rows) + [""]
        common = set.intersection(*({r["step"] for r in runs[k]} for k in runs if k[1] == noise))
        checkpoints = [c for c in (500, 1000, 2000, 3000) if c in common] or [max(common)]
        rows = []
        for arm in ARMS:
            keys = [(arm, noise, s) for s in seeds(arm, noise)]
            if keys:
                rows.append([arm, *(mean_std([next(r["dev_accuracy"] for r in runs[k] if r["step"] == c)
                                              for k in keys]) for c in checkpoints)])
        out += ["Dev accuracy at equal steps:", ""]
        out += table(["arm", *(f"step {c}" for c in checkpoints)], rows) + [""]
    il = [ends[k]["il_cpu"] for k in ends if k[0] == "rho"]
    if il:
        heldout = next(r[0]["n_heldout"] for k, r in runs.items() if k[0] == "rho")
        out += ["## Cost of the irreducible losses (RHO-LOSS)", "",
                f"Training the irreducible-loss model on the held-out split ({heldout} examples, 2 epochs) and scoring "
                f"the {runs[next(k for k in runs if k[0] == 'rho')][0]['n_train']} training examples: "
                f"{mean_std(il, 2)} CPU s per (noise, seed), {len(il)} models; already included in the "
                "\"CPU s to X + IL model\" column.", ""]
    reading = RESULTS / "noisy_sst2_reading.md"
    if reading.exists():
        out += [reading.read_text().rstrip(), ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    emit(render(load_runs(args.records), args.records), args.out)


def emit(text: str, out: Path | None) -> None:
    """Write the page to ``out``, or print it."""
    if out:
        out.write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()

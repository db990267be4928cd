"""Tables and figures of issue 11's phase 2 from the runs of experiments/reproduce_tmr_cpu.py (any subset done).

    python experiments/reproduce_tmr_summary.py runs/reproduce_tmr     # -> results/reproduction_tables.md + .png

- Held-out AUC and L_D (the same corrupted tokens for every run) at 25/50/100% of the steps: mean ± sample std
  over seeds, and the paired difference TMR - ELECTRA (same seed) with a percentile-bootstrap 95% CI.
- Curves (the paper's Fig. 2 and Fig. 3 analogues): held-out AUC and L_D above the base-rate entropy, mean over
  seeds with a 95% t band, against steps and against wall time. A run's wall-time axis is its step count times
  the median step time of its arm: the runs shared a 2-core machine with other work, so per-step medians are
  the stable measure of cost.
- Runtime (paper Table 2 analogue) and drift (generator change rate, replaced-token accuracy on fresh against
  replayed rows, age of replayed examples) over training.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, so this runs from any cwd
from experiments.reproduce_tmr_cpu import ABLATIONS, ARMS, EXTRA_ARMS, GLUE_TASKS, STEPS  # noqa: E402
from experiments.run_queue import REPO  # noqa: E402
from integrations.electra.common import format_mean_std  # noqa: E402
from integrations.electra.finetune.tasks import GLUE_TASKS as GLUE_TABLE  # noqa: E402
from integrations.electra.pretrain.metrics import read_metrics  # noqa: E402
MARKS = (STEPS // 4, STEPS // 2, STEPS)  # 25, 50, 100% of the steps
THRESHOLD = 0.6  # "has escaped the plateau": held-out AUC this high (the collapsed discriminator sits at 0.5)


def load_runs(out: Path) -> dict[str, dict[int, list[dict]]]:
    """arm -> seed -> metrics records, for every finished arm run (with the derived weight ESS fraction)."""
    runs: dict[str, dict[int, list[dict]]] = {}
    for run in sorted((out / "pretrain").glob("*-seed*")):
        if not (run / "summary.json").exists():
            continue
        arm, seed = run.name.rsplit("-seed", 1)
        records = read_metrics(run / "metrics.jsonl")
        for r in records:
            if r.get("buffer_weight_std") is not None and r.get("buffer_weight_mean"):
                r["weight_ess_fraction"] = 1.0 / (1.0 + (r["buffer_weight_std"] / r["buffer_weight_mean"]) ** 2)
        runs.setdefault(arm, {})[int(seed)] = records
    return runs


def at(records: list[dict], key: str, step: int) -> float:
    return next((r[key] for r in records if r["step"] == step and r.get(key) is not None), float("nan"))


def curve(records: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    steps, values = zip(*points) if points else ((), ())
    return np.asarray(steps), np.asarray(values, float)


def window_mean(records: list[dict], key: str, first: int, last: int) -> float:
    values = [r[key] for r in records if first <= r["step"] <= last and r.get(key) is not None]
    return float(np.mean(values)) if values else float("nan")


def finite_mean(values: list[float]) -> float:
    values = [v for v in values if np.isfinite(v)]
    return float(np.mean(values)) if values else float("nan")


def auc_area(records: list[dict]) -> float:
    """Mean held-out AUC over every scoring step: one number for 'how good, how early'."""
    return float(np.mean(curve(records, "heldout_auc")[1]))


def first_step_over(records: list[dict], threshold: float = THRESHOLD) -> float:
    """First scoring step whose held-out AUC is at least ``threshold`` (NaN if never)."""
    steps, values = curve(records, "heldout_auc")
    over = np.flatnonzero(values >= threshold)
    return float(steps[over[0]]) if len(over) else float("nan")


def paired_difference(arm: dict, base: dict, value, digits: int = 4) -> str:
    """Mean of value(arm[seed]) - value(base[seed]) over the seeds both have, with a percentile-bootstrap 95% CI
    and the paired t-test's two-sided p (n >= 3)."""
    seeds = sorted(set(arm) & set(base))
    diffs = np.array([value(arm[s]) - value(base[s]) for s in seeds])
    diffs = diffs[np.isfinite(diffs)]
    if len(diffs) == 0:
        return "–"
    if len(diffs) < 3:
        return f"{diffs.mean():+.{digits}f} (n={len(diffs)}, no CI)"
    ci = stats.bootstrap((diffs,), np.mean, confidence_level=0.95, method="percentile", n_resamples=10_000,
                         random_state=0).confidence_interval
    p = stats.ttest_1samp(diffs, 0.0).pvalue  # the paired t-test: differences against 0
    return f"{diffs.mean():+.{digits}f} [{ci.low:+.{digits}f}, {ci.high:+.{digits}f}] (n={len(diffs)}, p={p:.2g})"


def band(runs: dict[int, list[dict]], key: str, gap_key: str | None = None):
    """Steps and the mean with a 95% t band over seeds of ``key`` (minus ``gap_key`` when given)."""
    series = []
    for records in runs.values():
        steps, values = curve(records, key)
        if gap_key is not None:
            values = values - curve(records, gap_key)[1]
        series.append((steps, values))
    length = min(len(v) for _, v in series)
    steps = series[0][0][:length]
    matrix = np.array([v[:length] for _, v in series])
    mean = matrix.mean(0)
    if len(matrix) < 2:
        return steps, mean, mean, mean
    half = stats.t.ppf(0.975, len(matrix) - 1) * matrix.std(0, ddof=1) / np.sqrt(len(matrix))
    return steps, mean, mean - half, mean + half


def median_step_seconds(runs: dict[int, list[dict]]) -> float:
    return float(np.median([r["step_seconds"] for records in runs.values() for r in records[1:]]))


def plot(runs: dict[str, dict[int, list[dict]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("heldout_auc", None, "held-out AUC (same tokens for every run)"),
              ("heldout_loss", "heldout_base_entropy", "held-out L_D minus base-rate entropy")]
    fig, axes = plt.subplots(2, 2, figsize=(13, 8))
    for row, (key, gap, title) in enumerate(panels):
        for index, (arm, seeds) in enumerate(runs.items()):
            steps, mean, low, high = band(seeds, key, gap)
            for col, scale in enumerate((1.0, median_step_seconds(seeds) / 60)):
                ax = axes[row, col]
                x = steps * scale
                ax.plot(x, mean, color=f"C{index}", label=f"{arm} (n={len(seeds)})")
                ax.fill_between(x, low, high, color=f"C{index}", alpha=0.2)
        for col, xlabel in enumerate(("step", "minutes (steps x the arm's median step time, 1 thread)")):
            axes[row, col].set_title(title + (" vs wall time" if col else ""))
            axes[row, col].set_xlabel(xlabel)
            axes[row, col].grid(alpha=0.3)
    axes[0, 0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def paired_table(runs: dict[str, dict[int, list[dict]]], base_arm: str, arms: list[str]) -> list[str]:
    """Each arm minus ``base_arm`` on the same seed: held-out AUC and L_D at the marks, the mean AUC over
    training and the first step at the threshold."""
    base = runs.get(base_arm)
    if not base or not arms:
        return []
    lines = ["", f"## Paired difference arm − {base_arm} (same seed), mean [bootstrap 95% CI] (n, paired t-test p)",
             "", "| arm | " + " | ".join(f"ΔAUC @ {m:,}" for m in MARKS) + " | "
             + " | ".join(f"ΔL_D @ {m:,}" for m in MARKS) + f" | Δ mean AUC over training | Δ first step AUC ≥ "
             f"{THRESHOLD} |", "|---|" + "---|" * (2 * len(MARKS) + 2)]
    for arm in arms:
        seeds = runs[arm]
        cells = [paired_difference(seeds, base, lambda r, m=m: at(r, "heldout_auc", m)) for m in MARKS]
        cells += [paired_difference(seeds, base, lambda r, m=m: at(r, "heldout_loss", m)) for m in MARKS]
        cells += [paired_difference(seeds, base, auc_area), paired_difference(seeds, base, first_step_over, 0)]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines


def tables(runs: dict[str, dict[int, list[dict]]]) -> list[str]:
    base = runs.get("electra", {})
    marks = ", ".join(f"{m:,}" for m in MARKS)
    lines = [f"## Held-out discriminator scores at steps {marks} (mean ± std over seeds)", "",
             "| arm | seeds | " + " | ".join(f"AUC @ {m:,}" for m in MARKS) + " | "
             + " | ".join(f"L_D @ {m:,}" for m in MARKS) + f" | mean AUC over training | first step AUC ≥ {THRESHOLD} "
             "| fresh AUC, last 500 steps |", "|---|---|" + "---|" * (2 * len(MARKS) + 3)]
    for arm, seeds in runs.items():
        cells = [format_mean_std([at(r, "heldout_auc", m) for r in seeds.values()]) for m in MARKS]
        cells += [format_mean_std([at(r, "heldout_loss", m) for r in seeds.values()]) for m in MARKS]
        cells += [format_mean_std([auc_area(r) for r in seeds.values()]), format_mean_std([first_step_over(r) for r in seeds.values()], 0)]
        cells.append(format_mean_std([window_mean(r, "replaced_auc_fresh", STEPS - 499, STEPS) for r in seeds.values()]))
        lines.append(f"| {arm} | {len(seeds)} ({', '.join(map(str, sorted(seeds)))}) | " + " | ".join(cells) + " |")
    lines += paired_table(runs, "electra", [arm for arm in runs if arm != "electra"])
    # the ablations and the other weightings against the paper's main variant: what does the weighting add?
    lines += paired_table(runs, "tmr-loss_diff", [arm for arm in runs if arm not in ("electra", "tmr-loss_diff")])
    lines += ["", "## Per seed: held-out AUC at each mark, mean held-out AUC over training, first step at AUC ≥ "
              f"{THRESHOLD}", "", "| seed | " + " | ".join(runs) + " |", "|---|" + "---|" * len(runs)]
    for seed in sorted({s for seeds in runs.values() for s in seeds}):
        cells = []
        for seeds in runs.values():
            r = seeds.get(seed)
            cells.append("–" if r is None else " / ".join(f"{at(r, 'heldout_auc', m):.3f}" for m in MARKS)
                         + f"; {auc_area(r):.3f}; {first_step_over(r):.0f}")
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    lines += ["", "## Runtime (paper Table 2 analogue), measured in these runs", "",
              "| arm | median s/step | relative to electra | producer s/step (mask + generator) | "
              "wall minutes for the steps at the median |", "|---|---|---|---|---|"]
    electra_step = median_step_seconds(base) if base else float("nan")
    for arm, seeds in runs.items():
        step = median_step_seconds(seeds)
        produce = float(np.median([r["produce_seconds"] for rs in seeds.values() for r in rs[1:]]))
        lines.append(f"| {arm} | {step:.3f} | {step / electra_step:.2f}× | {produce:.3f} | {step * STEPS / 60:.1f} |")
    windows = [(1, STEPS // 4), (STEPS // 4 + 1, STEPS // 2), (STEPS // 2 + 1, STEPS)]
    lines += ["", "## Drift over training (mean over steps in each window, then over seeds)", "",
              "generator change rate = share of masked tokens the generator replaced with another token; "
              "replaced-token accuracy = share of replaced tokens the discriminator flags, on the rows produced "
              "this step (fresh) and on replayed rows. Weight ESS / N = 1 / (1 + CV²) of the buffer's weights: the "
              "share of the buffer that sampling effectively draws from when P ∝ w (α = 1; the uniform ablations "
              "sample with α = 0, so theirs is 1 whatever the weights). Visits = mean number of times the buffered "
              "examples have been sampled: what the eviction rule keeps.", "",
              "| arm | steps | generator change rate | replaced acc. fresh | replaced acc. replayed | "
              "fresh AUC | age of sampled examples | weight ESS / N | visits of buffered examples |",
              "|---|---|---|---|---|---|---|---|---|"]
    for arm, seeds in runs.items():
        for first, last in windows:
            cells = [finite_mean([window_mean(r, key, first, last) for r in seeds.values()])
                     for key in ("changed_fraction_produced", "replaced_accuracy_fresh",
                                 "replaced_accuracy_replayed", "replaced_auc_fresh", "sample_age_mean",
                                 "weight_ess_fraction", "buffer_mean_visits")]
            lines.append(f"| {arm} | {first:,}–{last:,} | " + " | ".join(
                "–" if not np.isfinite(c) else f"{c:.3f}" for c in cells) + " |")
    return lines


def load_finetuning(out: Path) -> dict[tuple[str, int], dict[int, dict[str, float]]]:
    """(arm, step) -> pretraining seed -> task -> main GLUE metric x 100, averaged over fine-tuning seeds, for
    every finished fine-tuning job (OUT/finetune/ARM-seedS-atSTEP/results_runs.jsonl)."""
    scores: dict[tuple[str, int], dict[int, dict[str, float]]] = {}
    for job in sorted((out / "finetune").glob("*-seed*-at*")):
        if not (job / "results.md").exists():
            continue
        run, step = job.name.rsplit("-at", 1)
        arm, seed = run.rsplit("-seed", 1)
        with open(job / "results_runs.jsonl") as lines:
            rows = [json.loads(line) for line in lines]
        scores.setdefault((arm, int(step)), {})[int(seed)] = {
            task: 100 * float(np.mean([r[GLUE_TABLE[task].main_metric] for r in rows if r["task"] == task]))
            for task in GLUE_TASKS if any(r["task"] == task for r in rows)}
    return scores


def majority_scores() -> dict[str, float]:
    """Each task's main dev metric × 100 for always predicting its most common training label, from the GLUE data
    fine-tuning uses (../shared/data/glue); empty without it. STS-B is scored 0: a constant prediction has no rank
    correlation."""
    from integrations.electra.finetune.options import default_data_dir
    from integrations.electra.finetune.glue import get_task, load_glue_split
    from integrations.electra.finetune.sources import DataSource

    glue_dir = default_data_dir("glue")
    if glue_dir is None:
        return {}
    source, scores = DataSource(local_dir=Path(glue_dir)), {}
    for name in GLUE_TASKS:
        task = get_task(name)
        if task.is_regression:
            scores[name] = 0.0
            continue
        train_labels = load_glue_split(task, "train", source)["label"]
        majority = max(set(train_labels), key=train_labels.count)
        dev_labels = load_glue_split(task, "validation", source)["label"]
        scores[name] = 100 * task.score([majority] * len(dev_labels), dev_labels)[task.main_metric]
    return scores


def finetune_tables(scores: dict[tuple[str, int], dict[int, dict[str, float]]]) -> list[str]:
    """Table-1 layout (rows: arm at a step; cells: mean ± std over pretraining seeds) and the paired TMR − ELECTRA
    difference of the 5-task average."""
    if not scores:
        return ["", "## GLUE dev (fine-tuning)", "", "No fine-tuning job has finished yet."]
    names = {"cola": "CoLA MCC", "sst2": "SST-2 acc", "mrpc": "MRPC acc", "stsb": "STS-B Spearman", "rte": "RTE acc"}
    lines = ["", "## GLUE dev, × 100 (mean ± std over pretraining seeds; each seed's score is the mean of "
             "fine-tuning seeds 0-2)", "",
             "| arm | step | seeds | " + " | ".join(names[t] for t in GLUE_TASKS) + " | 5-task avg |",
             "|---|---|---|" + "---|" * (len(GLUE_TASKS) + 1)]

    def average(per_task: dict[str, float]) -> float:
        return float(np.mean([per_task[t] for t in GLUE_TASKS])) if all(t in per_task for t in GLUE_TASKS) \
            else float("nan")

    majority = majority_scores()
    if majority:
        lines.append("| majority class (most common training label) | – | – | "
                     + " | ".join(f"{majority[t]:.1f}" for t in GLUE_TASKS) + f" | {average(majority):.1f} |")
    for (arm, step), seeds in sorted(scores.items(), key=lambda item: ((*ARMS, *EXTRA_ARMS, *ABLATIONS).index(item[0][0]),
                                                                         item[0][1])):
        cells = [format_mean_std([seeds[s].get(t, float("nan")) for s in seeds], 1) for t in GLUE_TASKS]
        cells.append(format_mean_std([average(seeds[s]) for s in seeds], 1))
        lines.append(f"| {arm} | {step:,} | {len(seeds)} | " + " | ".join(cells) + " |")
    lines += ["", "Paired difference TMR − ELECTRA (same pretraining seed), per task and of the 5-task average, mean "
              "[bootstrap 95% CI] (n, paired t-test p):", "",
              "| arm | step | " + " | ".join(f"Δ {names[t]}" for t in GLUE_TASKS) + " | Δ 5-task avg |",
              "|---|---|" + "---|" * (len(GLUE_TASKS) + 1)]
    for (arm, step), seeds in sorted(scores.items()):
        base = scores.get(("electra", step))
        if arm == "electra" or not base:
            continue
        cells = [paired_difference(seeds, base, lambda per_task, t=t: per_task.get(t, float("nan")), 2)
                 for t in GLUE_TASKS]
        cells.append(paired_difference(seeds, base, average, 2))
        lines.append(f"| {arm} | {step:,} | " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", default=str(REPO / "runs" / "reproduce_tmr"))
    parser.add_argument("--results", default=str(REPO / "results"))
    args = parser.parse_args()
    out, results = Path(args.out), Path(args.results)
    loaded = load_runs(out)
    runs = {arm: loaded[arm] for arm in (*ARMS, *EXTRA_ARMS, *ABLATIONS) if arm in loaded}
    if not runs:
        print(f"no finished runs under {out / 'pretrain'}", file=sys.stderr)
        return 1
    heldout = json.loads((out / "heldout.json").read_text()) if (out / "heldout.json").exists() else {}
    header = ["# Phase 2 tables (generated)", "",
              f"Made by `python experiments/reproduce_tmr_summary.py {args.out}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
              " from the finished runs of `python experiments/reproduce_tmr_cpu.py`; machine: 2 CPU cores, no GPU, one "
              "torch thread per run, two runs at a time. Plot: `reproduction_curves.png`.", ""]
    if heldout:
        header += [f"Held-out set: {heldout.get('examples')} examples of {heldout.get('max_len')} tokens from "
                   f"python-docs lines {heldout.get('start_line'):,} on, corrupted once by the reference generator "
                   f"(replaced share {heldout.get('replaced_share', float('nan')):.4f}).", ""]
    results.mkdir(parents=True, exist_ok=True)
    body = tables(runs) + finetune_tables(load_finetuning(out))
    (results / "reproduction_tables.md").write_text("\n".join(header + body) + "\n")
    plot(runs, results / "reproduction_curves.png")
    print(f"wrote {results / 'reproduction_tables.md'} and {results / 'reproduction_curves.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Result tables laid out like the TMR paper's Table 1: checkpoints as rows, tasks as columns.

Cells are mean ± sample standard deviation over fine-tuning seeds (just the mean for one seed).
GLUE scores are fractions (the paper's scale), SQuAD EM/F1 are percentages (the official script's).
Every table states the train/eval subset sizes it was computed on.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Sequence

from .glue_data import GLUE_EIGHT, GLUE_TASKS
from .metrics import MAIN_METRIC

_COUNT_KEYS = ("train_examples", "train_examples_total", "eval_examples", "eval_examples_total")


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None for a single value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def format_cell(values: Sequence[float], digits: int = 3) -> str:
    if not values:
        return "–"
    mean, std = mean_std(values)
    return f"{mean:.{digits}f}" if std is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def _checkpoints(rows: Iterable[dict]) -> list[str]:
    return list(dict.fromkeys(r["checkpoint"] for r in rows))


def _by_checkpoint_task(rows: Iterable[dict]) -> dict[tuple[str, str], list[dict]]:
    grouped: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in rows:
        grouped[(row["checkpoint"], row["task"])].append(row)
    return grouped


def glue_average_per_seed(runs_by_task: dict[str, list[dict]]) -> list[float]:
    """Average of the eight main scores per seed, for seeds that every task was run with."""
    seeds = set.intersection(*(set(r["seed"] for r in runs_by_task[t]) for t in GLUE_EIGHT))
    averages = []
    for seed in sorted(seeds):
        scores = [next(r[MAIN_METRIC[t]] for r in runs_by_task[t] if r["seed"] == seed) for t in GLUE_EIGHT]
        averages.append(sum(scores) / len(scores))
    return averages


def glue_table(rows: Sequence[dict]) -> tuple[list[str], list[list[str]]]:
    """Header and body of the Table 1 layout for the GLUE tasks present in ``rows``."""
    grouped = _by_checkpoint_task(r for r in rows if r["task"] in GLUE_TASKS)
    present = {task for _, task in grouped}
    tasks = [t for t in GLUE_EIGHT if t in present] + (["wnli"] if "wnli" in present else [])
    with_average = all(t in present for t in GLUE_EIGHT)
    header = ["Model"] + [GLUE_TASKS[t].table_name for t in tasks] + (["Avg."] if with_average else [])
    body = []
    for checkpoint in _checkpoints(rows):
        runs = {t: grouped.get((checkpoint, t), []) for t in tasks}
        line = [checkpoint] + [format_cell([r[MAIN_METRIC[t]] for r in runs[t]]) for t in tasks]
        if with_average:
            complete = all(runs[t] for t in GLUE_EIGHT)
            per_seed = glue_average_per_seed(runs) if complete else []
            if complete and not per_seed:  # tasks run with disjoint seeds: average of the means
                line.append(f"{sum(mean_std([r[MAIN_METRIC[t]] for r in runs[t]])[0] for t in GLUE_EIGHT) / 8:.3f}")
            else:
                line.append(format_cell(per_seed))
        body.append(line)
    return header, body


def squad_table(rows: Sequence[dict]) -> tuple[list[str], list[list[str]]]:
    """Checkpoint rows with EM and F1, and the question subsets they were measured on."""
    grouped = _by_checkpoint_task(r for r in rows if r["task"] == "squad")
    header = ["Model", "SQuAD EM", "SQuAD F1", "Train questions", "Dev questions", "Subset seed"]
    body = []
    for checkpoint in _checkpoints(rows):
        runs = grouped.get((checkpoint, "squad"))
        if not runs:
            continue
        first = runs[0]
        body.append([checkpoint, format_cell([r["exact_match"] for r in runs], 1), format_cell([r["f1"] for r in runs], 1),
                     f"{first['train_examples']} of {first['train_examples_total']}",
                     f"{first['eval_examples']} of {first['eval_examples_total']}", str(first["subset_seed"])])
    return header, body


def detail_table(rows: Sequence[dict]) -> tuple[list[str], list[list[str]]]:
    """Every metric (MNLI-mm, F1s, Pearson, ...) and the train loss of the first and last epoch."""
    header = ["Model", "Task", "Seeds", "Metrics", "Train loss (first → last epoch)", "Train s/run"]
    body = []
    for (checkpoint, task), runs in _by_checkpoint_task(rows).items():
        metric_names = [k for k in runs[0] if k in _METRIC_KEYS]
        metrics = ", ".join(f"{k} {format_cell([r[k] for r in runs], 1 if task == 'squad' else 3)}" for k in metric_names)
        first = format_cell([r["train_loss_first_epoch"] for r in runs])
        last = format_cell([r["train_loss_last_epoch"] for r in runs])
        losses = f"{first} → {last}"
        seconds = f"{mean_std([r['train_seconds'] for r in runs])[0]:.1f}"
        body.append([checkpoint, task, " ".join(str(r["seed"]) for r in runs), metrics, losses, seconds])
    return header, body


_METRIC_KEYS = {"accuracy", "accuracy_mm", "mcc", "spearman", "pearson", "f1", "exact_match"}


def subset_notes(rows: Sequence[dict]) -> list[str]:
    """One line per task: how many train and eval examples (of how many) were used, and the subset seed."""
    notes = []
    seen = set()
    for row in rows:
        key = (row["task"],) + tuple(row.get(k) for k in _COUNT_KEYS)
        if key in seen:
            continue
        seen.add(key)
        unit = "questions" if row["task"] == "squad" else "examples"
        notes.append(
            f"{row['task']}: train {row['train_examples']:,} of {row['train_examples_total']:,} {unit}, "
            f"eval {row['eval_examples']:,} of {row['eval_examples_total']:,} "
            f"(subset seed {row['subset_seed']}; data: {row.get('data_source', '?')})"
        )
    return notes


def markdown_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def render_markdown(rows: Sequence[dict], title: str = "Fine-tuning results") -> str:
    """The whole report: GLUE table, SQuAD table, details and the subset sizes."""
    parts = [f"## {title}", ""]
    seeds = sorted({r["seed"] for r in rows})
    parts.append(f"Mean ± sample std over fine-tuning seeds {seeds}. GLUE: dev sets, fractions; CoLA = Matthews corr., "
                 "STS = Spearman, MNLI = matched accuracy, others accuracy. SQuAD v1.1 dev: EM/F1 in percent.")
    parts.append("")
    parts += ["Data used:"] + [f"- {n}" for n in subset_notes(rows)] + [""]
    glue_header, glue_body = glue_table(rows)
    if glue_body and len(glue_header) > 1:
        parts += ["### GLUE", "", markdown_table(glue_header, glue_body), ""]
    squad_header, squad_body = squad_table(rows)
    if squad_body:
        parts += ["### SQuAD v1.1", "", markdown_table(squad_header, squad_body), ""]
    parts += ["### All metrics", "", markdown_table(*detail_table(rows)), ""]
    return "\n".join(parts)


def _csv_text(header: Sequence[str], body: Sequence[Sequence]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(body)
    return buffer.getvalue()


def write_results(rows: Sequence[dict], output_dir: str | Path, title: str = "Fine-tuning results") -> dict[str, Path]:
    """Write results.md, the Table 1 CSVs (glue/squad) and one CSV + JSONL row per run."""
    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": output / "results.md", "runs_csv": output / "results_runs.csv",
             "runs_jsonl": output / "results_runs.jsonl"}
    paths["markdown"].write_text(render_markdown(rows, title), encoding="utf-8")
    glue_header, glue_body = glue_table(rows)
    if glue_body and len(glue_header) > 1:
        paths["glue_csv"] = output / "results_glue.csv"
        paths["glue_csv"].write_text(_csv_text(glue_header, glue_body), encoding="utf-8")
    squad_header, squad_body = squad_table(rows)
    if squad_body:
        paths["squad_csv"] = output / "results_squad.csv"
        paths["squad_csv"].write_text(_csv_text(squad_header, squad_body), encoding="utf-8")
    columns = list(dict.fromkeys(k for r in rows for k in r))
    paths["runs_csv"].write_text(_csv_text(columns, [[r.get(c, "") for c in columns] for r in rows]), encoding="utf-8")
    paths["runs_jsonl"].write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return paths

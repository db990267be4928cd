"""Python entry points (fine-tune named checkpoints on GLUE tasks or SQuAD, collect result rows) and the result
tables laid out like the TMR paper's Table 1.

Each entry point returns one row (a flat dict) per checkpoint × task × seed, writes each row to
``<output_dir>/runs/<checkpoint>/<task>/seed<k>.json`` and, unless ``write_tables=False``, the
result tables (``results.md`` and CSVs, see `write_results` below) for the rows it produced.

Tables: checkpoints as rows, tasks as columns. Cells are mean ± sample standard deviation over fine-tuning
seeds (just the mean for one seed). GLUE scores are fractions (the paper's scale), SQuAD EM/F1 are percentages (the official script's).
Every table states the train/eval subset sizes it was computed on.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterable, Sequence

from replayloader.state import atomic_write_text

from ..errors import UserError
from ..runtime import pick_device
from ..stats import format_mean_std, mean_std
from .glue import (check_local_files, encode_glue_split, get_task, GLUE_EIGHT, GLUE_HUB_NAME, GLUE_TASKS,
                   load_glue_split, run_glue_seed, seeded_subset)
from .options import (DEFAULT_OUTPUT_DIR, DEFAULT_SEEDS, GlueOptions, SquadOptions, SubsetOptions, TrainingOptions,
                      split_options)
from .sources import check_checkpoint_location, load_checkpoint_tokenizer, load_encoder, resolve_data_source
from .squad import build_squad_windows, load_squad_split, run_squad_seed, SQUAD_HUB_NAME
from .training import resolve_config


# --------------------------------------------------------------------------------------------------
# Python entry points: fine-tune named checkpoints on GLUE tasks or SQuAD and collect result rows.
def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _check_common(checkpoint_dirs: dict[str, str], seeds: Sequence[int]) -> None:
    if not checkpoint_dirs:
        raise UserError("no checkpoint given (use --checkpoint DIR or NAME=DIR)")
    if not seeds:
        raise UserError("no seed given")
    for location in checkpoint_dirs.values():  # before any data is read: a typo should not wait for a download
        check_checkpoint_location(location)


def _fit_length(encoder, requested: int, log: Callable[[str], None]) -> int:
    """Cap a sequence length at the checkpoint's number of position embeddings."""
    limit = getattr(encoder.config, "max_position_embeddings", None)
    if limit is not None and requested > limit:
        log(f"warning: the checkpoint has {limit} positions; using max length {limit} instead of {requested}")
        return int(limit)
    return requested


def _save_row(row: dict, output_dir: Path, extra: dict | None = None) -> None:
    run_dir = output_dir / "runs" / row["checkpoint"] / row["task"]
    run_dir.mkdir(parents=True, exist_ok=True)
    for name, payload in (extra or {}).items():  # the row last, so a row on disk has its extras
        atomic_write_text(run_dir / f"seed{row['seed']}.{name}.json", json.dumps(payload, indent=1) + "\n")
    atomic_write_text(run_dir / f"seed{row['seed']}.json", json.dumps(row, indent=2) + "\n")


def _training_fields(config, stats) -> dict:
    return {
        "preset": config.preset,
        "learning_rate": config.learning_rate,
        "layer_decay": config.layer_decay,
        "epochs": config.epochs,
        "batch_size": config.batch_size,
        "sampling": config.sampling,
        "train_steps": stats.steps,
        "train_seconds": round(stats.seconds, 3),
        "train_loss_first_epoch": stats.epoch_mean_losses[0],
        "train_loss_last_epoch": stats.epoch_mean_losses[-1],
    }


def finetune_glue_task(
    checkpoint_dirs: dict[str, str],
    task: str,
    data_dir: str | None,
    max_train_examples: int | None,
    max_eval_examples: int | None,
    seeds: Sequence[int],
    output_dir: str,
    *,
    write_tables: bool = True,
    **options,
) -> list[dict]:
    """Fine-tune every checkpoint on one GLUE task with each seed; score the task's dev set(s).

    ``data_dir``: directory in the official ``glue_data`` layout, or None/"hub"/"hf:NAME" for the hub.
    Subsets (``max_*_examples``) are drawn once with ``subset_seed`` and shared by all runs.
    ``options``: fields of `TrainingOptions` (``learning_rate``, ``epochs``, ``batch_size``, ``preset``,
    ``layer_decay``, ``sampling``, ``amp``, ``device``, ``progress``), `GlueOptions` (``max_length``) and
    ``subset_seed``, with the same defaults as the command line's flags.
    """
    training, glue, subset = split_options(
        {**options, "max_train_examples": max_train_examples, "max_eval_examples": max_eval_examples,
         "seeds": list(seeds)}, TrainingOptions, GlueOptions, SubsetOptions)
    _check_common(checkpoint_dirs, subset.seeds)
    spec = get_task(task)
    source = resolve_data_source(data_dir, GLUE_HUB_NAME, "GLUE")
    check_local_files(spec, source)
    log = _stderr if training.progress else (lambda message: None)
    torch_device = pick_device(training.device)
    train_full = load_glue_split(spec, "train", source)
    eval_full = {split: load_glue_split(spec, split, source) for split in spec.eval_splits}
    train_data = seeded_subset(train_full, subset.max_train_examples, subset.subset_seed)
    eval_data = {split: seeded_subset(d, subset.max_eval_examples, subset.subset_seed) for split, d in eval_full.items()}
    counts = {"train_examples": len(train_data), "train_examples_total": len(train_full)}
    for split, (_, suffix) in spec.eval_splits.items():
        counts[f"eval_examples{suffix}"] = len(eval_data[split])
        counts[f"eval_examples_total{suffix}"] = len(eval_full[split])
    output = Path(output_dir)
    rows: list[dict] = []
    for name, location in checkpoint_dirs.items():
        tokenizer = load_checkpoint_tokenizer(location)
        encoder = load_encoder(location)
        length = _fit_length(encoder, glue.max_length, log)
        train_features = encode_glue_split(train_data, spec, tokenizer, length)
        eval_features = {split: encode_glue_split(d, spec, tokenizer, length) for split, d in eval_data.items()}
        config = resolve_config(encoder.config.hidden_size, spec.epochs, torch_device, **asdict(training))
        for seed in subset.seeds:
            result = run_glue_seed(encoder, spec, train_features, eval_features, tokenizer.pad_token_id, config, seed,
                                   torch_device, description=f"{name} {task} seed {seed}", progress=training.progress)
            row = {"checkpoint": name, "task": task, "seed": seed, **result.metrics, **counts,
                   "subset_seed": subset.subset_seed, "data_source": source.describe(), "max_length": length,
                   **_training_fields(config, result.stats), "checkpoint_location": location}
            _save_row(row, output)
            rows.append(row)
            scores = ", ".join(f"{k} {v:.4f}" for k, v in result.metrics.items())
            log(f"[finetune] {name} {task} seed {seed}: {scores} ({result.stats.seconds:.1f} s)")
    if write_tables:
        write_results(rows, output)
    return rows


def finetune_glue(
    checkpoint_dirs: dict[str, str],
    tasks: Sequence[str] = GLUE_EIGHT,
    data_dir: str | None = None,
    max_train_examples: int | None = None,
    max_eval_examples: int | None = None,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    output_dir: str = DEFAULT_OUTPUT_DIR,
    **options,
) -> list[dict]:
    """Several GLUE tasks (default: the eight of the average) and one combined table; ``options`` as for
    `finetune_glue_task`."""
    spec_source = resolve_data_source(data_dir, GLUE_HUB_NAME, "GLUE")
    for task in tasks:  # fail on a missing file before hours of training on the other tasks
        check_local_files(get_task(task), spec_source)
    rows: list[dict] = []
    for task in tasks:
        rows += finetune_glue_task(checkpoint_dirs, task, data_dir, max_train_examples, max_eval_examples,
                                   list(seeds), output_dir, write_tables=False, **options)
    write_results(rows, output_dir)
    return rows


def finetune_squad(
    checkpoint_dirs: dict[str, str],
    data_dir: str | None,
    max_train_examples: int | None,
    max_eval_examples: int | None,
    seeds: Sequence[int],
    output_dir: str,
    *,
    write_tables: bool = True,
    **options,
) -> list[dict]:
    """Fine-tune every checkpoint on SQuAD v1.1 train (2 epochs by default, as ELECTRA) with each seed;
    EM/F1 on the dev set. ``max_*_examples`` count questions. ``options``: fields of `TrainingOptions`,
    `SquadOptions` (``max_seq_length``, ``doc_stride`` = the window step, ``max_query_length``, ``n_best``,
    ``max_answer_length``) and ``subset_seed``."""
    training, squad, subset = split_options(
        {**options, "max_train_examples": max_train_examples, "max_eval_examples": max_eval_examples,
         "seeds": list(seeds)}, TrainingOptions, SquadOptions, SubsetOptions)
    _check_common(checkpoint_dirs, subset.seeds)
    source = resolve_data_source(data_dir, SQUAD_HUB_NAME, "SQuAD")
    log = _stderr if training.progress else (lambda message: None)
    torch_device = pick_device(training.device)
    train_full = load_squad_split(source, "train")
    eval_full = load_squad_split(source, "validation")
    train_data = seeded_subset(train_full, subset.max_train_examples, subset.subset_seed)
    eval_data = seeded_subset(eval_full, subset.max_eval_examples, subset.subset_seed)
    counts = {"train_examples": len(train_data), "train_examples_total": len(train_full),
              "eval_examples": len(eval_data), "eval_examples_total": len(eval_full)}
    output = Path(output_dir)
    rows: list[dict] = []
    for name, location in checkpoint_dirs.items():
        tokenizer = load_checkpoint_tokenizer(location)
        encoder = load_encoder(location)
        length = _fit_length(encoder, squad.max_seq_length, log)
        window_options = {"max_seq_length": length, "doc_stride": squad.doc_stride,
                          "max_query_length": squad.max_query_length}
        train_windows = build_squad_windows(train_data, tokenizer, with_labels=True, **window_options)
        eval_windows = build_squad_windows(eval_data, tokenizer, with_labels=False, **window_options)
        config = resolve_config(encoder.config.hidden_size, 2, torch_device, **asdict(training))
        for seed in subset.seeds:
            result = run_squad_seed(encoder, train_windows, eval_windows, eval_data, tokenizer.pad_token_id, config,
                                    seed, torch_device, n_best=squad.n_best, max_answer_length=squad.max_answer_length,
                                    description=f"{name} squad seed {seed}", progress=training.progress)
            row = {"checkpoint": name, "task": "squad", "seed": seed, **result.metrics, **counts,
                   "train_windows": len(train_windows), "eval_windows": len(eval_windows),
                   "subset_seed": subset.subset_seed, "data_source": source.describe(), **window_options,
                   **_training_fields(config, result.stats), "checkpoint_location": location}
            _save_row(row, output, extra={"predictions": result.predictions, "nbest": result.nbest})
            rows.append(row)
            log(f"[finetune] {name} squad seed {seed}: EM {result.metrics['exact_match']:.2f}, "
                f"F1 {result.metrics['f1']:.2f} ({result.stats.seconds:.1f} s)")
    if write_tables:
        write_results(rows, output)
    return rows


# --------------------------------------------------------------------------------------------------
# Result tables laid out like the TMR paper's Table 1: checkpoints as rows, tasks as columns.
_COUNT_KEYS = ("train_examples", "train_examples_total", "eval_examples", "eval_examples_total")


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
        scores = [next(r[GLUE_TASKS[t].main_metric] for r in runs_by_task[t] if r["seed"] == seed) for t in GLUE_EIGHT]
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
        line = [checkpoint] + [format_mean_std([r[GLUE_TASKS[t].main_metric] for r in runs[t]]) for t in tasks]
        if with_average:
            complete = all(runs[t] for t in GLUE_EIGHT)
            per_seed = glue_average_per_seed(runs) if complete else []
            if complete and not per_seed:  # tasks run with disjoint seeds: average of the means
                line.append(f"{sum(mean_std([r[GLUE_TASKS[t].main_metric] for r in runs[t]])[0] for t in GLUE_EIGHT) / 8:.3f}")
            else:
                line.append(format_mean_std(per_seed))
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
        body.append([checkpoint, format_mean_std([r["exact_match"] for r in runs], 1), format_mean_std([r["f1"] for r in runs], 1),
                     f"{first['train_examples']} of {first['train_examples_total']}",
                     f"{first['eval_examples']} of {first['eval_examples_total']}", str(first["subset_seed"])])
    return header, body


def detail_table(rows: Sequence[dict]) -> tuple[list[str], list[list[str]]]:
    """Every metric (MNLI-mm, F1s, Pearson, ...) and the train loss of the first and last epoch."""
    header = ["Model", "Task", "Seeds", "Metrics", "Train loss (first → last epoch)", "Train s/run"]
    body = []
    for (checkpoint, task), runs in _by_checkpoint_task(rows).items():
        metric_names = [k for k in runs[0] if k in _METRIC_KEYS]
        metrics = ", ".join(f"{k} {format_mean_std([r[k] for r in runs], 1 if task == 'squad' else 3)}" for k in metric_names)
        first = format_mean_std([r["train_loss_first_epoch"] for r in runs])
        last = format_mean_std([r["train_loss_last_epoch"] for r in runs])
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
    glue_header, glue_body = glue_table(rows)
    if glue_body and len(glue_header) > 1:
        paths["glue_csv"] = output / "results_glue.csv"
        atomic_write_text(paths["glue_csv"], _csv_text(glue_header, glue_body))
    squad_header, squad_body = squad_table(rows)
    if squad_body:
        paths["squad_csv"] = output / "results_squad.csv"
        atomic_write_text(paths["squad_csv"], _csv_text(squad_header, squad_body))
    columns = list(dict.fromkeys(k for r in rows for k in r))
    atomic_write_text(paths["runs_csv"], _csv_text(columns, [[r.get(c, "") for c in columns] for r in rows]))
    atomic_write_text(paths["runs_jsonl"], "".join(json.dumps(r) + "\n" for r in rows))
    atomic_write_text(paths["markdown"], render_markdown(rows, title))  # last: drivers take it as "done"
    return paths

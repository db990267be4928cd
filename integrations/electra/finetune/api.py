"""Python entry points: fine-tune named checkpoints on GLUE tasks or SQuAD and collect result rows.

Each function returns one row (a flat dict) per checkpoint × task × seed, writes each row to
``<output_dir>/runs/<checkpoint>/<task>/seed<k>.json`` and, unless ``write_tables=False``, the
result tables (``results.md`` and CSVs, see ``results_table``) for the rows it produced.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable, Sequence

from .checkpoints import load_encoder, load_tokenizer
from .data_source import resolve_data_source
from .errors import FinetuneError
from .glue import encode_glue_split, run_glue_seed
from .glue_data import GLUE_EIGHT, GLUE_HUB_NAME, check_local_files, get_task, load_glue_split, seeded_subset
from .hparams import resolve_config
from .results_table import write_results
from .squad import run_squad_seed
from .squad_data import SQUAD_HUB_NAME, build_squad_windows, load_squad_split
from .training import resolve_device


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _check_common(checkpoint_dirs: dict[str, str], seeds: Sequence[int]) -> None:
    if not checkpoint_dirs:
        raise FinetuneError("no checkpoint given (use --checkpoint DIR or NAME=DIR)")
    if not seeds:
        raise FinetuneError("no seed given")


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
    (run_dir / f"seed{row['seed']}.json").write_text(json.dumps(row, indent=2) + "\n", encoding="utf-8")
    for name, payload in (extra or {}).items():
        (run_dir / f"seed{row['seed']}.{name}.json").write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")


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
    seeds: list[int],
    output_dir: str,
    *,
    learning_rate: float | None = None,
    epochs: float | None = None,
    batch_size: int | None = None,
    preset: str | None = None,
    layer_decay: float | None = None,
    max_length: int = 128,
    subset_seed: int = 0,
    device: str | None = None,
    amp: bool = False,
    sampling: str = "uniform",
    progress: bool = True,
    write_tables: bool = True,
) -> list[dict]:
    """Fine-tune every checkpoint on one GLUE task with each seed; score the task's dev set(s).

    ``data_dir``: directory in the official ``glue_data`` layout, or None/"hub"/"hf:NAME" for the hub.
    Subsets (``max_*_examples``) are drawn once with ``subset_seed`` and shared by all runs.
    ``amp``: bf16 autocast, on CUDA only (CPU always runs float32).
    """
    _check_common(checkpoint_dirs, seeds)
    spec = get_task(task)
    source = resolve_data_source(data_dir, GLUE_HUB_NAME, "GLUE")
    check_local_files(spec, source)
    log = _stderr if progress else (lambda message: None)
    torch_device = resolve_device(device)
    train_full = load_glue_split(spec, "train", source)
    eval_full = {split: load_glue_split(spec, split, source) for split in spec.eval_splits}
    train_data = seeded_subset(train_full, max_train_examples, subset_seed)
    eval_data = {split: seeded_subset(d, max_eval_examples, subset_seed) for split, d in eval_full.items()}
    counts = {"train_examples": len(train_data), "train_examples_total": len(train_full)}
    for split, (_, suffix) in spec.eval_splits.items():
        counts[f"eval_examples{suffix}"] = len(eval_data[split])
        counts[f"eval_examples_total{suffix}"] = len(eval_full[split])
    output = Path(output_dir)
    rows: list[dict] = []
    for name, location in checkpoint_dirs.items():
        tokenizer = load_tokenizer(location)
        encoder = load_encoder(location)
        length = _fit_length(encoder, max_length, log)
        train_features = encode_glue_split(train_data, spec, tokenizer, length)
        eval_features = {split: encode_glue_split(d, spec, tokenizer, length) for split, d in eval_data.items()}
        config = resolve_config(encoder.config.hidden_size, spec.epochs, preset=preset, learning_rate=learning_rate,
                                layer_decay=layer_decay, epochs=epochs, batch_size=batch_size, use_amp=amp,
                                sampling=sampling)
        for seed in seeds:
            result = run_glue_seed(encoder, spec, train_features, eval_features, tokenizer.pad_token_id, config, seed,
                                   torch_device, description=f"{name} {task} seed {seed}", progress=progress)
            row = {"checkpoint": name, "task": task, "seed": seed, **result.metrics, **counts,
                   "subset_seed": subset_seed, "data_source": source.describe(), "max_length": length,
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
    seeds: Sequence[int] = (0, 1, 2),
    output_dir: str = "runs/finetune",
    **options,
) -> list[dict]:
    """Several GLUE tasks (default: the eight of the average) and one combined table."""
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
    seeds: list[int],
    output_dir: str,
    *,
    learning_rate: float | None = None,
    epochs: float | None = None,
    batch_size: int | None = None,
    preset: str | None = None,
    layer_decay: float | None = None,
    max_seq_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
    n_best: int = 20,
    max_answer_length: int = 30,
    subset_seed: int = 0,
    device: str | None = None,
    amp: bool = False,
    sampling: str = "uniform",
    progress: bool = True,
    write_tables: bool = True,
) -> list[dict]:
    """Fine-tune every checkpoint on SQuAD v1.1 train (2 epochs by default, as ELECTRA) with each seed;
    EM/F1 on the dev set. ``max_*_examples`` count questions; ``doc_stride`` is the window step."""
    _check_common(checkpoint_dirs, seeds)
    source = resolve_data_source(data_dir, SQUAD_HUB_NAME, "SQuAD")
    log = _stderr if progress else (lambda message: None)
    torch_device = resolve_device(device)
    train_full = load_squad_split(source, "train")
    eval_full = load_squad_split(source, "validation")
    train_data = seeded_subset(train_full, max_train_examples, subset_seed)
    eval_data = seeded_subset(eval_full, max_eval_examples, subset_seed)
    counts = {"train_examples": len(train_data), "train_examples_total": len(train_full),
              "eval_examples": len(eval_data), "eval_examples_total": len(eval_full)}
    output = Path(output_dir)
    rows: list[dict] = []
    for name, location in checkpoint_dirs.items():
        tokenizer = load_tokenizer(location)
        encoder = load_encoder(location)
        length = _fit_length(encoder, max_seq_length, log)
        window_options = {"max_seq_length": length, "doc_stride": doc_stride, "max_query_length": max_query_length}
        train_windows = build_squad_windows(train_data, tokenizer, with_labels=True, **window_options)
        eval_windows = build_squad_windows(eval_data, tokenizer, with_labels=False, **window_options)
        config = resolve_config(encoder.config.hidden_size, 2, preset=preset, learning_rate=learning_rate,
                                layer_decay=layer_decay, epochs=epochs, batch_size=batch_size, use_amp=amp,
                                sampling=sampling)
        for seed in seeds:
            result = run_squad_seed(encoder, train_windows, eval_windows, eval_data, tokenizer.pad_token_id, config,
                                    seed, torch_device, n_best=n_best, max_answer_length=max_answer_length,
                                    description=f"{name} squad seed {seed}", progress=progress)
            row = {"checkpoint": name, "task": "squad", "seed": seed, **result.metrics, **counts,
                   "train_windows": len(train_windows), "eval_windows": len(eval_windows),
                   "subset_seed": subset_seed, "data_source": source.describe(), **window_options,
                   **_training_fields(config, result.stats), "checkpoint_location": location}
            _save_row(row, output, extra={"predictions": result.predictions, "nbest": result.nbest})
            rows.append(row)
            log(f"[finetune] {name} squad seed {seed}: EM {result.metrics['exact_match']:.2f}, "
                f"F1 {result.metrics['f1']:.2f} ({result.stats.seconds:.1f} s)")
    if write_tables:
        write_results(rows, output)
    return rows

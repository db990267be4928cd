"""The ``finetune`` subcommand: ``... finetune --checkpoint DIR --task sst2`` (or ``glue``, ``squad``).

``add_finetune_subparser`` plugs it into a parent command line; ``main`` runs it on its own
(``python -m integrations.electra.finetune.cli finetune ...``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from .sources import parse_checkpoint_arg, unique_checkpoint_specs
from ..common import UserError, report_user_error
from .glue import GLUE_EIGHT, GLUE_TASKS
from .training import PRESETS

TASK_CHOICES = (*GLUE_TASKS, "glue", "squad")
REPO_ROOT = Path(__file__).resolve().parents[3]


def _default_data_dir(name: str) -> str | None:
    """``../shared/data/<name>`` relative to the repository root when it exists, else None (= hub)."""
    candidate = (REPO_ROOT / ".." / "shared" / "data" / name).resolve()
    return str(candidate) if candidate.is_dir() else None


def add_finetune_subparser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``finetune`` subcommand (``func=run_finetune``) to ``subparsers``."""
    parser = subparsers.add_parser(
        "finetune",
        help="fine-tune discriminator checkpoints on GLUE / SQuAD v1.1 and write a results table",
        description="Fine-tune HF checkpoint directories (ours or any ELECTRA/BERT-style model) on GLUE tasks or "
        "SQuAD v1.1 with ELECTRA's recipe, several seeds, and write results.md / CSV laid out like the TMR paper's Table 1.",
    )
    parser.add_argument("--checkpoint", action="append", required=True, metavar="[NAME=]DIR",
                        help="checkpoint directory (or hub id when online); repeatable; NAME labels its table row")
    parser.add_argument("--task", nargs="+", required=True, choices=TASK_CHOICES, metavar="TASK",
                        help=f"one or more of {', '.join(TASK_CHOICES)}; 'glue' = the eight tasks of the average")
    parser.add_argument("--glue-dir", default=_default_data_dir("glue"),
                        help="GLUE directory in the official glue_data layout, or 'hub' / 'hf:NAME' "
                        "(default: ../shared/data/glue when present, else the hub's nyu-mll/glue)")
    parser.add_argument("--squad-dir", default=_default_data_dir("squad"),
                        help="directory with train-v1.1.json(.gz) (or parts) and dev-v1.1.json(.gz), or 'hub' / 'hf:NAME' "
                        "(default: ../shared/data/squad when present, else the hub's rajpurkar/squad)")
    parser.add_argument("--max-train-examples", type=int, default=None, help="seeded training subset size (questions for SQuAD)")
    parser.add_argument("--max-eval-examples", type=int, default=None, help="seeded dev subset size (questions for SQuAD)")
    parser.add_argument("--subset-seed", type=int, default=0, help="seed of the train/eval subsets (default 0)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="fine-tuning seeds (default 0 1 2)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="LR/layer-decay preset: small 3e-4/0.8, base 1e-4/0.8, large 5e-5/0.9 "
                        "(default: by the checkpoint's hidden size)")
    parser.add_argument("--lr", type=float, default=None, help="learning rate (overrides the preset)")
    parser.add_argument("--layer-decay", type=float, default=None, help="layer-wise LR decay (overrides the preset)")
    parser.add_argument("--epochs", type=float, default=None, help="epochs (default 3; RTE, STS-B 10; SQuAD 2)")
    parser.add_argument("--batch-size", type=int, default=None, help="batch size (default 32)")
    parser.add_argument("--max-length", type=int, default=128, help="GLUE max sequence length (default 128)")
    parser.add_argument("--max-seq-length", type=int, default=384, help="SQuAD window length (default 384)")
    parser.add_argument("--doc-stride", type=int, default=128,
                        help="SQuAD step between window starts, ELECTRA/BERT meaning (default 128; not HF's overlap)")
    parser.add_argument("--max-query-length", type=int, default=64, help="SQuAD question tokens kept (default 64)")
    parser.add_argument("--sampling", choices=("uniform", "prioritized"), default="uniform",
                        help="training batches: shuffled epochs (default), or replayloader's PrioritizedSampler fed "
                        "each example's loss (one shuffled pass first, then P ~ loss, 10%% uniform draws, "
                        "importance weights with beta 0.4 -> 1)")
    parser.add_argument("--output-dir", default="runs/finetune", help="where results.md, CSVs and per-run JSON go")
    parser.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--amp", action="store_true", help="bf16 autocast on CUDA (ignored on CPU, which runs float32)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's; 1 is faster for tiny models on a busy machine)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars or per-run log lines")
    parser.set_defaults(func=run_finetune)
    return parser


def _expand_tasks(tasks: Sequence[str]) -> list[str]:
    expanded: list[str] = []
    for task in tasks:
        for name in (GLUE_EIGHT if task == "glue" else (task,)):
            if name not in expanded:
                expanded.append(name)
    return expanded


def execute_finetune(args: argparse.Namespace) -> list[dict]:
    """Run what the parsed arguments ask for and write the combined table; UserError on user errors."""
    from . import api
    from .api import render_markdown, write_results

    if args.threads is not None:
        import torch

        torch.set_num_threads(max(1, args.threads))
    checkpoints = unique_checkpoint_specs([parse_checkpoint_arg(value) for value in args.checkpoint])
    tasks = _expand_tasks(args.task)
    training = {"learning_rate": args.lr, "epochs": args.epochs, "batch_size": args.batch_size, "preset": args.preset,
                "layer_decay": args.layer_decay, "subset_seed": args.subset_seed, "device": args.device, "amp": args.amp,
                "sampling": args.sampling, "progress": not args.no_progress}
    glue_tasks = [t for t in tasks if t != "squad"]
    rows: list[dict] = []
    if glue_tasks:
        rows += api.finetune_glue(checkpoints, glue_tasks, args.glue_dir, args.max_train_examples,
                                  args.max_eval_examples, args.seeds, args.output_dir, max_length=args.max_length,
                                  **training)
    if "squad" in tasks:
        rows += api.finetune_squad(checkpoints, args.squad_dir, args.max_train_examples, args.max_eval_examples,
                                   args.seeds, args.output_dir, max_seq_length=args.max_seq_length,
                                   doc_stride=args.doc_stride, max_query_length=args.max_query_length,
                                   write_tables=False, **training)
    paths = write_results(rows, args.output_dir)
    print(render_markdown(rows))
    print(f"written: {', '.join(str(p) for p in paths.values())}")
    return rows


def run_finetune(args: argparse.Namespace) -> int:
    """``func`` of the subcommand: user errors are printed as one line (no traceback), exit status 2."""
    try:
        execute_finetune(args)
    except UserError as error:
        raise SystemExit(report_user_error(error)) from None
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="finetune")
    add_finetune_subparser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

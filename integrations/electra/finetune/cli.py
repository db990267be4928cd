"""The ``finetune`` subcommand: ``... finetune --checkpoint DIR --task sst2`` (or ``glue``, ``squad``).

``add_finetune_subparser`` plugs it into a parent command line; ``main`` runs it on its own
(``python -m replayloader_electra.finetune.cli finetune ...``). Its flags are the fields of `options`'
dataclasses (declared once there).
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from ..errors import UserError, report_user_error
from ..flags import OptionParser, ProcessOptions, add_command, apply_process_options, options_from
from ..program import invoked_as
from .glue import GLUE_EIGHT
from .options import (FINETUNE_OPTIONS, DataOptions, FinetuneCommand, GlueOptions, SquadOptions, SubsetOptions,
                      TrainingOptions)
from .sources import parse_checkpoint_arg, unique_checkpoint_specs


def add_finetune_subparser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``finetune`` subcommand (``func=run_finetune``) to ``subparsers``."""
    parser = add_command(
        subparsers, "finetune", [*FINETUNE_OPTIONS, ProcessOptions],
        help="fine-tune discriminator checkpoints on GLUE / SQuAD v1.1 and write a results table",
        description="Fine-tune HF checkpoint directories (ours or any ELECTRA/BERT-style model) on GLUE tasks or "
        "SQuAD v1.1 with ELECTRA's recipe, several seeds, and write results.md / CSV laid out like the TMR paper's "
        "Table 1.")
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
    from dataclasses import asdict

    from . import api
    from .api import render_markdown, write_results

    apply_process_options(options_from(args, ProcessOptions))
    command, data, subset = (options_from(args, cls) for cls in (FinetuneCommand, DataOptions, SubsetOptions))
    training = asdict(options_from(args, TrainingOptions))
    subsets = (subset.max_train_examples, subset.max_eval_examples, subset.seeds, command.output_dir)
    checkpoints = unique_checkpoint_specs([parse_checkpoint_arg(value) for value in command.checkpoint])
    tasks = _expand_tasks(command.task)
    glue_tasks = [t for t in tasks if t != "squad"]
    rows: list[dict] = []
    if glue_tasks:
        rows += api.finetune_glue(checkpoints, glue_tasks, data.glue_dir, *subsets, subset_seed=subset.subset_seed,
                                  **asdict(options_from(args, GlueOptions)), **training)
    if "squad" in tasks:
        rows += api.finetune_squad(checkpoints, data.squad_dir, *subsets, subset_seed=subset.subset_seed,
                                   write_tables=False, **asdict(options_from(args, SquadOptions)), **training)
    paths = write_results(rows, command.output_dir)
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
    parser = OptionParser(prog=invoked_as())  # the usage line names the command as typed (python -m ...finetune.cli)
    add_finetune_subparser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

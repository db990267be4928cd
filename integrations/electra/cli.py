"""Command line: ``compare`` (the default with no arguments), ``pretrain``, ``heldout``, ``export``,
``upgrade-checkpoint`` and ``finetune``.

    python examples/electra_tmr.py                       # ELECTRA vs TMR(loss_diff), tiny, embedded corpus,
                                                         # then a small GLUE fine-tune when GLUE data is found
    python examples/electra_tmr.py pretrain --variant tmr-grad_norm --preset small --corpus FILES...
    python examples/electra_tmr.py pretrain --resume runs/electra_tmr/tmr-loss_diff --steps 2000
    python examples/electra_tmr.py heldout --run RUN --output heldout.safetensors  # RUN trained with --max-lines
    python examples/electra_tmr.py export --checkpoint RUN/checkpoints/step-00001250 --output-dir RUN/at-1250
    python examples/electra_tmr.py upgrade-checkpoint --checkpoint RUN  # checkpoints of an older version
    python examples/electra_tmr.py finetune --checkpoint runs/.../discriminator --task sst2

Bad arguments or data end with one ``error: ...`` line and exit status 2 (``ELECTRA_TMR_DEBUG=1`` shows the
traceback instead). The pretraining flags are generated from `PretrainConfig`'s fields (declared once there).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# torch already uses the cores; a second, multi-threaded BLAS pool (numpy's OpenBLAS, used by the LSR/LinUCB
# strategies) oversubscribes them and slows those strategies many times over. Set here, before anything imports
# numpy, so that every entry point (replayloader-tmr, python -m, examples/electra_tmr.py) gets it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from ._extra import require_extra  # noqa: E402

require_extra()  # before torch is imported: without the extra, one line naming it and exit status 2

from .errors import UserError, report_user_error  # noqa: E402
from .flags import (OptionParser, OptionSet, ProcessOptions, add_command, apply_process_options, option,  # noqa: E402
                    options_from, typed_options)
from .pretrain.config import DEFAULT_OUTPUT  # noqa: E402
from .program import COMMAND, invoked_as  # noqa: E402

COMPARE_VARIANTS = ("electra", "tmr-loss_diff")
METRIC_KEYS = ("accuracy", "f1", "mcc", "spearman", "pearson")
TINY_FINETUNE_LR = {"tiny": 1e-3}  # a 64-wide model needs a larger step than ELECTRA-Small's 3e-4


@dataclass
class CompareOptions:
    """What ``compare`` runs besides the pretraining options it shares with ``pretrain``."""

    output_dir: str = option(DEFAULT_OUTPUT, "where the runs and the comparison are written", "compare")
    variants: list[str] = option(help="variants to compare", group="compare",
                                 default_factory=lambda: list(COMPARE_VARIANTS))
    glue_task: str = option("sst2", "GLUE task for the fine-tuning check", "compare")
    finetune: bool = option(True, "fine-tune each discriminator on --glue-task (--no-finetune: skip)", "compare")


# compare's fine-tune is a quick check, not a benchmark: one seed on a subset (every other --finetune-X flag
# keeps the finetune command's default)
COMPARE_FINETUNE_DEFAULTS = {"max_train_examples": 8000, "seeds": [0]}


def _compare_finetune_sets() -> list[OptionSet]:
    """The finetune command's ``--glue-dir``, and its subset, training and input options as ``--finetune-X``."""
    try:
        from .finetune.options import DataOptions, GlueOptions, SubsetOptions, TrainingOptions
    except ImportError:  # no fine-tuning here: compare says so
        return []
    return [OptionSet(DataOptions, skip=("squad_dir",)), OptionSet(SubsetOptions, "finetune_", COMPARE_FINETUNE_DEFAULTS),
            OptionSet(TrainingOptions, "finetune_", skip=("progress",)), OptionSet(GlueOptions, "finetune_")]


@dataclass
class ExportOptions:
    checkpoint: str = option(help="a step directory, or a run directory (its latest checkpoint)")
    output_dir: str = option(help="where discriminator/ and generator/ are written")


@dataclass
class UpgradeOptions:
    checkpoint: str = option(help="a step directory, or a run directory (every checkpoint under it)")


# ----------------------------------------------------------------------------- arguments
def build_parser(prog: str = COMMAND) -> argparse.ArgumentParser:
    from .pretrain import PretrainConfig
    from .pretrain.heldout import HeldoutConfig

    parser = OptionParser(prog=prog, description="ELECTRA and TMR (memory replay) pretraining on "
                          "replayloader. With no arguments: compare ELECTRA and TMR(loss_diff) on a tiny model.")
    sub = parser.add_subparsers(dest="command", parser_class=OptionParser)
    compare = add_command(sub, "compare", [OptionSet(PretrainConfig, skip=("variant", "resume", "output_dir", "delay_steps")),
                                           CompareOptions, *_compare_finetune_sets(), ProcessOptions],
                          help="pretrain several variants on the same data and steps, fine-tune, and write a "
                               "side-by-side summary (the default)")
    compare.set_defaults(func=run_compare)
    pretrain = add_command(sub, "pretrain", [PretrainConfig, ProcessOptions],
                           help="pretrain one variant (ELECTRA or a TMR strategy)")
    pretrain.set_defaults(func=run_pretrain)
    heldout = add_command(sub, "heldout", [HeldoutConfig, ProcessOptions],
                          help="corrupt held-out text once with a reference generator, for pretraining's "
                               "--heldout (the same test inputs for every run)")
    heldout.set_defaults(func=run_heldout)
    export = add_command(sub, "export", [ExportOptions], help="Hugging Face discriminator/ and generator/ "
                         "directories from any pretraining checkpoint (to fine-tune from part-way through a run)")
    export.set_defaults(func=run_export)
    upgrade = add_command(sub, "upgrade-checkpoint", [UpgradeOptions], help="check a checkpoint written by an "
                          "older version (format 3, no manifest) and add the manifest this version verifies")
    upgrade.set_defaults(func=run_upgrade)

    try:
        from .finetune.cli import add_finetune_subparser
    except ImportError as exc:
        missing = sub.add_parser("finetune", help="(unavailable) fine-tune checkpoints on GLUE / SQuAD")
        missing.set_defaults(func=lambda args, error=exc: _finetune_unavailable(error))
    else:
        add_finetune_subparser(sub)
    return parser


def _finetune_unavailable(exc: Exception) -> int:
    raise UserError(f"the finetune subcommand is not available ({exc})")


# ----------------------------------------------------------------------------- commands
def pretrain_config(args: argparse.Namespace, **fixed):
    """The run's config from exactly the typed flags: on ``--resume``, the saved config updated with them."""
    from .pretrain import PretrainConfig, resume_config

    typed = {**typed_options(args, PretrainConfig), **fixed}
    resume = typed.pop("resume", None)
    return resume_config(resume, **typed) if resume else PretrainConfig(**typed)


def run_pretrain(args: argparse.Namespace) -> int:
    from .pretrain import pretrain

    result = pretrain(pretrain_config(args))
    if result.is_main:  # under torchrun, rank 0 alone speaks
        print(json.dumps(result.summary, indent=1))
        print(f"wrote {result.output_dir} (metrics.jsonl, losses.png, checkpoints/, discriminator/)")
    return 0


def run_heldout(args: argparse.Namespace) -> int:
    from .pretrain.heldout import HeldoutConfig, make_heldout

    config = options_from(args, HeldoutConfig)
    made = make_heldout(config)
    print(json.dumps({"output": config.output, "examples": len(made), "replaced_share": made.replaced_share,
                      **made.info}, indent=1))
    return 0


def run_export(args: argparse.Namespace) -> int:
    from .pretrain.export import export_checkpoint

    options = options_from(args, ExportOptions)
    print(f"wrote {export_checkpoint(options.checkpoint, options.output_dir)} and its generator")
    return 0


def run_upgrade(args: argparse.Namespace) -> int:
    from .pretrain.upgrade import upgrade_checkpoints

    for path, outcome in upgrade_checkpoints(options_from(args, UpgradeOptions).checkpoint):
        print(f"{path}: {outcome}")
    return 0


def finetune_skip_reason(options: CompareOptions, glue_dir: str | None) -> str | None:
    """Why compare will not fine-tune (None: it will), in words that say how to get the data."""
    if not options.finetune:
        return "fine-tuning skipped (--no-finetune)"
    if not _compare_finetune_sets():
        return "fine-tuning skipped: the finetune package is not available here"
    if glue_dir is None:  # a typed --glue-dir was checked while parsing (`finetune.sources.check_glue_dir`)
        return ("fine-tuning skipped: no GLUE data given; pass --glue-dir DIR with the official glue_data layout "
                "(or set REPLAYLOADER_DATA to a directory holding glue/), or --glue-dir hub to download "
                "nyu-mll/glue when online")
    return None


def run_compare(args: argparse.Namespace) -> int:
    """Pretrain each variant with the same settings, fine-tune their discriminators, write summary.md."""
    from .pretrain import VARIANTS, plot_metrics, pretrain, read_metrics

    options = options_from(args, CompareOptions)
    unknown = [v for v in options.variants if v not in VARIANTS]
    if unknown:
        raise UserError(f"unknown variant {unknown[0]!r}; choose from {', '.join(VARIANTS)}")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UserError("compare runs in one process (it also fine-tunes); under torchrun use the pretrain command")
    finetune_sets = _compare_finetune_sets()
    glue_dir = finetune_sets[0].parsed(args).glue_dir if finetune_sets else None
    skipped = finetune_skip_reason(options, glue_dir)
    if skipped:  # said before the long part, and again in summary.md
        print(skipped, flush=True)
    started = time.perf_counter()
    root = Path(options.output_dir)
    results = {}
    for variant in options.variants:
        config = pretrain_config(args, variant=variant, output_dir=str(root / variant))
        print(f"== pretraining {variant} ({config.preset}) ==", flush=True)
        results[variant] = pretrain(config)
    plot_metrics({v: read_metrics(r.metrics_path) for v, r in results.items()}, root / "compare.png")
    pretrain_seconds = time.perf_counter() - started

    finetune_rows = []
    if not skipped:
        from dataclasses import asdict

        from .finetune.api import finetune_glue_task

        subset, training, glue = (option_set.parsed(args) for option_set in finetune_sets[1:])
        if training.learning_rate is None:
            training.learning_rate = TINY_FINETUNE_LR.get(next(iter(results.values())).config.preset)
        print(f"== fine-tuning on {options.glue_task} ==", flush=True)
        finetune_rows = finetune_glue_task(
            {v: r.discriminator_dir for v, r in results.items()}, options.glue_task, glue_dir,
            subset.max_train_examples, subset.max_eval_examples, subset.seeds, str(root / "finetune"),
            subset_seed=subset.subset_seed, **asdict(training), **asdict(glue))
    total_seconds = time.perf_counter() - started
    markdown = comparison_markdown(results, finetune_rows, skipped or "", options.glue_task, pretrain_seconds,
                                   total_seconds)
    (root / "summary.md").write_text(markdown)
    print(markdown)
    print(f"wrote {root / 'summary.md'} and {root / 'compare.png'}")
    return 0


def comparison_markdown(results: dict, finetune_rows: list[dict], finetune_note: str, task: str,
                        pretrain_seconds: float, total_seconds: float) -> str:
    """Side-by-side table of the variants' pretraining summaries and fine-tuning scores."""
    variants = list(results)
    first = next(iter(results.values()))
    cfg = first.config
    lines = [f"# ELECTRA vs TMR: {', '.join(variants)}", "",
             f"preset `{cfg.preset}`, corpus `{cfg.corpus}` ({first.summary.get('examples')} packed examples of "
             f"{cfg.max_len} tokens), {cfg.steps} steps, batch {cfg.batch_size}, lr {cfg.learning_rate}, "
             f"buffer N={cfg.buffer_size}, alpha {cfg.alpha}, seed {cfg.seed}. Means over the last 10% of steps.", "",
             "| metric | " + " | ".join(variants) + " |", "|---|" + "---|" * len(variants)]
    rows = [("generator loss L_G", "final_generator_loss", "{:.3f}"),
            ("discriminator loss L_D", "final_discriminator_loss", "{:.4f}"),
            ("discriminator accuracy (all tokens)", "final_discriminator_accuracy", "{:.4f}"),
            ("replaced-token accuracy", "final_replaced_accuracy", "{:.4f}"),
            ("D ranking AUC (replaced above original)", "final_replaced_auc", "{:.4f}"),
            ("L_D on fresh examples only (never trained on)", "final_discriminator_loss_fresh", "{:.4f}"),
            ("D ranking AUC on fresh examples only", "final_replaced_auc_fresh", "{:.4f}"),
            ("generator MLM accuracy", "final_generator_accuracy", "{:.4f}"),
            ("masked tokens changed, produced batch", "final_changed_fraction_produced", "{:.4f}"),
            ("masked tokens changed, sampled fresh", "final_changed_fraction_fresh", "{:.4f}"),
            ("masked tokens changed, sampled replayed", "final_changed_fraction_replayed", "{:.4f}"),
            ("share of fresh examples in D's batch", "final_fresh_fraction", "{:.3f}"),
            ("age of sampled examples (steps)", "final_sample_age_mean", "{:.1f}"),
            ("buffer weight std", "final_buffer_weight_std", "{:.4g}"),
            ("mean visits per buffered example", "final_buffer_mean_visits", "{:.2f}"),
            ("seconds per step", "seconds_per_step", "{:.3f}"),
            ("data seconds per step", "data_seconds_per_step", "{:.4f}"),
            ("producer (mask+generator) seconds per step", "produce_seconds_per_step", "{:.3f}")]
    for label, key, fmt in rows:
        cells = []
        for variant in variants:
            value = results[variant].summary.get(key)
            cells.append(fmt.format(value) if isinstance(value, (int, float)) else "–")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", f"Fine-tuning ({task}, dev):" if finetune_rows else finetune_note, ""]
    if finetune_rows:
        metric_names = [k for k in finetune_rows[0] if k.split("_mm")[0] in METRIC_KEYS]
        lines += ["| checkpoint | seeds | " + " | ".join(metric_names) + " | train examples |",
                  "|---|---|" + "---|" * (len(metric_names) + 1)]
        for variant in variants:
            mine = [r for r in finetune_rows if r["checkpoint"] == variant]
            if not mine:
                continue
            means = [sum(r[m] for r in mine) / len(mine) for m in metric_names]
            lines.append(f"| {variant} | {len(mine)} | " + " | ".join(f"{m:.4f}" for m in means)
                         + f" | {mine[0].get('train_examples')} |")
        lines.append("")
    lines += [f"Wall time: pretraining {pretrain_seconds:.0f} s, total {total_seconds:.0f} s "
              f"(device {first.summary.get('device', 'see config')}).", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- entry point
def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Parse, run, and turn user errors into one ``error:`` line (exit status 2).

    Without ``argv`` the process's own arguments are parsed and the usage line names the command as invoked
    (`invoked_as`); arguments handed in by other code are shown as `COMMAND`'s unless ``prog`` says otherwise."""
    if prog is None:
        prog = invoked_as() if argv is None else COMMAND
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["compare", *argv]
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        apply_process_options(options_from(args, ProcessOptions))
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            return int(args.func(args) or 0)
    except UserError as error:
        return report_user_error(error)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""Command line: ``compare`` (the default with no arguments), ``pretrain``, ``heldout``, ``export`` and
``finetune``.

    python examples/electra_tmr.py                       # ELECTRA vs TMR(loss_diff), tiny, embedded corpus,
                                                         # then a small GLUE fine-tune when GLUE data is found
    python examples/electra_tmr.py pretrain --variant tmr-grad_norm --preset small --corpus FILES...
    python examples/electra_tmr.py pretrain --resume runs/electra_tmr/tmr-loss_diff --steps 2000
    python examples/electra_tmr.py heldout --run RUN --output heldout.safetensors  # RUN trained with --max-lines
    python examples/electra_tmr.py export --checkpoint RUN/checkpoints/step-00001250 --output-dir RUN/at-1250
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
from pathlib import Path

# torch already uses the cores; a second, multi-threaded BLAS pool (numpy's OpenBLAS, used by the LSR/LinUCB
# strategies) oversubscribes them and slows those strategies many times over. Set here, before anything imports
# numpy, so that every entry point (replayloader-tmr, python -m, examples/electra_tmr.py) gets it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_GLUE_DIR = REPO_ROOT.parent / "shared" / "data" / "glue"
COMPARE_VARIANTS = ("electra", "tmr-loss_diff")
METRIC_KEYS = ("accuracy", "f1", "mcc", "spearman", "pearson")
TINY_FINETUNE_LR = {"tiny": 1e-3}  # a 64-wide model needs a larger step than ELECTRA-Small's 3e-4


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error as a single line instead of usage text + error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


# ----------------------------------------------------------------------------- arguments
def _add_training_arguments(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """Every `PretrainConfig` option (minus ``skip``), plus the process-wide ``--threads``."""
    from .common import add_dataclass_arguments
    from .pretrain import PretrainConfig

    add_dataclass_arguments(parser, PretrainConfig, skip)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's; 1 is faster when other jobs share a small machine)")


def build_parser() -> argparse.ArgumentParser:
    from .pretrain.config import DEFAULT_OUTPUT

    parser = OneLineParser(prog="electra_tmr", description="ELECTRA and TMR (memory replay) pretraining on "
                           "replayloader. With no arguments: compare ELECTRA and TMR(loss_diff) on a tiny model.")
    sub = parser.add_subparsers(dest="command", parser_class=OneLineParser)
    compare = sub.add_parser("compare", help="pretrain several variants on the same data and steps, fine-tune, "
                             "and write a side-by-side summary (the default)")
    _add_training_arguments(compare, skip=("variant", "resume", "output_dir"))
    compare.add_argument("--output-dir", dest="root", default=DEFAULT_OUTPUT,
                         help=f"where the runs and the comparison are written (default {DEFAULT_OUTPUT})")
    compare.add_argument("--variants", nargs="+", default=list(COMPARE_VARIANTS), help="variants to compare")
    compare.add_argument("--glue-dir", default=str(DEFAULT_GLUE_DIR) if DEFAULT_GLUE_DIR.is_dir() else None,
                         help="GLUE data (official glue_data layout; default ../shared/data/glue when present)")
    compare.add_argument("--glue-task", default="sst2", help="GLUE task for the fine-tuning check (default sst2)")
    compare.add_argument("--finetune-train-examples", type=int, default=8000, help="training subset (default 8000)")
    compare.add_argument("--finetune-lr", type=float, default=None,
                         help="fine-tuning learning rate (default: "
                              + ", ".join(f"{lr} for the {name} preset" for name, lr in TINY_FINETUNE_LR.items())
                              + ", else the fine-tuning preset's)")
    compare.add_argument("--finetune-eval-examples", type=int, default=None, help="dev subset (default: all)")
    compare.add_argument("--finetune-seeds", type=int, nargs="+", default=[0], help="fine-tuning seeds (default 0)")
    compare.add_argument("--no-finetune", action="store_true", help="skip fine-tuning")
    compare.set_defaults(func=run_compare)

    pretrain = sub.add_parser("pretrain", help="pretrain one variant (ELECTRA or a TMR strategy)")
    _add_training_arguments(pretrain)
    pretrain.set_defaults(func=run_pretrain)

    heldout = sub.add_parser("heldout", help="corrupt held-out text once with a reference generator, for "
                             "pretraining's --heldout (the same test inputs for every run)")
    from .common import add_dataclass_arguments
    from .pretrain.heldout import HeldoutConfig

    add_dataclass_arguments(heldout, HeldoutConfig)
    heldout.set_defaults(func=run_heldout)

    export = sub.add_parser("export", help="Hugging Face discriminator/ and generator/ directories from any "
                            "pretraining checkpoint (to fine-tune from part-way through a run)")
    export.add_argument("--checkpoint", required=True, help="a step directory, or a run directory (its latest)")
    export.add_argument("--output-dir", required=True, help="where discriminator/ and generator/ are written")
    export.set_defaults(func=run_export)

    try:
        from .finetune.cli import add_finetune_subparser
    except ImportError as exc:
        missing = sub.add_parser("finetune", help="(unavailable) fine-tune checkpoints on GLUE / SQuAD")
        missing.set_defaults(func=lambda args: _finetune_unavailable(exc))
    else:
        add_finetune_subparser(sub)
    return parser


def _finetune_unavailable(exc: Exception) -> int:
    from .common import UserError

    raise UserError(f"the finetune subcommand is not available ({exc})")


# ----------------------------------------------------------------------------- commands
def pretrain_config(args: argparse.Namespace, **fixed):
    """The run's config from exactly the typed flags: on ``--resume``, the saved config updated with them."""
    from .common import typed_options
    from .pretrain import PretrainConfig, resume_config

    typed = {**typed_options(args, PretrainConfig), **fixed}
    resume = typed.pop("resume", None)
    return resume_config(resume, **typed) if resume else PretrainConfig(**typed)


def run_pretrain(args: argparse.Namespace) -> int:
    from .pretrain import pretrain

    result = pretrain(pretrain_config(args))
    print(json.dumps(result.summary, indent=1))
    print(f"wrote {result.output_dir} (metrics.jsonl, losses.png, checkpoints/, discriminator/)")
    return 0


def run_heldout(args: argparse.Namespace) -> int:
    from .common import typed_options
    from .pretrain.heldout import HeldoutConfig, make_heldout

    config = HeldoutConfig(**typed_options(args, HeldoutConfig))
    made = make_heldout(config)
    print(json.dumps({"output": config.output, "examples": len(made), "replaced_share": made.replaced_share,
                      **made.info}, indent=1))
    return 0


def run_export(args: argparse.Namespace) -> int:
    from .pretrain.export import export_checkpoint

    print(f"wrote {export_checkpoint(args.checkpoint, args.output_dir)} and its generator")
    return 0


def run_compare(args: argparse.Namespace) -> int:
    """Pretrain each variant with the same settings, fine-tune their discriminators, write summary.md."""
    from .common import UserError
    from .pretrain import VARIANTS, plot_metrics, pretrain, read_metrics

    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        raise UserError(f"unknown variant {unknown[0]!r}; choose from {', '.join(VARIANTS)}")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UserError("compare runs in one process (it also fine-tunes); under torchrun use the pretrain command")
    started = time.perf_counter()
    root = Path(args.root)
    results = {}
    for variant in args.variants:
        config = pretrain_config(args, variant=variant, output_dir=str(root / variant))
        print(f"== pretraining {variant} ({config.preset}) ==", flush=True)
        results[variant] = pretrain(config)
    plot_metrics({v: read_metrics(r.metrics_path) for v, r in results.items()}, root / "compare.png")
    pretrain_seconds = time.perf_counter() - started

    finetune_rows, finetune_note = [], ""
    if args.no_finetune:
        finetune_note = "fine-tuning skipped (--no-finetune)"
    elif not args.glue_dir or not Path(args.glue_dir).is_dir():
        finetune_note = (f"fine-tuning skipped: no GLUE data found (looked for "
                         f"{args.glue_dir or DEFAULT_GLUE_DIR}; pass --glue-dir)")
    else:
        try:
            from .finetune.api import finetune_glue_task
        except ImportError as exc:
            finetune_note = f"fine-tuning skipped: the finetune package is not available ({exc})"
        else:
            preset = next(iter(results.values())).config.preset
            finetune_lr = args.finetune_lr if args.finetune_lr is not None else TINY_FINETUNE_LR.get(preset)
            print(f"== fine-tuning on {args.glue_task} ==", flush=True)
            finetune_rows = finetune_glue_task(
                {v: r.discriminator_dir for v, r in results.items()}, args.glue_task, args.glue_dir,
                args.finetune_train_examples, args.finetune_eval_examples, list(args.finetune_seeds),
                str(root / "finetune"), learning_rate=finetune_lr)
    total_seconds = time.perf_counter() - started
    markdown = comparison_markdown(results, finetune_rows, finetune_note, args.glue_task, pretrain_seconds,
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
def main(argv: Sequence[str] | None = None) -> int:
    """Parse, run, and turn user errors into one ``error:`` line (exit status 2)."""
    from .common import UserError, report_user_error

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["compare", *argv]
    args = build_parser().parse_args(argv)
    if not hasattr(args, "func"):
        build_parser().print_help()
        return 2
    try:
        if getattr(args, "threads", None) is not None:
            if args.threads < 1:
                raise UserError(f"--threads must be >= 1, got {args.threads}")
            import torch

            torch.set_num_threads(args.threads)
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

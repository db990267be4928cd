"""Command line: ``compare`` (the default with no arguments), ``pretrain`` and ``finetune``.

    python examples/electra_tmr.py                       # ELECTRA vs TMR(loss_diff), tiny, embedded corpus,
                                                         # then a small GLUE fine-tune when GLUE data is found
    python examples/electra_tmr.py pretrain --variant tmr-grad_norm --preset small --corpus FILES...
    python examples/electra_tmr.py pretrain --resume runs/electra_tmr/tmr-loss_diff --steps 2000
    python examples/electra_tmr.py finetune --checkpoint runs/.../discriminator --task sst2

Bad arguments or data end with one ``error: ...`` line and exit status 2 (``ELECTRA_TMR_DEBUG=1`` shows the
traceback instead).
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

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_GLUE_DIR = REPO_ROOT.parent / "shared" / "data" / "glue"
DEFAULT_OUTPUT = "runs/electra_tmr"
COMPARE_VARIANTS = ("electra", "tmr-loss_diff")
METRIC_KEYS = ("accuracy", "f1", "mcc", "spearman", "pearson")
TINY_FINETUNE_LR = {"tiny": 1e-3}  # a 64-wide model needs a larger step than ELECTRA-Small's 3e-4


class UserError(Exception):
    """A mistake in arguments or data, reported as one line."""


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error as a single line instead of usage text + error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


# ----------------------------------------------------------------------------- arguments
def _add_training_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by ``pretrain`` and ``compare`` (None = the preset's value)."""
    from .models import PRESETS

    g = parser.add_argument_group("model and schedule")
    g.add_argument("--preset", default="tiny", help=f"model size: {', '.join(PRESETS)} (default tiny)")
    g.add_argument("--steps", type=int, default=None, help="training steps (default: the preset's)")
    g.add_argument("--batch-size", type=int, default=None, help="mini-batch size K (tiny 32, small 128, base 256)")
    g.add_argument("--lr", type=float, default=None, help="peak learning rate (tiny 2e-3, small 5e-4, base 2e-4)")
    g.add_argument("--warmup-steps", type=int, default=None, help="linear warmup steps (default min(preset's: tiny 100, small/base 10k; steps/10))")
    g.add_argument("--dropout", type=float, default=None, help="dropout of both models (default: tiny 0.0, small/base 0.1)")
    g.add_argument("--mask-prob", type=float, default=0.15, help="share of tokens masked for the generator "
                   "(default 0.15, as ELECTRA)")
    g.add_argument("--hidden", type=int, default=None, help="discriminator hidden size H; FFN becomes 4H and "
                   "embedding H (default: the preset's, tiny 64)")
    g.add_argument("--layers", type=int, default=None, help="discriminator depth (default: the preset's, tiny 2)")
    g.add_argument("--generator-fraction", type=float, default=None, help="generator hidden and FFN as a fraction "
                   "of the discriminator's (default: the preset's, 0.25)")
    g.add_argument("--generator-layers", type=int, default=None, help="generator depth (default: the "
                   "discriminator's)")
    g.add_argument("--seed", type=int, default=0, help="seed of init, data order, masking and the buffer")
    g.add_argument("--replacements", default="generator",
                   help="generator (default) or uniform: a check that the discriminator learns at all; replacements "
                        "drawn uniformly from the vocabulary are easy to spot, so its ranking AUC should pass 0.8 "
                        "within a few dozen steps")
    g.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's; 1 is faster when other jobs share a small machine)")
    g = parser.add_argument_group("memory buffer")
    g.add_argument("--buffer-size", type=int, default=1000, help="buffer capacity N (default 1000, as the paper)")
    g.add_argument("--alpha", type=float, default=1.0, help="prioritization exponent: P(i) ∝ w_i^alpha (default 1)")
    g.add_argument("--beta", type=float, default=None, help="importance-weight exponent (default: none, as the paper)")
    g.add_argument("--grad-norm-method", default="ghost", help="tmr-grad_norm: ghost (hooks) or loop (B passes)")
    g = parser.add_argument_group("data")
    g.add_argument("--corpus", default="python-docs",
                   help="python-docs (embedded, default), text files/dirs/globs (.txt, .gz, NLTK .zip; "
                        "comma-separated), or a hub dataset name (e.g. wikitext with --corpus-config)")
    g.add_argument("--corpus-config", default=None, help="hub dataset config, e.g. wikitext-103-raw-v1")
    g.add_argument("--tokenizer", default=None, help="directory of a saved fast tokenizer (default: train WordPiece)")
    g.add_argument("--vocab-size", type=int, default=None, help="WordPiece vocabulary (tiny 4096, else 30522)")
    g.add_argument("--max-len", type=int, default=None, help="tokens per packed example (default 128)")
    g.add_argument("--max-lines", type=int, default=None, help="use only the first N corpus lines")
    g = parser.add_argument_group("run")
    g.add_argument("--output-dir", default=None, help=f"where runs are written (default {DEFAULT_OUTPUT}[/VARIANT])")
    g.add_argument("--cache-dir", default=None, help="tokenizer/example cache (default: OUTPUT/cache)")
    g.add_argument("--checkpoint-every", type=int, default=0, help="checkpoint every M steps (0: only at the end)")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    g.add_argument("--amp", default="none", help="autocast on CUDA: none, bf16 or fp16")
    g.add_argument("--compile", action="store_true", help="torch.compile the discriminator (CUDA only)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="electra_tmr", description="ELECTRA and TMR (memory replay) pretraining on "
                           "replayloader. With no arguments: compare ELECTRA and TMR(loss_diff) on a tiny model.")
    sub = parser.add_subparsers(dest="command", parser_class=OneLineParser)
    compare = sub.add_parser("compare", help="pretrain several variants on the same data and steps, fine-tune, "
                             "and write a side-by-side summary (the default)")
    _add_training_arguments(compare)
    compare.add_argument("--variants", nargs="+", default=list(COMPARE_VARIANTS), help="variants to compare")
    compare.add_argument("--glue-dir", default=str(DEFAULT_GLUE_DIR) if DEFAULT_GLUE_DIR.is_dir() else None,
                         help="GLUE data (official glue_data layout; default ../shared/data/glue when present)")
    compare.add_argument("--glue-task", default="sst2", help="GLUE task for the fine-tuning check (default sst2)")
    compare.add_argument("--finetune-train-examples", type=int, default=8000, help="training subset (default 8000)")
    compare.add_argument("--finetune-lr", type=float, default=None,
                         help="fine-tuning learning rate (default: 1e-3 for the tiny preset, else the "
                              "fine-tuning preset's)")
    compare.add_argument("--finetune-eval-examples", type=int, default=None, help="dev subset (default: all)")
    compare.add_argument("--finetune-seeds", type=int, nargs="+", default=[0], help="fine-tuning seeds (default 0)")
    compare.add_argument("--no-finetune", action="store_true", help="skip fine-tuning")
    compare.set_defaults(func=run_compare)

    from .pretrain import VARIANTS

    pretrain = sub.add_parser("pretrain", help="pretrain one variant (ELECTRA or a TMR strategy)")
    pretrain.add_argument("--variant", default="tmr-loss_diff", help=f"one of {', '.join(VARIANTS)}")
    _add_training_arguments(pretrain)
    pretrain.add_argument("--resume", default=None,
                          help="continue exactly from a checkpoint (step dir, or a run dir: its latest checkpoint)")
    pretrain.set_defaults(func=run_pretrain)

    try:
        from .finetune.cli import add_finetune_subparser
    except ImportError as exc:
        missing = sub.add_parser("finetune", help="(unavailable) fine-tune checkpoints on GLUE / SQuAD")
        missing.set_defaults(func=lambda args: _finetune_unavailable(exc))
    else:
        add_finetune_subparser(sub)
    return parser


def _finetune_unavailable(exc: Exception) -> int:
    raise UserError(f"the finetune subcommand is not available ({exc})")


# ----------------------------------------------------------------------------- commands
def config_from_args(args: argparse.Namespace, variant: str, output_dir: str):
    from .pretrain import PretrainConfig

    return PretrainConfig(
        variant=variant, preset=args.preset, corpus=args.corpus, corpus_config=args.corpus_config,
        tokenizer=args.tokenizer, vocab_size=args.vocab_size, max_len=args.max_len, steps=args.steps,
        batch_size=args.batch_size, learning_rate=args.lr, warmup_steps=args.warmup_steps, dropout=args.dropout,
        mask_prob=args.mask_prob, hidden=args.hidden, layers=args.layers,
        generator_fraction=args.generator_fraction, generator_layers=args.generator_layers,
        buffer_size=args.buffer_size, alpha=args.alpha, beta=args.beta, grad_norm_method=args.grad_norm_method,
        seed=args.seed, device=args.device, amp=args.amp, compile=args.compile, output_dir=output_dir,
        cache_dir=args.cache_dir, checkpoint_every=args.checkpoint_every, max_lines=args.max_lines,
        replacements=args.replacements,
        progress=not args.no_progress)


def run_pretrain(args: argparse.Namespace) -> int:
    from .pretrain import VARIANTS, pretrain

    if args.variant not in VARIANTS:
        raise UserError(f"unknown variant {args.variant!r}; choose one of {', '.join(VARIANTS)}")
    if args.resume:
        from .pretrain import PretrainConfig, find_checkpoint

        checkpoint = find_checkpoint(args.resume)
        config = PretrainConfig(resume=str(checkpoint), steps=args.steps, checkpoint_every=args.checkpoint_every,
                                progress=not args.no_progress, device=args.device,
                                output_dir=args.output_dir or PretrainConfig.output_dir)
    else:
        config = config_from_args(args, args.variant, args.output_dir or f"{DEFAULT_OUTPUT}/{args.variant}")
    result = pretrain(config)
    print(json.dumps(result.summary, indent=1))
    print(f"wrote {result.output_dir} (metrics.jsonl, losses.png, checkpoints/, discriminator/)")
    return 0


def run_compare(args: argparse.Namespace) -> int:
    """Pretrain each variant with the same settings, fine-tune their discriminators, write summary.md."""
    from .pretrain import VARIANTS, plot_metrics, pretrain, read_metrics

    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        raise UserError(f"unknown variant {unknown[0]!r}; choose from {', '.join(VARIANTS)}")
    started = time.perf_counter()
    root = Path(args.output_dir or DEFAULT_OUTPUT)
    if args.cache_dir is None:
        args.cache_dir = str(root / "cache")
    results = {}
    for variant in args.variants:
        print(f"== pretraining {variant} ({args.preset}) ==", flush=True)
        results[variant] = pretrain(config_from_args(args, variant, str(root / variant)))
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
            finetune_lr = args.finetune_lr if args.finetune_lr is not None else TINY_FINETUNE_LR.get(args.preset)
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
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["compare", *argv]
    args = build_parser().parse_args(argv)
    if not hasattr(args, "func"):
        build_parser().print_help()
        return 2
    if getattr(args, "threads", None):
        if args.threads < 1:
            print(f"error: --threads must be >= 1, got {args.threads}", file=sys.stderr)
            return 2
        import torch

        torch.set_num_threads(args.threads)
    from .data import CorpusError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            return int(args.func(args) or 0)
    except (UserError, CorpusError, ValueError, FileNotFoundError) as exc:
        if os.environ.get("ELECTRA_TMR_DEBUG"):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

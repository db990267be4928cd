"""Every option of a pretraining run, declared once: the dataclass field carries its flag's help text.

`PretrainConfig` fields left at ``None`` take the preset's value (`filled`); the command line is generated from
the fields (`replayloader_electra.flags.OptionParser`, on `transformers.HfArgumentParser`); resuming is the saved config updated with
exactly the options given (`resume_config`).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from replayloader.strategies import FIFO, EvictLowest, Strategy, by_name

from ..errors import UserError
from ..flags import option
from ..models import PRESETS, Preset, get_preset, with_overrides

VARIANTS: dict[str, str] = {  # variant name -> replayloader strategy name
    "electra": "none",
    "tmr-loss_diff": "loss_diff",
    "tmr-grad_norm": "grad_norm",
    "tmr-grad_bound": "grad_bound",
    "tmr-lsr": "lsr",
    "tmr-linucb": "linucb",
    "tmr-loss": "loss",
}
# The per-example signal each variant feeds back to its buffer: the discriminator's loss, its exact gradient
# norms, or its logits/labels/mask (from which the library's GradBound computes the Katharopoulos–Fleuret bound).
FEEDBACK: dict[str, str] = {"tmr-grad_norm": "grad_norm", "tmr-grad_bound": "logits"}  # every other: "loss"
EVICTIONS = {rule.name: rule for rule in (EvictLowest, FIFO)}  # --eviction: which example a full buffer drops
REPLACEMENTS = ("generator", "uniform")  # where the discriminator's replaced tokens come from
DEFAULT_OUTPUT = "runs/electra_tmr"  # runs go to DEFAULT_OUTPUT/VARIANT unless --output-dir says otherwise


def _by_preset(field_name: str) -> str:
    """"tiny 32, mini 32, ..." from the presets themselves, so help text never goes stale."""
    return ", ".join(f"{name} {getattr(preset, field_name)}" for name, preset in PRESETS.items())


MODEL, BUFFER, DATA, RUN = "model and schedule", "memory buffer", "data", "run"


@dataclass
class PretrainConfig:
    """Everything a run depends on. ``None`` fields take the preset's value (see `filled`)."""

    variant: str = option("tmr-loss_diff", f"one of {', '.join(VARIANTS)}", MODEL)
    preset: str = option("tiny", f"model size: {', '.join(PRESETS)}", MODEL)
    hidden: int | None = option(None, "discriminator hidden size H; FFN = 4H, embedding = H "
                                      f"(default: the preset's: {_by_preset('hidden')})", MODEL)
    layers: int | None = option(None, f"discriminator depth (default: the preset's: {_by_preset('layers')})", MODEL)
    generator_fraction: float | None = option(
        None, "generator hidden and FFN sizes as a fraction of the discriminator's "
              f"(default: the preset's: {_by_preset('generator_fraction')})", MODEL)
    generator_layers: int | None = option(None, "generator depth (default: the discriminator's)", MODEL)
    steps: int | None = option(None, f"training steps (default: the preset's: {_by_preset('steps')})", MODEL)
    batch_size: int | None = option(None, "mini-batch size K, over all ranks under torchrun (each rank takes "
                                          f"K / ranks) (default: the preset's: {_by_preset('batch_size')})", MODEL)
    learning_rate: float | None = option(
        None, f"peak learning rate (default: the preset's: {_by_preset('learning_rate')})", MODEL, aliases=["--lr"])
    warmup_steps: int | None = option(
        None, f"linear warmup steps (default: min(preset's, steps/10); preset's: {_by_preset('warmup_steps')})", MODEL)
    dropout: float | None = option(None, f"dropout of both models (default: the preset's: {_by_preset('dropout')})",
                                   MODEL)
    weight_decay: float = option(0.01, "AdamW weight decay (not on LayerNorm and bias)", MODEL)
    discriminator_weight: float = option(50.0, "λ in the joint loss L_G + λ·L_D", MODEL)
    clip_norm: float = option(1.0, "gradient clipping norm", MODEL, aliases=["--clip"])
    mask_prob: float = option(0.15, "fraction of the real tokens of each example that are masked", MODEL)
    mask_token_prob: float = option(0.85, "of the masked positions, the share that becomes [MASK] (the rest keep "
                                          "their token; none random)", MODEL)
    replacements: str = option("generator", "generator, or uniform: a check that the discriminator learns at all "
                                            "(uniform replacements are easy to spot, so its ranking AUC should pass "
                                            "0.8 within a few dozen steps)", MODEL)
    seed: int = option(0, "seed of init, data order, masking and the buffer", MODEL)
    buffer_size: int = option(1000, "buffer capacity N (the paper's 1000); under torchrun the total over ranks: "
                                    "each rank's shard holds N // ranks, keeping the ratio N / K", BUFFER)
    alpha: float = option(1.0, "prioritization exponent: P(i) ∝ w_i^alpha", BUFFER)
    beta: float | None = option(None, "importance-weight exponent (default: none, as the paper)", BUFFER)
    eviction: str | None = option(None, "replace a tmr variant's eviction, for ablations: lowest (drop the lowest "
                                        "weight, the paper's) or fifo (drop the oldest example) (default: the "
                                        "variant's own; none undoes a saved one on --resume)", BUFFER)
    delay_steps: int = option(0, "electra only: the discriminator trains at step t on exactly the batch the generator "
                                 "corrupted at step t-D (each once; while the queue fills, on the first batch at ages "
                                 "0..D-1), with the current step's generator loss: a fixed-age control for TMR's "
                                 "mixed-age window (0: ELECTRA itself)", BUFFER)
    grad_norm_method: str = option("ghost", "tmr-grad_norm: ghost (hooks inside the training backward) or loop "
                                            "(B extra passes)", BUFFER)
    corpus: str = option("python-docs", "python-docs (embedded), text files/dirs/globs (.txt, .gz, NLTK .zip; "
                                        "comma-separated), or a hub dataset name (with --corpus-config)", DATA)
    corpus_config: str | None = option(None, "hub dataset config, e.g. wikitext-103-raw-v1", DATA)
    tokenizer: str | None = option(None, "directory of a saved fast tokenizer (default: train WordPiece)", DATA)
    vocab_size: int | None = option(None, f"WordPiece vocabulary (default: the preset's: {_by_preset('vocab_size')})",
                                    DATA)
    max_len: int | None = option(None, f"tokens per packed example (default: the preset's: {_by_preset('max_len')})",
                                 DATA)
    max_lines: int | None = option(None, "use only the first N corpus lines", DATA)
    output_dir: str | None = option(None, f"where the run is written (default {DEFAULT_OUTPUT}/VARIANT)", RUN)
    cache_dir: str | None = option(None, "tokenizer/example cache (default: OUTPUT_DIR/../cache)", RUN)
    heldout: str | None = option(None, "a held-out set file (`electra_tmr.py heldout`): text no run trains on, "
                                       "corrupted once by one reference generator; the discriminator's AUC and "
                                       "L_D on it are logged as heldout_auc / heldout_loss, the same inputs for "
                                       "every run", RUN)
    heldout_every: int = option(250, "score the --heldout set every M steps (and at the last step)", RUN)
    checkpoint_every: int = option(0, "checkpoint every M steps (0: only at the end)", RUN)
    keep_checkpoints: int = option(2, "how many checkpoints to keep", RUN)
    resume: str | None = option(None, "continue exactly from a checkpoint (a step dir, or a run dir: its latest "
                                      "checkpoint); options given with it override the saved ones", RUN)
    device: str = option("auto", "auto, cpu, cuda, cuda:N or mps (under torchrun: cuda:LOCAL_RANK, or cpu)", RUN)
    dist_timeout: float = option(600.0, "under torchrun: seconds a rank waits for the others in a collective "
                                        "before it fails (so a lost peer cannot hang the job)", RUN)
    amp: str = option("none", "autocast on CUDA: none, bf16 or fp16", RUN)
    compile: bool = option(False, "torch.compile the pair (CUDA only; not with feedback that needs eager mode, "
                                  "such as ghost gradient norms)", RUN)
    defer_feedback: bool = option(False, "hand each step's per-example feedback to the buffer just before the next "
                                         "step's examples are added, after its generator work is queued, so a CUDA "
                                         "step never waits for the copy (same results)", RUN)
    log_every: int = option(1, "write the metrics record (and update the progress bar) every N steps, and at "
                               "held-out, checkpoint and last steps; the other steps read nothing off the device, "
                               "so a CUDA step need not wait (a logged step logs its own values, no averages)", RUN)
    progress: bool = option(True, "show a progress bar (--no-progress: none)", RUN)
    export_hf: bool = option(True, "export Hugging Face discriminator/ and generator/ directories at the end "
                                   "(--no-export-hf: none)", RUN)

    def filled(self) -> PretrainConfig:
        """A copy with preset defaults filled in and every value validated (`UserError` on a bad one)."""
        preset = get_preset(self.preset)
        if self.variant not in VARIANTS:
            raise UserError(f"unknown variant {self.variant!r}; choose one of {', '.join(VARIANTS)}")
        steps = _given_or(self.steps, preset.steps)
        output_dir = Path(self.output_dir or Path(DEFAULT_OUTPUT) / self.variant)
        out = replace(self, vocab_size=_given_or(self.vocab_size, preset.vocab_size),
                      max_len=_given_or(self.max_len, preset.max_len), steps=steps,
                      batch_size=_given_or(self.batch_size, preset.batch_size),
                      learning_rate=_given_or(self.learning_rate, preset.learning_rate),
                      warmup_steps=_given_or(self.warmup_steps, min(preset.warmup_steps, steps // 10)),
                      dropout=_given_or(self.dropout, preset.dropout),
                      output_dir=str(output_dir.resolve()),
                      cache_dir=str(Path(self.cache_dir or output_dir.parent / "cache").resolve()))
        sizes = model_preset(out)
        checks = [
            (out.steps >= 1, f"--steps must be >= 1, got {out.steps}"),
            (out.batch_size >= 1, f"--batch-size must be >= 1, got {out.batch_size}"),
            (out.learning_rate > 0, f"--lr must be > 0, got {out.learning_rate}"),
            (0 <= out.warmup_steps <= out.steps, f"--warmup-steps must be in [0, steps], got {out.warmup_steps}"),
            (8 <= out.max_len <= preset.max_positions, f"--max-len must be in [8, {preset.max_positions}] "
                                                       f"for preset {preset.name}, got {out.max_len}"),
            (out.vocab_size >= 100, f"--vocab-size must be >= 100, got {out.vocab_size}"),
            (0 < out.mask_prob < 1, f"--mask-prob must be in (0, 1), got {out.mask_prob}"),
            (0 <= out.mask_token_prob <= 1, f"--mask-token-prob must be in [0, 1], got {out.mask_token_prob}"),
            (out.replacements in REPLACEMENTS, f"--replacements must be one of {', '.join(REPLACEMENTS)}, "
                                               f"got {out.replacements!r}"),
            (out.buffer_size >= out.batch_size, f"--buffer-size ({out.buffer_size}) must be >= the batch size "
                                                f"({out.batch_size})"),
            (out.alpha >= 0, f"--alpha must be >= 0, got {out.alpha}"),
            (out.beta is None or out.beta >= 0, f"--beta must be >= 0, got {out.beta}"),
            (out.eviction is None or out.eviction in EVICTIONS,
             f"--eviction must be one of {', '.join(EVICTIONS)}, got {out.eviction!r}"),
            (out.eviction is None or out.variant != "electra", "--eviction applies to a tmr variant's buffer; "
                                                               "electra replays nothing"),
            (type(out.delay_steps) is int and out.delay_steps >= 0,
             f"--delay-steps must be an integer >= 0, got {out.delay_steps!r}"),
            (out.delay_steps == 0 or out.variant == "electra",
             f"--delay-steps is the electra variant's control; {out.variant} replays its own buffer"),
            (0 <= out.dropout < 1, f"--dropout must be in [0, 1), got {out.dropout}"),
            (out.grad_norm_method in ("ghost", "loop"), f"--grad-norm-method must be ghost or loop, "
                                                        f"got {out.grad_norm_method!r}"),
            (out.amp in ("none", "bf16", "fp16"), f"--amp must be none, bf16 or fp16, got {out.amp!r}"),
            (out.dist_timeout > 0, f"--dist-timeout must be > 0, got {out.dist_timeout}"),
            (out.heldout_every >= 1, f"--heldout-every must be >= 1, got {out.heldout_every}"),
            (out.checkpoint_every >= 0, f"--checkpoint-every must be >= 0, got {out.checkpoint_every}"),
            (out.log_every >= 1, f"--log-every must be >= 1, got {out.log_every}"),
            (out.clip_norm > 0, f"--clip must be > 0, got {out.clip_norm}"),
            (sizes.hidden >= 1 and sizes.hidden % sizes.heads == 0,
             f"--hidden must be a positive multiple of the preset's {sizes.heads} heads, got {sizes.hidden}"),
            (sizes.layers >= 1, f"--layers must be >= 1, got {sizes.layers}"),
            (0 < sizes.generator_fraction <= 1, f"--generator-fraction must be in (0, 1], "
                                                f"got {sizes.generator_fraction}"),
            (sizes.generator_hidden >= 1 and sizes.generator_hidden % sizes.generator_heads == 0,
             f"the generator hidden size (--hidden x --generator-fraction = {sizes.generator_hidden}) must be a "
             f"positive multiple of the preset's {sizes.generator_heads} generator heads"),
            (sizes.generator_layers is None or sizes.generator_layers >= 1, f"--generator-layers must be >= 1, got {sizes.generator_layers}"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)
        return out

    def to_json(self) -> dict:
        return asdict(self)


def _given_or(value, preset_value):
    """The value given, else the preset's: an explicit 0 stays 0 and is then rejected by `filled`'s checks."""
    return preset_value if value is None else value


def buffer_strategy(config: PretrainConfig) -> Strategy:
    """The variant's replayloader strategy, with the eviction rule --eviction names (if any) in place of its own."""
    strategy = by_name(VARIANTS[config.variant])
    if config.eviction is None:
        return strategy
    return Strategy(strategy.init, strategy.update, EVICTIONS[config.eviction]())


def model_preset(config: PretrainConfig) -> Preset:
    """The preset's sizes with the run's overrides: --hidden (FFN 4H, embedding H), --layers, the generator's."""
    sizes = {} if config.hidden is None else {"hidden": config.hidden, "ffn": 4 * config.hidden,
                                              "embedding": config.hidden}
    return with_overrides(get_preset(config.preset), max_len=config.max_len, layers=config.layers,
                          generator_fraction=config.generator_fraction, generator_layers=config.generator_layers,
                          **sizes)


def saved_run_config(run_dir: str | Path, flag: str = "--run") -> PretrainConfig:
    """The filled config a finished or running pretraining run saved in OUTPUT_DIR/config.json; a bad directory
    is a `UserError` naming ``flag``."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise UserError(f"{flag}: {str(run_dir)!r} is not a pretraining run directory (no config.json)")
    return _from_saved(json.loads(path.read_text()))


def _from_saved(saved: dict) -> PretrainConfig:
    """A config from its saved form, ignoring fields an older version wrote that no longer exist."""
    names = {f.name for f in fields(PretrainConfig)}
    return PretrainConfig(**{k: v for k, v in saved.items() if k in names})


def resume_config(path: str, **overrides) -> PretrainConfig:
    """The config saved with a checkpoint, updated with exactly ``overrides`` (the options the user gave).

    The checkpoint is the newest under ``path`` that verifies (`checkpoint.choose_checkpoint`). The run
    continues in the run directory ``path`` names (a copy of a run continues in the copy), never in the
    ``--output-dir`` saved with it, unless ``overrides`` gives one.
    """
    from .checkpoint import choose_checkpoint

    checkpoint = choose_checkpoint(path)
    saved = checkpoint.state["config"]
    unknown = sorted(set(overrides) - {f.name for f in fields(PretrainConfig)})
    if unknown:
        raise UserError(f"unknown option(s) {', '.join(unknown)}")
    base = _from_saved(saved)
    if overrides.get("delay_steps", base.delay_steps) != base.delay_steps:
        raise UserError(f"--delay-steps {overrides['delay_steps']} on --resume: the run was started with "
                        f"--delay-steps {base.delay_steps}, and its checkpoint holds that delay line's queue")
    return replace(base, **{"output_dir": str(checkpoint.run_dir), **overrides}, resume=str(checkpoint.path))

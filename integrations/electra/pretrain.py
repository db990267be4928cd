"""ELECTRA and TMR pretraining: one loop for every variant, read top to bottom.

One step (TMR, paper §"Joint Learning"):

    raw batch ─► mask 15% ─► generator ─► Gumbel-max sample (no grad) ─► corrupted batch ─► buffer.add
                                   │                                                          │
                                   L_G                                buffer.sample(K) ─► discriminator ─► L_D
    loss = L_G + 50·L_D ─► backward ─► clip 1.0 ─► AdamW ─► per-example L_D (or grad norm) ─► buffer weights

The producer (masking + generator + sampling) runs inside `replayloader.ReplayDataLoader`; it returns the
corrupted examples plus ``aux`` holding L_G, whose graph is still alive for the joint backward. ELECTRA is the
same loop with the ``none`` strategy: the discriminator gets exactly the batch just produced.
"""
from __future__ import annotations

import contextlib
import json
import math
import random
import shutil
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.numpy import load_file as load_numpy_file
from safetensors.numpy import save_file as save_numpy_file
from safetensors.torch import load_file as load_torch_file
from safetensors.torch import save_file as save_torch_file

from replayloader import ReplayBuffer, ReplayDataLoader
from replayloader.checkpoint import flatten_state, unflatten_state
from replayloader.strategies import by_name

from .data import BatchStream, prepare_pretraining_data
from .grad_norms import GhostNorms, logit_gradient_bound, loop_grad_norms, spearman
from .models import ElectraPair, Preset, build_electra_pair, get_preset, resized, with_overrides

VARIANTS: dict[str, str] = {  # variant name -> replayloader strategy name
    "electra": "none",
    "tmr-loss_diff": "loss_diff",
    "tmr-grad_norm": "grad_norm",
    "tmr-grad_bound": "grad_bound",
    "tmr-lsr": "lsr",
    "tmr-linucb": "linucb",
    "tmr-loss": "loss",
}
REPLACEMENTS = ("generator", "uniform")  # where the discriminator's replaced tokens come from
CHECKPOINT_FORMAT = 1


# ============================================================================ configuration
@dataclass
class PretrainConfig:
    """Everything a run depends on. ``None`` fields take the preset's value (see `filled`)."""

    variant: str = "tmr-loss_diff"
    preset: str = "tiny"
    corpus: str = "python-docs"
    corpus_config: str | None = None
    tokenizer: str | None = None  # directory of a saved fast tokenizer; None trains WordPiece on the corpus
    vocab_size: int | None = None
    max_len: int | None = None
    steps: int | None = None
    batch_size: int | None = None
    learning_rate: float | None = None
    warmup_steps: int | None = None
    dropout: float | None = None
    # Model size overrides (None: the preset's). hidden H also sets FFN 4H and embedding H; see models.resized.
    hidden: int | None = None
    layers: int | None = None
    generator_fraction: float | None = None  # generator hidden and FFN as a fraction of the discriminator's
    generator_layers: int | None = None  # None: the discriminator's depth
    weight_decay: float = 0.01
    discriminator_weight: float = 50.0
    mask_prob: float = 0.15
    mask_token_prob: float = 0.85  # of the masked positions; the rest keep their token (none random)
    # "uniform": a diagnostic. Replacements are drawn uniformly from the non-special vocabulary instead of from
    # the generator (which still trains), an easy task any working discriminator learns in a few dozen steps.
    replacements: str = "generator"
    buffer_size: int = 1000
    alpha: float = 1.0
    beta: float | None = None
    grad_norm_method: str = "ghost"  # "ghost" (hooks, inside the training backward) or "loop" (B extra passes)
    clip_norm: float = 1.0
    seed: int = 0
    device: str = "auto"
    amp: str = "none"  # "bf16" / "fp16" autocast, CUDA only
    compile: bool = False  # torch.compile of the discriminator, CUDA only
    output_dir: str = "runs/pretrain"
    cache_dir: str | None = None  # default: <output_dir>/../cache
    checkpoint_every: int = 0  # 0: only at the end
    keep_checkpoints: int = 2
    resume: str | None = None
    max_lines: int | None = None
    progress: bool = True
    export_hf: bool = True

    def filled(self) -> PretrainConfig:
        """A copy with preset defaults filled in and every value validated (ValueError on a bad one)."""
        preset = get_preset(self.preset)
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown variant {self.variant!r}; choose one of {', '.join(VARIANTS)}")
        steps = self.steps if self.steps is not None else preset.steps
        warmup = self.warmup_steps if self.warmup_steps is not None else min(preset.warmup_steps, steps // 10)
        out = replace(self, vocab_size=self.vocab_size or preset.vocab_size, max_len=self.max_len or preset.max_len,
                      steps=steps, batch_size=self.batch_size or preset.batch_size,
                      learning_rate=self.learning_rate if self.learning_rate is not None else preset.learning_rate,
                      warmup_steps=warmup, dropout=self.dropout if self.dropout is not None else preset.dropout,
                      output_dir=str(Path(self.output_dir).resolve()),
                      cache_dir=str(Path(self.cache_dir or Path(self.output_dir).parent / "cache").resolve()))
        checks = [
            (out.steps >= 1, f"--steps must be >= 1, got {out.steps}"),
            (out.batch_size >= 1, f"--batch-size must be >= 1, got {out.batch_size}"),
            (out.learning_rate > 0, f"--lr must be > 0, got {out.learning_rate}"),
            (0 <= out.warmup_steps <= out.steps, f"--warmup-steps must be in [0, steps], got {out.warmup_steps}"),
            (8 <= out.max_len <= preset.max_positions, f"--max-len must be in [8, {preset.max_positions}] "
                                                       f"for preset {preset.name}, got {out.max_len}"),
            (out.vocab_size >= 100, f"--vocab-size must be >= 100, got {out.vocab_size}"),
            (0 < out.mask_prob < 1, f"--mask-prob must be in (0, 1), got {out.mask_prob}"),
            (0 <= out.mask_token_prob <= 1, f"mask_token_prob must be in [0, 1], got {out.mask_token_prob}"),
            (out.replacements in REPLACEMENTS, f"--replacements must be one of {', '.join(REPLACEMENTS)}, "
                                               f"got {out.replacements!r}"),
            (out.buffer_size >= out.batch_size, f"--buffer-size ({out.buffer_size}) must be >= the batch size "
                                                f"({out.batch_size})"),
            (out.alpha >= 0, f"--alpha must be >= 0, got {out.alpha}"),
            (out.beta is None or out.beta >= 0, f"--beta must be >= 0, got {out.beta}"),
            (0 <= out.dropout < 1, f"--dropout must be in [0, 1), got {out.dropout}"),
            (out.grad_norm_method in ("ghost", "loop"), f"--grad-norm-method must be ghost or loop, "
                                                        f"got {out.grad_norm_method!r}"),
            (out.amp in ("none", "bf16", "fp16"), f"--amp must be none, bf16 or fp16, got {out.amp!r}"),
            (out.checkpoint_every >= 0, f"--checkpoint-every must be >= 0, got {out.checkpoint_every}"),
            (out.clip_norm > 0, f"--clip must be > 0, got {out.clip_norm}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        out.model_preset()  # ValueError on sizes that cannot build a model
        return out

    def model_preset(self) -> Preset:
        """The preset with this run's sequence length and size overrides: what the models are built from."""
        preset = with_overrides(get_preset(self.preset), max_len=self.max_len)
        return resized(preset, self.hidden, self.layers, self.generator_fraction, self.generator_layers)

    def to_json(self) -> dict:
        return asdict(self)


def pick_device(name: str) -> torch.device:
    """"auto" picks CUDA, then MPS, then CPU; an unavailable explicit device is a clear error."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device 'mps' requested but MPS is not available")
    return device


# ============================================================================ masking and sampling
@dataclass(frozen=True)
class SpecialIds:
    pad: int
    cls: int
    sep: int
    mask: int

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> SpecialIds:
        return cls(tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.mask_token_id)


def choose_masked_positions(input_ids: torch.Tensor, attention_mask: torch.Tensor, special: SpecialIds,
                            mask_prob: float) -> torch.Tensor:
    """Bool (B, T): round(mask_prob · n) (at least 1) uniformly chosen non-special, non-padding positions per row."""
    eligible = attention_mask.bool() & (input_ids != special.cls) & (input_ids != special.sep) \
        & (input_ids != special.pad)
    count = eligible.sum(1)
    k = torch.minimum((count.float() * mask_prob).round().long().clamp_min(1), count)
    scores = torch.rand(input_ids.shape, device=input_ids.device).masked_fill(~eligible, 2.0)
    rank = scores.argsort(1).argsort(1)
    return rank < k[:, None]


def mask_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor, special: SpecialIds, mask_prob: float,
                mask_token_prob: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(generator input, masked positions): masked positions become [MASK] with probability mask_token_prob and
    keep their token otherwise (ELECTRA: no random replacement)."""
    masked = choose_masked_positions(input_ids, attention_mask, special, mask_prob)
    use_mask_token = masked & (torch.rand(input_ids.shape, device=input_ids.device) < mask_token_prob)
    return input_ids.masked_fill(use_mask_token, special.mask), masked


def gumbel_max_sample(logits: torch.Tensor) -> torch.Tensor:
    """argmax(logits + Gumbel noise) in float32: an exact sample of softmax(logits), no gradient, no NaNs."""
    with torch.no_grad():
        logits = logits.detach().float()
        uniform = torch.rand(logits.shape, device=logits.device, dtype=torch.float32)
        uniform.clamp_(min=torch.finfo(torch.float32).tiny, max=1.0 - torch.finfo(torch.float32).eps)
        return (logits - torch.log(-torch.log(uniform))).argmax(-1)


def uniform_replacements(logits: torch.Tensor, special: SpecialIds) -> torch.Tensor:
    """Token ids drawn uniformly from the vocabulary minus the special tokens, one per row of ``logits``."""
    allowed = torch.ones(logits.shape[-1], dtype=torch.bool, device=logits.device)
    allowed[[special.pad, special.cls, special.sep, special.mask]] = False
    candidates = allowed.nonzero().squeeze(1)
    return candidates[torch.randint(len(candidates), logits.shape[:-1], device=logits.device)]


def explicit_positions(input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) position and segment ids (HF's default buffers have batch dim 1, which mixes ghost-norm examples)."""
    b, t = input_ids.shape
    positions = torch.arange(t, device=input_ids.device).expand(b, t)
    return positions, torch.zeros_like(input_ids)


def corrupt_batch(generator: torch.nn.Module, raw: Mapping[str, torch.Tensor], special: SpecialIds,
                  mask_prob: float = 0.15, mask_token_prob: float = 0.85,
                  autocast: contextlib.AbstractContextManager | None = None,
                  replacements: str = "generator") -> tuple[dict, dict]:
    """Mask, run the generator (vocabulary logits at masked positions only), sample replacements (from the
    generator, or uniformly from the vocabulary with ``replacements="uniform"``).

    Returns (examples for the buffer, aux) where aux["generator_loss"] still carries its graph. A sampled token
    equal to the original counts as original, so ``input_ids != original_ids`` are exactly the replaced tokens.
    """
    input_ids, attention_mask = raw["input_ids"], raw["attention_mask"]
    generator_input, masked = mask_inputs(input_ids, attention_mask, special, mask_prob, mask_token_prob)
    positions, segments = explicit_positions(input_ids)
    with autocast or contextlib.nullcontext():
        hidden = generator.electra(input_ids=generator_input, attention_mask=attention_mask,
                                   position_ids=positions, token_type_ids=segments).last_hidden_state
        logits = generator.generator_lm_head(generator.generator_predictions(hidden[masked]))
    targets = input_ids[masked]
    generator_loss = F.cross_entropy(logits.float(), targets)
    sampled = gumbel_max_sample(logits) if replacements == "generator" else uniform_replacements(logits, special)
    corrupted = input_ids.clone()
    corrupted[masked] = sampled
    examples = {"input_ids": corrupted, "original_ids": input_ids, "attention_mask": attention_mask,
                "masked": masked}
    with torch.no_grad():
        aux = {"generator_loss": generator_loss,
               "generator_accuracy": (logits.argmax(-1) == targets).float().mean().item(),
               "changed_fraction": (sampled != targets).float().mean().item()}
    return examples, aux


class CorruptionProducer:
    """The `ReplayDataLoader` producer: next raw batch from the stream -> `corrupt_batch`, timed."""

    def __init__(self, generator: torch.nn.Module, stream: BatchStream, special: SpecialIds, mask_prob: float,
                 mask_token_prob: float, autocast_factory=contextlib.nullcontext,
                 replacements: str = "generator") -> None:
        self.generator = generator
        self.stream = stream
        self.special = special
        self.mask_prob = mask_prob
        self.mask_token_prob = mask_token_prob
        self.autocast_factory = autocast_factory
        self.replacements = replacements

    def __call__(self) -> tuple[dict, dict]:
        started = time.perf_counter()
        raw = next(self.stream)
        fetched = time.perf_counter()
        examples, aux = corrupt_batch(self.generator, raw, self.special, self.mask_prob, self.mask_token_prob,
                                      self.autocast_factory(), self.replacements)
        aux["data_seconds"] = fetched - started
        aux["produce_seconds"] = time.perf_counter() - started
        return examples, aux


# ============================================================================ discriminator loss
@dataclass
class DiscriminatorLosses:
    logits: torch.Tensor  # (B, T) float32
    labels: torch.Tensor  # (B, T) 1.0 where replaced
    mask: torch.Tensor  # (B, T) 1.0 at real tokens
    per_example: torch.Tensor  # (B,) mean BCE over each example's real tokens
    loss: torch.Tensor  # scalar: token mean over the batch (importance-weighted when weights are given)
    coefficients: torch.Tensor  # (B,) c_i with loss == Σ_i c_i · per_example_i


def discriminator_losses(discriminator: torch.nn.Module, data: Mapping[str, torch.Tensor],
                         weights: torch.Tensor | None = None,
                         autocast: contextlib.AbstractContextManager | None = None) -> DiscriminatorLosses:
    """Replaced-token detection loss, per example and for the batch, with the labels made from the data."""
    input_ids = data["input_ids"]
    positions, segments = explicit_positions(input_ids)
    with autocast or contextlib.nullcontext():
        logits = discriminator(input_ids=input_ids, attention_mask=data["attention_mask"], position_ids=positions,
                               token_type_ids=segments).logits
    logits = logits.float()
    labels = (input_ids != data["original_ids"]).float()
    mask = data["attention_mask"].float()
    per_token = F.binary_cross_entropy_with_logits(logits, labels, reduction="none") * mask
    tokens = mask.sum(1)
    per_example = per_token.sum(1) / tokens
    coefficients = tokens / tokens.sum()
    if weights is not None:
        coefficients = coefficients * weights
    loss = (coefficients * per_example).sum()
    return DiscriminatorLosses(logits, labels, mask, per_example, loss, coefficients)


# ============================================================================ optimisation
def make_optimizer(model: torch.nn.Module, learning_rate: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW(β=(0.9, 0.999), ε=1e-6); weight decay on everything but LayerNorm and bias parameters."""
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():  # shared tensors are listed once
        (no_decay if "LayerNorm" in name or name.endswith("bias") else decay).append(parameter)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=learning_rate, betas=(0.9, 0.999), eps=1e-6)


def warmup_then_linear_decay(warmup_steps: int, total_steps: int):
    """LR multiplier: linear 0 -> 1 over warmup, then linear 1 -> 0 at the last step."""
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))
    return factor


# ============================================================================ checkpoints
def save_checkpoint(directory: Path, step: int, config: PretrainConfig, pair: ElectraPair,
                    optimizer: torch.optim.Optimizer, scheduler: Any, loader: ReplayDataLoader,
                    stream: BatchStream) -> Path:
    """Write ``step-XXXXXXX/`` with tensors.safetensors, loader.safetensors and state.json (atomic rename)."""
    final = directory / f"step-{step:08d}"
    tmp = directory / f".tmp-step-{step:08d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tensors = {f"model/{name}": p.detach().cpu().contiguous() for name, p in pair.named_parameters()}
    optimizer_state = optimizer.state_dict()
    for index, state in optimizer_state["state"].items():
        for key, value in state.items():
            tensors[f"optimizer/{index}/{key}"] = value.detach().cpu().contiguous()
    tensors["rng/torch"] = torch.get_rng_state()
    if torch.cuda.is_available():
        for i, rng in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng/cuda/{i}"] = rng
    save_torch_file(tensors, str(tmp / "tensors.safetensors"))
    arrays, loader_meta = flatten_state(loader.state_dict())
    save_numpy_file({k: (v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.ascontiguousarray(v))
                     for k, v in arrays.items()}, str(tmp / "loader.safetensors"))
    numpy_rng = np.random.get_state()
    state = {
        "format": CHECKPOINT_FORMAT, "step": step, "config": config.to_json(),
        "optimizer": {"param_groups": optimizer_state["param_groups"],
                      "state_keys": {str(i): sorted(s) for i, s in optimizer_state["state"].items()}},
        "scheduler": scheduler.state_dict(), "loader": loader_meta, "stream": stream.state_dict(),
        "rng": {"python": _python_rng_to_json(random.getstate()),
                "numpy": [numpy_rng[0], numpy_rng[1].tolist(), *numpy_rng[2:]]},
    }
    (tmp / "state.json").write_text(json.dumps(state))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


def find_checkpoint(path: str) -> Path:
    """Accept a step directory, a checkpoints directory or a run directory; return the newest step directory."""
    p = Path(path)
    if (p / "state.json").is_file():
        return p
    for candidate in (p / "checkpoints", p):
        steps = sorted(candidate.glob("step-*")) if candidate.is_dir() else []
        steps = [s for s in steps if (s / "state.json").is_file()]
        if steps:
            return steps[-1]
    raise FileNotFoundError(f"no checkpoint found under {path}")


def read_checkpoint_config(path: str) -> dict:
    return json.loads((find_checkpoint(path) / "state.json").read_text())["config"]


def load_checkpoint(path: Path, pair: ElectraPair, optimizer: torch.optim.Optimizer, scheduler: Any,
                    loader: ReplayDataLoader, stream: BatchStream) -> int:
    """Restore everything `save_checkpoint` wrote (RNG states last) and return the step it was taken at."""
    state = json.loads((path / "state.json").read_text())
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint format {state.get('format')!r} is not supported")
    tensors = load_torch_file(str(path / "tensors.safetensors"))
    with torch.no_grad():
        for name, parameter in pair.named_parameters():
            parameter.copy_(tensors[f"model/{name}"])
    optimizer_state = {"param_groups": state["optimizer"]["param_groups"], "state": {}}
    for index, keys in state["optimizer"]["state_keys"].items():
        optimizer_state["state"][int(index)] = {key: tensors[f"optimizer/{index}/{key}"] for key in keys}
    optimizer.load_state_dict(optimizer_state)
    scheduler.load_state_dict(state["scheduler"])
    loader.load_state_dict(unflatten_state(load_numpy_file(str(path / "loader.safetensors")), state["loader"]))
    stream.load_state_dict(state["stream"])
    random.setstate(_python_rng_from_json(state["rng"]["python"]))
    kind, keys, *rest = state["rng"]["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(tensors["rng/torch"])
    cuda_states = [tensors[k] for k in sorted(tensors) if k.startswith("rng/cuda/")]
    if cuda_states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda_states)
    return int(state["step"])


def _python_rng_to_json(state: tuple) -> list:
    return [state[0], list(state[1]), state[2]]


def _python_rng_from_json(state: list) -> tuple:
    return (state[0], tuple(state[1]), state[2])


def _prune_checkpoints(directory: Path, keep: int) -> None:
    steps = sorted(p for p in directory.glob("step-*") if p.is_dir())
    for old in steps[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


# ============================================================================ logging
class MetricsLog:
    """One JSON object per step in metrics.jsonl; on resume, records after the checkpoint step are dropped."""

    def __init__(self, path: Path, resume_step: int | None) -> None:
        self.path = path
        kept = []
        if resume_step is not None and path.exists():
            kept = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= resume_step]
        path.write_text("".join(line + "\n" for line in kept))
        self.file = open(path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self.file.write(json.dumps(clean) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def read_metrics(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line]


def _fraction(numerator: torch.Tensor, denominator: torch.Tensor) -> float:
    d = float(denominator)
    return float(numerator) / d if d > 0 else float("nan")


def drift_metrics(data: Mapping[str, torch.Tensor], losses: DiscriminatorLosses, fresh: np.ndarray) -> dict:
    """Distribution-drift view of a sampled batch: how many masked tokens differ, fresh vs replayed, and accuracy."""
    masked = data["masked"]
    changed = (data["input_ids"] != data["original_ids"]) & masked
    fresh_rows = torch.from_numpy(np.asarray(fresh, dtype=bool)).to(masked.device)
    predicted = (losses.logits > 0).float()
    real = losses.mask.bool()
    replaced = losses.labels.bool() & real
    original = ~losses.labels.bool() & real
    return {
        "changed_fraction_fresh": _fraction(changed[fresh_rows].sum(), masked[fresh_rows].sum()),
        "changed_fraction_replayed": _fraction(changed[~fresh_rows].sum(), masked[~fresh_rows].sum()),
        "fresh_fraction": float(fresh_rows.float().mean()),
        "replaced_fraction": _fraction(replaced.sum(), real.sum()),
        "discriminator_accuracy": _fraction(((predicted == losses.labels) & real).sum(), real.sum()),
        "replaced_accuracy": _fraction((predicted.bool() & replaced).sum(), replaced.sum()),
        "original_accuracy": _fraction((~predicted.bool() & original).sum(), original.sum()),
        "replaced_auc": ranking_auc(losses.logits[replaced], losses.logits[original]),
        # On fresh rows only: examples D has never trained on, comparable across variants (replayed rows were
        # trained on before, which flatters the sampled-batch numbers of TMR).
        "discriminator_loss_fresh": float(losses.per_example[fresh_rows].detach().mean()) if fresh_rows.any() else None,
        "replaced_auc_fresh": ranking_auc(losses.logits[replaced & fresh_rows[:, None]],
                                          losses.logits[original & fresh_rows[:, None]]),
    }


def ranking_auc(positive: torch.Tensor, negative: torch.Tensor) -> float:
    """P(score of a replaced token > score of an original one): shows D learning before any logit crosses 0."""
    if positive.numel() == 0 or negative.numel() == 0:
        return float("nan")
    scores = torch.cat([positive, negative]).detach().double()
    ranks = scores.argsort().argsort().double() + 1
    n_pos, n_neg = positive.numel(), negative.numel()
    return float((ranks[:n_pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def plot_metrics(runs: Mapping[str, list[dict]], path: str | Path) -> None:
    """Loss and drift curves of one or more runs in one PNG (moving average over ~2% of the steps)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("generator_loss", "generator loss L_G"), ("discriminator_loss", "discriminator loss L_D"),
              ("replaced_auc", "D ranking AUC, replaced vs original"),
              ("changed_fraction_fresh", "masked tokens changed (fresh)"),
              ("changed_fraction_replayed", "masked tokens changed (replayed)"),
              ("sample_age_mean", "age of sampled examples (steps)")]
    fig, axes = plt.subplots(2, 3, figsize=(14, 7))
    for ax, (key, title) in zip(axes.flat, panels):
        for index, (name, records) in enumerate(runs.items()):
            points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
            if not points:
                continue
            steps, values = map(np.asarray, zip(*points))
            window = max(1, len(values) // 50)
            smooth = np.convolve(values, np.ones(window) / window, mode="valid")
            ax.plot(steps[window - 1:], smooth, label=name, color=f"C{index}")  # same colour in every panel
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes.flat[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def summarize(records: list[dict], tail: float = 0.1) -> dict:
    """Means over the last ``tail`` fraction of steps (losses, accuracies, drift) and timing over all but the first."""
    if not records:
        return {}
    last = records[-max(1, int(len(records) * tail)):]
    timed = records[1:] or records

    def mean(rows: list[dict], key: str) -> float | None:
        values = [r[key] for r in rows if r.get(key) is not None]
        return float(np.mean(values)) if values else None

    keys = ["loss", "generator_loss", "discriminator_loss", "generator_accuracy", "discriminator_accuracy",
            "replaced_accuracy", "replaced_auc", "discriminator_loss_fresh", "replaced_auc_fresh",
            "changed_fraction_produced", "changed_fraction_fresh",
            "changed_fraction_replayed", "fresh_fraction", "sample_age_mean", "buffer_weight_std",
            "buffer_mean_visits", "example_grad_norm_mean", "bound_vs_norm_spearman"]
    out = {f"final_{k}": mean(last, k) for k in keys}
    out.update(steps=records[-1]["step"], seconds_per_step=mean(timed, "step_seconds"),
               data_seconds_per_step=mean(timed, "data_seconds"),
               produce_seconds_per_step=mean(timed, "produce_seconds"))
    return out


# ============================================================================ the run
@dataclass
class PretrainResult:
    config: PretrainConfig
    output_dir: str
    discriminator_dir: str | None
    metrics_path: str
    plot_path: str
    summary: dict = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)


def pretrain(config: PretrainConfig) -> PretrainResult:
    """Run (or resume) one pretraining run; every variant goes through exactly this function."""
    if config.resume:
        saved = read_checkpoint_config(config.resume)
        defaults = PretrainConfig()
        overrides = {k: getattr(config, k) for k in ("steps", "checkpoint_every", "progress", "device", "output_dir")
                     if getattr(config, k) != getattr(defaults, k)}
        config = replace(PretrainConfig(**{f.name: saved[f.name] for f in fields(PretrainConfig) if f.name in saved}),
                         resume=config.resume, **overrides)
    cfg = config.filled()
    device = pick_device(cfg.device)
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    use_cuda_extras = device.type == "cuda"
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.amp) if use_cuda_extras else None

    def autocast():
        if amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=amp_dtype)

    # ---- data: tokenizer + packed examples (cached, memory-mapped)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    data = prepare_pretraining_data(cfg.corpus, cfg.cache_dir, cfg.vocab_size, cfg.max_len, cfg.corpus_config,
                                    cfg.tokenizer, cfg.max_lines)
    special = SpecialIds.from_tokenizer(data.tokenizer)
    stream = BatchStream(data.examples, cfg.batch_size, cfg.seed, special.pad, device)

    # ---- models, optimizer, schedule
    preset = cfg.model_preset()
    pair = build_electra_pair(preset, len(data.tokenizer), special.pad, cfg.dropout, seed=cfg.seed).to(device)
    pair.train()
    optimizer = make_optimizer(pair, cfg.learning_rate, cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_then_linear_decay(cfg.warmup_steps, cfg.steps))
    scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None
    generator, discriminator = pair.generator, pair.discriminator
    if cfg.compile and use_cuda_extras and cfg.variant != "tmr-grad_norm":  # ghost-norm hooks need eager mode
        discriminator = torch.compile(discriminator)  # a compiled view; `pair` keeps the eager module and names

    # ---- the memory buffer between generator and discriminator
    buffer = ReplayBuffer(cfg.buffer_size, alpha=cfg.alpha, beta=cfg.beta, strategy=by_name(VARIANTS[cfg.variant]),
                          seed=cfg.seed)
    feedback_key = buffer.strategy.update.feedback_key
    producer = CorruptionProducer(generator, stream, special, cfg.mask_prob, cfg.mask_token_prob, autocast,
                                  cfg.replacements)
    loader = ReplayDataLoader(producer, buffer, batch_size=cfg.batch_size, steps=cfg.steps)
    ghost = GhostNorms(pair.discriminator) if feedback_key == "grad_norm" and cfg.grad_norm_method == "ghost" else None

    start_step = 0
    checkpoint_dir = out_dir / "checkpoints"
    if cfg.resume:
        start_step = load_checkpoint(find_checkpoint(cfg.resume), pair, optimizer, scheduler, loader, stream)
    (out_dir / "config.json").write_text(json.dumps(cfg.to_json(), indent=1))
    log = MetricsLog(out_dir / "metrics.jsonl", start_step if cfg.resume else None)

    from tqdm.auto import tqdm

    bar = tqdm(total=cfg.steps, initial=start_step, disable=not cfg.progress, desc=cfg.variant, unit="step",
               dynamic_ncols=True)
    batches = iter(loader)
    run_started = time.perf_counter()
    try:
        while True:
            step_started = time.perf_counter()
            batch = next(batches, None)  # producer (mask + generator + sampling) -> buffer.add -> buffer.sample
            if batch is None:
                break
            step = loader.step
            weights = None if batch.weights is None else torch.as_tensor(batch.weights, dtype=torch.float32,
                                                                         device=device)
            # ---- discriminator on the sampled batch; joint loss L_G + λ·L_D
            with ghost.record() if ghost is not None else contextlib.nullcontext():
                d = discriminator_losses(discriminator, batch.data, weights, autocast())
            generator_loss = batch.aux["generator_loss"]
            loss = generator_loss + cfg.discriminator_weight * d.loss
            optimizer.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
            else:
                loss.backward()
            total_grad_norm = torch.nn.utils.clip_grad_norm_(pair.parameters(), cfg.clip_norm)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            lr = scheduler.get_last_lr()[0]  # the rate this step used (read before the scheduler advances)
            scheduler.step()

            # ---- per-example signals back to the buffer
            signals: dict[str, Any] = {"loss": d.per_example.detach()}
            example_norms = None
            if feedback_key == "grad_norm":
                if ghost is not None:
                    scale = cfg.discriminator_weight * d.coefficients.detach().double()
                    if scaler is not None:
                        scale = scale * scaler.get_scale()
                    example_norms = ghost.norms(scale)
                else:
                    example_norms = loop_grad_norms(
                        pair.discriminator, lambda m, b: discriminator_losses(m, b).per_example, batch.data)
                signals["grad_norm"] = example_norms.float()
            bound = logit_gradient_bound(d.logits, d.labels, d.mask)
            if feedback_key == "grad_bound":
                signals["grad_bound"] = bound
            loader.feedback(batch, **signals)

            # ---- metrics
            step_seconds = time.perf_counter() - step_started
            ages = batch.ages  # adds since each example was added; one add per step, so steps
            stats = buffer.stats()
            record = {
                "step": step, "lr": lr, "loss": loss.item(),
                "generator_loss": generator_loss.item(), "discriminator_loss": d.loss.item(),
                "generator_accuracy": batch.aux["generator_accuracy"],
                "changed_fraction_produced": batch.aux["changed_fraction"],
                **drift_metrics(batch.data, d, batch.fresh),
                "grad_total_norm": float(total_grad_norm), "sample_age_mean": float(ages.mean()),
                "example_loss_std": float(d.per_example.detach().std()) if len(d.per_example) > 1 else 0.0,
                "example_bound_mean": float(bound.mean()),
                "buffer_size": stats["size"], "buffer_weight_mean": stats.get("weight_mean"),
                "buffer_weight_std": stats.get("weight_std"), "buffer_weight_min": stats.get("weight_min"),
                "buffer_weight_max": stats.get("weight_max"), "buffer_mean_visits": stats.get("mean_visits"),
                "buffer_stale_feedback": stats.get("stale_feedback"),
                "data_seconds": batch.aux["data_seconds"], "produce_seconds": batch.aux["produce_seconds"],
                "step_seconds": step_seconds,
            }
            if example_norms is not None:
                record["example_grad_norm_mean"] = float(example_norms.mean())
                record["bound_vs_norm_spearman"] = spearman(bound.cpu(), example_norms.cpu())
            log.write(record)
            bar.update(1)
            bar.set_postfix(loss=f"{record['loss']:.3f}", G=f"{record['generator_loss']:.2f}",
                            D=f"{record['discriminator_loss']:.3f}", refresh=False)

            if (cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or step == cfg.steps:
                save_checkpoint(checkpoint_dir, step, cfg, pair, optimizer, scheduler, loader, stream)
                _prune_checkpoints(checkpoint_dir, cfg.keep_checkpoints)
    finally:
        bar.close()
        log.close()
        if ghost is not None:
            ghost.remove()
    wall = time.perf_counter() - run_started

    # ---- exports: HF directories for fine-tuning, curves, summary
    discriminator_dir = None
    if cfg.export_hf:
        discriminator_dir = str(out_dir / "discriminator")
        pair.discriminator.save_pretrained(discriminator_dir)
        data.tokenizer.save_pretrained(discriminator_dir)
        pair.generator.save_pretrained(str(out_dir / "generator"))
        data.tokenizer.save_pretrained(str(out_dir / "generator"))
    records = read_metrics(out_dir / "metrics.jsonl")
    plot_path = out_dir / "losses.png"
    plot_metrics({cfg.variant: records}, plot_path)
    summary = {"variant": cfg.variant, "preset": cfg.preset, "corpus": cfg.corpus, "device": str(device),
               "torch_threads": torch.get_num_threads(), "examples": len(data),
               "corpus_tokens": data.num_tokens, "data_prepare_seconds": data.prepare_seconds,
               "wall_seconds_this_session": wall, **summarize(records)}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return PretrainResult(cfg, str(out_dir), discriminator_dir, str(out_dir / "metrics.jsonl"), str(plot_path),
                          summary, [r["loss"] for r in records])


__all__ = ["VARIANTS", "PretrainConfig", "PretrainResult", "pretrain", "corrupt_batch", "discriminator_losses",
           "choose_masked_positions", "mask_inputs", "gumbel_max_sample", "SpecialIds", "make_optimizer",
           "warmup_then_linear_decay", "save_checkpoint", "load_checkpoint", "find_checkpoint", "summarize",
           "plot_metrics", "read_metrics"]

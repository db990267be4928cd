"""The fine-tuning recipe shared by GLUE and SQuAD: hyperparameter presets, input packing, the training loop.

Fine-tuning hyperparameters of ELECTRA (Clark et al. 2020), as presets that every flag can override.

batch 32, 10% linear warmup then linear decay to 0, layer-wise LR decay, Adam(β=(0.9, 0.999),
ε=1e-6), weight decay 0.01 (not on LayerNorm/bias), gradient clipping 1.0, max length 128,
3 epochs (10 for RTE and STS-B, 2 for SQuAD). Learning rate and layer decay by model size, from the
ELECTRA paper's fine-tuning table: small 3e-4 / 0.8, base 1e-4 / 0.8, large 5e-5 / 0.9 (the
reference code's default is 1e-4 for every size below large).

BERT/ELECTRA input packing shared by GLUE and SQuAD: ``[CLS] A [SEP] (B [SEP])``, padding, batching.

Packing is done here rather than by the tokenizer's post-processor, so a checkpoint whose saved
tokenizer lacks a post-processor still gets the special tokens the discriminator was trained with.

The fine-tuning loop shared by GLUE and SQuAD: layer-wise LR decay AdamW, warmup, clipping.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from torch import nn
from transformers import get_linear_schedule_with_warmup

from ..errors import UserError
from ..output import progress_bar, quiet_transformers
from ..runtime import Autocast, to_device
from .options import FINETUNE_PRESETS, SAMPLINGS, TrainingOptions


# --------------------------------------------------------------------------------------------------
# Fine-tuning hyperparameters of ELECTRA (Clark et al. 2020): the options (`options.TrainingOptions`) resolved
# against the preset and the task.
def preset_for_hidden_size(hidden_size: int) -> str:
    """ELECTRA sizes: small 256, base 768, large 1024 (smaller test models count as small)."""
    if hidden_size <= 256:
        return "small"
    if hidden_size <= 768:
        return "base"
    return "large"


@dataclass(frozen=True)
class FinetuneConfig:
    """One run's resolved settings: the options with the preset's and the task's values filled in, plus the
    fixed parts of ELECTRA's recipe."""

    learning_rate: float
    layer_decay: float
    epochs: float
    batch_size: int
    preset: str
    sampling: str  # "prioritized": batches from replayloader's PrioritizedSampler, fed the losses
    autocast: Autocast  # bf16 on CUDA when --amp, else off
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    adam_epsilon: float = 1e-6
    max_grad_norm: float = 1.0
    eval_batch_size: int = 64


def resolve_config(hidden_size: int, default_epochs: float, torch_device: torch.device | None = None,
                   **options) -> FinetuneConfig:
    """``options`` (fields of `TrainingOptions`) over the preset chosen by name or by the checkpoint's hidden size
    and the task's ``default_epochs``; a bad value is a `UserError` naming its option."""
    chosen = TrainingOptions(**options)
    preset_name = chosen.preset or preset_for_hidden_size(hidden_size)
    if preset_name not in FINETUNE_PRESETS:
        raise UserError(f"unknown --preset {preset_name!r}; choose from {', '.join(FINETUNE_PRESETS)}")
    if chosen.sampling not in SAMPLINGS:
        raise UserError(f"--sampling must be one of {', '.join(SAMPLINGS)}, got {chosen.sampling!r}")
    preset_lr, preset_decay = FINETUNE_PRESETS[preset_name]
    config = FinetuneConfig(
        learning_rate=preset_lr if chosen.learning_rate is None else chosen.learning_rate,
        layer_decay=preset_decay if chosen.layer_decay is None else chosen.layer_decay,
        epochs=default_epochs if chosen.epochs is None else chosen.epochs,
        batch_size=chosen.batch_size, preset=preset_name, sampling=chosen.sampling,
        autocast=Autocast.choose(torch_device or torch.device("cpu"), "bf16" if chosen.amp else "none"))
    for flag, value in (("--lr", config.learning_rate), ("--batch-size", config.batch_size),
                        ("--epochs", config.epochs)):
        if value <= 0:
            raise UserError(f"{flag} must be > 0, got {value}")
    return config


# --------------------------------------------------------------------------------------------------
# BERT/ELECTRA input packing shared by GLUE and SQuAD: ``[CLS] A [SEP] (B [SEP])``, padding, batching.
def truncate_pair(a: list[int], b: list[int] | None, max_tokens: int) -> tuple[list[int], list[int] | None]:
    """Longest-first truncation (HF's default): drop from the end of the longer text until it fits."""
    a = list(a)
    b = None if b is None else list(b)
    while len(a) + (len(b) if b is not None else 0) > max_tokens:
        if b is not None and len(b) > len(a):
            b.pop()
        else:
            a.pop()
    return a, b


def pack_inputs(cls_id: int, sep_id: int, a: Sequence[int], b: Sequence[int] | None = None) -> tuple[list[int], list[int]]:
    """Input ids and token type ids for one (already truncated) text or text pair."""
    ids = [cls_id, *a, sep_id]
    types = [0] * len(ids)
    if b is not None:
        ids += [*b, sep_id]
        types += [1] * (len(b) + 1)
    return ids, types


def encode_texts(tokenizer, texts_a: Sequence[str], texts_b: Sequence[str] | None, max_length: int) -> list[dict]:
    """Tokenise a batch of texts (or pairs) into packed features, truncated to ``max_length`` tokens."""
    with quiet_transformers():  # long texts are truncated below, not by the tokenizer
        ids_a = tokenizer(list(texts_a), add_special_tokens=False)["input_ids"]
        ids_b = tokenizer(list(texts_b), add_special_tokens=False)["input_ids"] if texts_b is not None else [None] * len(ids_a)
    specials = 2 if texts_b is None else 3
    features = []
    for a, b in zip(ids_a, ids_b):
        a, b = truncate_pair(a, b, max_length - specials)
        input_ids, token_type_ids = pack_inputs(tokenizer.cls_token_id, tokenizer.sep_token_id, a, b)
        # numpy rather than lists: MNLI/QQP train hold ~10^7 token ids
        features.append({"input_ids": np.asarray(input_ids, dtype=np.int32),
                         "token_type_ids": np.asarray(token_type_ids, dtype=np.int8)})
    return features


def pad_batch(features: Sequence[dict], pad_id: int, extra_keys: Sequence[str] = ()) -> dict[str, torch.Tensor]:
    """Right-pad to the longest sequence in the batch; ``extra_keys`` are stacked as tensors."""
    length = max(len(f["input_ids"]) for f in features)
    input_ids = torch.full((len(features), length), pad_id, dtype=torch.long)
    token_type_ids = torch.zeros((len(features), length), dtype=torch.long)
    attention_mask = torch.zeros((len(features), length), dtype=torch.long)
    for row, feature in enumerate(features):
        n = len(feature["input_ids"])
        input_ids[row, :n] = torch.as_tensor(np.asarray(feature["input_ids"], dtype=np.int64))
        token_type_ids[row, :n] = torch.as_tensor(np.asarray(feature["token_type_ids"], dtype=np.int64))
        attention_mask[row, :n] = 1
    batch = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}
    for key in extra_keys:
        batch[key] = torch.tensor([f[key] for f in features])
    return batch


# --------------------------------------------------------------------------------------------------
# The fine-tuning loop shared by GLUE and SQuAD: layer-wise LR decay AdamW, warmup, clipping.
_LAYER_INDEX = re.compile(r"(?:^|\.)layers?\.(\d+)\.")
_NO_DECAY = ("bias", "layernorm", "layer_norm", "ln_")


def parameter_depth(name: str, num_layers: int) -> int:
    """ELECTRA's depth of an encoder parameter: embeddings 0, transformer layer i -> i + 1.

    Parameters that are neither (e.g. BERT's unused pooler) sit just above the last layer.
    """
    if "embeddings" in name:  # also matches ELECTRA's embeddings_project
        return 0
    match = _LAYER_INDEX.search(name)
    if match:
        return int(match.group(1)) + 1
    return num_layers + 1


def layerwise_parameter_groups(
    encoder: nn.Module, head: nn.Module, num_layers: int, config: FinetuneConfig
) -> list[dict]:
    """AdamW groups with lr * decay^(num_layers + 2 - depth): the new head (depth num_layers + 2) gets
    the full LR, lower layers geometrically less (as in ELECTRA's ``_get_layer_lrs``).
    Weight decay is not applied to biases and LayerNorm weights."""
    groups: dict[tuple[int, bool], list[nn.Parameter]] = {}
    named = [(n, p, parameter_depth(n, num_layers)) for n, p in encoder.named_parameters()]
    named += [(n, p, num_layers + 2) for n, p in head.named_parameters()]
    for name, parameter, depth in named:
        if not parameter.requires_grad:
            continue
        decays = not any(marker in name.lower() for marker in _NO_DECAY)
        groups.setdefault((depth, decays), []).append(parameter)
    return [
        {
            "params": params,
            "lr": config.learning_rate * config.layer_decay ** (num_layers + 2 - depth),
            "weight_decay": config.weight_decay if decays else 0.0,
        }
        for (depth, decays), params in sorted(groups.items())
    ]


POSTFIX_EVERY = 50  # steps between the progress bar's loss readings (each one waits for the device)


@dataclass
class TrainStats:
    steps: int = 0
    seconds: float = 0.0
    epoch_mean_losses: list[float] = field(default_factory=list)


def iterate_batches(num_examples: int, batch_size: int, generator: torch.Generator | None) -> Iterator[list[int]]:
    order = torch.randperm(num_examples, generator=generator).tolist() if generator is not None else list(range(num_examples))
    for start in range(0, num_examples, batch_size):
        yield order[start : start + batch_size]


def prioritized_sampler(num_examples: int, config: FinetuneConfig, seed: int, total_steps: int):
    """``--sampling prioritized``: P(i) ~ the example's latest loss after one shuffled pass, 10% uniform draws,
    importance weights with beta annealed 0.4 -> 1 over the run (PER's schedule)."""
    from replayloader import LinearSchedule, PrioritizedSampler

    return PrioritizedSampler(num_examples, config.batch_size, beta=LinearSchedule(0.4, 1.0, total_steps),
                              uniform_fraction=0.1, seed=seed)


def train(
    model: nn.Module,
    encoder: nn.Module,
    head: nn.Module,
    features: Sequence[dict],
    collate: Callable[[list[dict]], dict[str, torch.Tensor]],
    compute_loss: Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor],  # per-example losses
    config: FinetuneConfig,
    seed: int,
    device: torch.device,
    description: str = "fine-tune",
    progress: bool = True,
) -> TrainStats:
    """Fine-tune ``model`` (``encoder`` + new ``head``) in place for ``config.epochs`` epochs."""
    if not features:
        raise UserError(f"{description}: no training examples")
    num_layers = int(getattr(encoder.config, "num_hidden_layers", 0))
    model.to(device).train()  # before the optimizer takes references to the parameters
    optimizer = torch.optim.AdamW(
        layerwise_parameter_groups(encoder, head, num_layers, config),
        betas=(0.9, 0.999),
        eps=config.adam_epsilon,
    )
    steps_per_epoch = math.ceil(len(features) / config.batch_size)
    total_steps = max(1, math.ceil(steps_per_epoch * config.epochs))
    scheduler = get_linear_schedule_with_warmup(optimizer, int(config.warmup_fraction * total_steps), total_steps)
    generator = torch.Generator().manual_seed(seed)
    sampler = prioritized_sampler(len(features), config, seed, total_steps) if config.sampling == "prioritized" else None
    stats = TrainStats()
    started = time.perf_counter()
    # redirected output gets a bar only for long runs, rarely redrawn (per-run summary lines are logged either way)
    bar = progress_bar(enabled=progress, total=total_steps, desc=description, leave=False, dynamic_ncols=True)
    while stats.steps < total_steps:
        epoch_losses: list[torch.Tensor] = []  # kept on the device: reading each step would make the host wait
        for drawn in iterate_batches(len(features), config.batch_size, generator) if sampler is None else sampler:
            if stats.steps >= total_steps:  # fractional epochs
                break
            indices = drawn if sampler is None else drawn.indices.tolist()
            batch = {k: to_device(v, device) for k, v in collate([features[i] for i in indices]).items()}
            with config.autocast():
                per_example = compute_loss(model, batch)
            if sampler is None:
                loss = per_example.mean()
            else:
                sampler.feedback(drawn, loss=per_example.detach())
                loss = (per_example * torch.as_tensor(drawn.weights, dtype=per_example.dtype, device=device)).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
            scheduler.step()
            stats.steps += 1
            epoch_losses.append(loss.detach().float())  # float32: MPS has no float64
            bar.update(1)
            if progress and stats.steps % POSTFIX_EVERY == 0:
                bar.set_postfix(loss=f"{float(epoch_losses[-1]):.4f}")
        stats.epoch_mean_losses.append(float(torch.stack(epoch_losses).cpu().double().mean()))
    bar.close()
    stats.seconds = time.perf_counter() - started
    return stats


@torch.no_grad()
def predict(
    model: nn.Module,
    features: Sequence[dict],
    collate: Callable[[list[dict]], dict[str, torch.Tensor]],
    forward: Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor | tuple[torch.Tensor, ...]],
    batch_size: int,
    device: torch.device,
    autocast: Autocast,
) -> Iterator[tuple[list[int], torch.Tensor | tuple[torch.Tensor, ...]]]:
    """Yield (feature indices, float32 CPU outputs) batch by batch, in feature order."""
    model.to(device).eval()
    for indices in iterate_batches(len(features), batch_size, None):
        batch = {k: v.to(device) for k, v in collate([features[i] for i in indices]).items()}
        with autocast():
            outputs = forward(model, batch)
        if isinstance(outputs, tuple):
            yield indices, tuple(o.float().cpu() for o in outputs)
        else:
            yield indices, outputs.float().cpu()

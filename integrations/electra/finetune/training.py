"""The fine-tuning loop shared by GLUE and SQuAD: layer-wise LR decay AdamW, warmup, clipping."""

from __future__ import annotations

import contextlib
import math
import random
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from .errors import FinetuneError
from .hparams import FinetuneConfig

_LAYER_INDEX = re.compile(r"(?:^|\.)layers?\.(\d+)\.")
_NO_DECAY = ("bias", "layernorm", "layer_norm", "ln_")


def resolve_device(name: str | None) -> torch.device:
    """``None`` picks CUDA when present, else CPU."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise FinetuneError(f"bad --device {name!r}: {error}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise FinetuneError(f"--device {name} requested but CUDA is not available")
    return device


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


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


def linear_warmup_decay(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int):
    """Linear warmup to each group's LR, then linear decay to 0 at ``total_steps``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps)
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def autocast_context(device: torch.device, use_amp: bool):
    if use_amp and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


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
        raise FinetuneError(f"{description}: no training examples")
    num_layers = int(getattr(encoder.config, "num_hidden_layers", 0))
    model.to(device).train()  # before the optimizer takes references to the parameters
    optimizer = torch.optim.AdamW(
        layerwise_parameter_groups(encoder, head, num_layers, config),
        betas=(0.9, 0.999),
        eps=config.adam_epsilon,
    )
    steps_per_epoch = math.ceil(len(features) / config.batch_size)
    total_steps = max(1, math.ceil(steps_per_epoch * config.epochs))
    scheduler = linear_warmup_decay(optimizer, int(config.warmup_fraction * total_steps), total_steps)
    generator = torch.Generator().manual_seed(seed)
    sampler = prioritized_sampler(len(features), config, seed, total_steps) if config.sampling == "prioritized" else None
    stats = TrainStats()
    started = time.perf_counter()
    # disable=None: bars only on a terminal (per-run summary lines are logged either way)
    bar = tqdm(total=total_steps, desc=description, disable=None if progress else True, leave=False, dynamic_ncols=True)
    while stats.steps < total_steps:
        epoch_losses: list[float] = []
        for drawn in iterate_batches(len(features), config.batch_size, generator) if sampler is None else sampler:
            if stats.steps >= total_steps:  # fractional epochs
                break
            indices = drawn if sampler is None else drawn.indices.tolist()
            batch = {k: v.to(device) for k, v in collate([features[i] for i in indices]).items()}
            with autocast_context(device, config.use_amp):
                per_example = compute_loss(model, batch)
            if sampler is None:
                loss = per_example.mean()
            else:
                sampler.update(drawn, loss=per_example.detach())
                loss = (per_example * torch.as_tensor(drawn.weights, dtype=per_example.dtype, device=device)).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
            scheduler.step()
            stats.steps += 1
            epoch_losses.append(float(loss.detach()))
            bar.update(1)
            bar.set_postfix(loss=f"{epoch_losses[-1]:.4f}")
        stats.epoch_mean_losses.append(float(np.mean(epoch_losses)))
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
    use_amp: bool = False,
) -> Iterator[tuple[list[int], torch.Tensor | tuple[torch.Tensor, ...]]]:
    """Yield (feature indices, float32 CPU outputs) batch by batch, in feature order."""
    model.to(device).eval()
    for indices in iterate_batches(len(features), batch_size, None):
        batch = {k: v.to(device) for k, v in collate([features[i] for i in indices]).items()}
        with autocast_context(device, use_amp):
            outputs = forward(model, batch)
        if isinstance(outputs, tuple):
            yield indices, tuple(o.float().cpu() for o in outputs)
        else:
            yield indices, outputs.float().cpu()

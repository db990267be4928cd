"""The replaced-token-detection loss of the discriminator, per example and for the batch."""
from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .corruption import explicit_positions


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


def make_optimizer(model: torch.nn.Module, learning_rate: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW(β=(0.9, 0.999), ε=1e-6); weight decay on everything but LayerNorm and bias parameters."""
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():  # shared tensors are listed once
        (no_decay if "LayerNorm" in name or name.endswith("bias") else decay).append(parameter)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=learning_rate, betas=(0.9, 0.999), eps=1e-6)

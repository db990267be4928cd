"""What the discriminator tells the buffer after each step, chosen once per variant.

Each variant feeds back exactly one kind of per-example signal (see `config.FEEDBACK`): its loss, its exact
gradient norm, or its logits/labels/mask, from which the library's `GradBound` computes the
Katharopoulos–Fleuret bound. `make_feedback` picks the object at setup; the training step then calls the same
two methods whatever the variant, so the loop never looks at the strategy.
"""
from __future__ import annotations

import contextlib
from collections.abc import Mapping

import torch

from ..grad_norms import GhostNorms, loop_grad_norms
from .losses import DiscriminatorLosses, discriminator_losses


class LossFeedback:
    """``loss=``: each example's discriminator loss (loss_diff, loss, lsr, linucb, and electra's no-op buffer)."""

    def recording(self) -> contextlib.AbstractContextManager:
        """Context for the discriminator's forward pass (only ghost norms need one)."""
        return contextlib.nullcontext()

    def signals(self, data: Mapping[str, torch.Tensor], d: DiscriminatorLosses, loss_scale: float) -> dict:
        """The keyword arguments of ``loader.feedback``; call after the backward pass."""
        return {"loss": d.per_example.detach()}

    def close(self) -> None:
        pass


class LogitsFeedback(LossFeedback):
    """``logits=, targets=, mask=``: the library computes the gradient-norm bound from the discriminator's output."""

    def signals(self, data, d, loss_scale):
        return {"logits": d.logits.detach(), "targets": d.labels, "mask": d.mask}


class GhostNormFeedback(LossFeedback):
    """``grad_norm=``: exact per-example norms of ∇L_D from hooks inside the ordinary training backward."""

    def __init__(self, discriminator: torch.nn.Module, discriminator_weight: float) -> None:
        self.ghost = GhostNorms(discriminator)
        self.discriminator_weight = discriminator_weight

    def recording(self):
        return self.ghost.record()

    def signals(self, data, d, loss_scale):
        # The backward ran on loss_scale · (L_G + λ Σ_i c_i ℓ_i), so example i's gradient rows carry that factor.
        scale = self.discriminator_weight * d.coefficients.detach().double() * loss_scale
        return {"grad_norm": self.ghost.norms(scale).float()}

    def close(self):
        self.ghost.remove()


class LoopNormFeedback(LossFeedback):
    """``grad_norm=``: the same norms from one extra backward per example (slow; a reference)."""

    def __init__(self, discriminator: torch.nn.Module) -> None:
        self.discriminator = discriminator

    def signals(self, data, d, loss_scale):
        norms = loop_grad_norms(self.discriminator, lambda m, b: discriminator_losses(m, b).per_example, data)
        return {"grad_norm": norms.float()}


def make_feedback(kind: str, discriminator: torch.nn.Module, discriminator_weight: float,
                  grad_norm_method: str = "ghost") -> LossFeedback:
    """The feedback of one kind: "loss", "logits" or "grad_norm" (by ``grad_norm_method``: "ghost" or "loop")."""
    if kind == "loss":
        return LossFeedback()
    if kind == "logits":
        return LogitsFeedback()
    if kind == "grad_norm":
        if grad_norm_method == "ghost":
            return GhostNormFeedback(discriminator, discriminator_weight)
        return LoopNormFeedback(discriminator)
    raise ValueError(f"unknown feedback kind {kind!r}")

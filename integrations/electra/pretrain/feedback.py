"""What the discriminator tells the buffer after each step, chosen once per variant.

Each variant feeds back exactly one kind of per-example signal (see `config.FEEDBACK`): its loss, its exact
gradient norm, or its logits/labels/mask, from which the library's `GradBound` computes the
Katharopoulos–Fleuret bound. `make_feedback` picks the object at setup. The object also says what it needs
(``needs_eager``: no ``torch.compile``) and which extra numbers it logs (`report`), so the loop and the metrics
call the same methods whatever the variant and never look at the strategy.
"""
from __future__ import annotations

import contextlib
from collections.abc import Mapping

import torch

from replayloader.strategies import grad_bound_sigmoid

from ..stats import spearman
from ..grad_norms import GhostNorms, loop_grad_norms
from .config import FEEDBACK, PretrainConfig
from .losses import DiscriminatorLosses, discriminator_losses


class LossFeedback:
    """``loss=``: each example's discriminator loss (loss_diff, loss, lsr, linucb, and electra's no-op buffer)."""

    needs_eager = False  # True: hooks inside the backward that a compiled model would bypass

    def recording(self) -> contextlib.AbstractContextManager:
        """Context for the discriminator's forward pass (only ghost norms need one)."""
        return contextlib.nullcontext()

    def signals(self, data: Mapping[str, torch.Tensor], d: DiscriminatorLosses, loss_scale: float) -> dict:
        """The keyword arguments of ``loader.feedback``; call after the backward pass."""
        return {"loss": d.per_example.detach()}

    def report(self, signals: Mapping[str, torch.Tensor], d: DiscriminatorLosses) -> dict:
        """Numbers this feedback adds to the step's metrics record (none for the loss)."""
        return {}

    def close(self) -> None:
        pass


class LogitsFeedback(LossFeedback):
    """``logits=, targets=, mask=``: the library computes the gradient-norm bound from the discriminator's output."""

    def signals(self, data, d, loss_scale):
        return {"logits": d.logits.detach(), "targets": d.labels, "mask": d.mask}


class GradNormFeedback(LossFeedback):
    """``grad_norm=``: exact per-example gradient norms; logs their mean and how the K&F bound ranks like them."""

    def report(self, signals, d):
        norms = signals["grad_norm"].double().cpu().numpy()
        bound = grad_bound_sigmoid(d.logits.detach(), d.labels, d.mask)
        return {"example_grad_norm_mean": float(norms.mean()), "bound_vs_norm_spearman": spearman(bound, norms)}


class GhostNormFeedback(GradNormFeedback):
    """Norms of ∇L_D from hooks inside the ordinary training backward."""

    needs_eager = True

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


class LoopNormFeedback(GradNormFeedback):
    """The same norms from one extra backward per example (slow; a reference)."""

    def __init__(self, discriminator: torch.nn.Module) -> None:
        self.discriminator = discriminator

    def signals(self, data, d, loss_scale):
        norms = loop_grad_norms(self.discriminator, lambda m, b: discriminator_losses(m, b).per_example, data)
        return {"grad_norm": norms.float()}


def make_feedback(config: PretrainConfig, discriminator: torch.nn.Module) -> LossFeedback:
    """The feedback of the run's variant (`config.FEEDBACK`): "loss", "logits" or "grad_norm" (computed by
    ``config.grad_norm_method``: "ghost" or "loop")."""
    kind = FEEDBACK.get(config.variant, "loss")
    if kind == "loss":
        return LossFeedback()
    if kind == "logits":
        return LogitsFeedback()
    if kind == "grad_norm":
        if config.grad_norm_method == "ghost":
            return GhostNormFeedback(discriminator, config.discriminator_weight)
        return LoopNormFeedback(discriminator)
    raise ValueError(f"unknown feedback kind {kind!r}")

"""Per-example gradient norms of the discriminator loss, exact and bounded.

* `GhostNorms`: exact per-example norms ‖∇_θ ℓ_i‖ computed *inside* the ordinary training backward from what
  every Linear / Embedding / LayerNorm sees (its input and the gradient of its output), without materialising
  per-example gradients of the whole model ("ghost norms"). Each example's rows of an output gradient are
  c_i ∂ℓ_i/∂out when the backpropagated loss is Σ_i c_i ℓ_i, so the caller divides by c_i.
* `loop_grad_norms`: the same numbers from one backward pass per example; slow (B passes), obviously right,
  used as the reference in tests and available as ``--grad-norm-method loop``.

The Katharopoulos & Fleuret bound (the norm of ∂ℓ_i/∂logits) is the library's: `replayloader.strategies.GradBound`
computes it from the logits, targets and mask that the loop feeds back.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

_HOOKED = (nn.Linear, nn.Embedding, nn.LayerNorm)
_CHUNK_ELEMENTS = 1 << 24  # per-chunk size of the (examples x a x b) intermediates


class GhostNorms:
    """Hooks on a model that accumulate per-example squared gradient norms during a recorded backward.

    Usage::

        ghost = GhostNorms(discriminator)
        with ghost.record():
            logits = discriminator(...)            # hooks capture inputs only inside record()
        (loss_g + 50 * loss_d).backward()          # output-gradient hooks add each module's share
        norms = ghost.norms(coefficients)          # ‖∇ℓ_i‖ for loss_d's backpropagated Σ_i c_i ℓ_i

    Modules used outside ``record()`` (the generator's pass through a shared embedding) are not counted.
    Needs inputs whose every tensor has the batch as leading dim (pass explicit (B, T) position_ids).
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.active = False
        self._squared: torch.Tensor | None = None
        self._batch_size: int | None = None
        self._handles = []
        covered = set()
        for module in model.modules():
            if isinstance(module, _HOOKED):
                self._handles.append(module.register_forward_hook(self._forward_hook))
                covered.update(id(p) for p in module.parameters(recurse=False))
        uncovered = [name for name, p in model.named_parameters() if p.requires_grad and id(p) not in covered]
        if uncovered:
            self.remove()
            raise ValueError(f"ghost norms support Linear, Embedding and LayerNorm parameters only; "
                             f"not covered: {uncovered[:5]}")

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @contextmanager
    def record(self) -> Iterator[GhostNorms]:
        """Capture activations of the forward pass run inside this block; norms accumulate at backward."""
        self._squared, self._batch_size = None, None
        self.active = True
        try:
            yield self
        finally:
            self.active = False

    def squared_norms(self) -> torch.Tensor:
        """Per-example squared norm of the gradient of whatever was backpropagated through the recorded pass."""
        if self._squared is None:
            raise RuntimeError("no gradients were recorded: run the forward inside record() and then backward()")
        return self._squared

    def norms(self, coefficients: torch.Tensor | float = 1.0) -> torch.Tensor:
        """‖∇_θ ℓ_i‖ when the backpropagated loss was Σ_i coefficients_i · ℓ_i."""
        return self.squared_norms().sqrt() / coefficients

    # ------------------------------------------------------------------ hooks
    def _forward_hook(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        if not self.active or not torch.is_grad_enabled() or not output.requires_grad:
            return
        x = inputs[0].detach()
        if self._batch_size is None:
            self._batch_size = x.shape[0]
        elif x.shape[0] != self._batch_size:
            raise RuntimeError(f"{type(module).__name__} got a leading dim of {x.shape[0]}, not the batch size "
                               f"{self._batch_size}; pass explicit (B, T) position_ids/token_type_ids")
        output.register_hook(functools.partial(self._on_output_grad, module, x))

    def _on_output_grad(self, module: nn.Module, x: torch.Tensor, grad: torch.Tensor) -> None:
        g = grad.detach()
        if isinstance(module, nn.Linear):
            part = _linear_squared(module, x, g)
        elif isinstance(module, nn.Embedding):
            part = _embedding_squared(module, x, g)
        else:
            part = _layer_norm_squared(module, x, g)
        part = part.to(torch.float64)
        self._squared = part if self._squared is None else self._squared + part


def _chunks(batch: int, per_example: int) -> Iterator[slice]:
    step = max(1, _CHUNK_ELEMENTS // max(per_example, 1))
    for start in range(0, batch, step):
        yield slice(start, start + step)


def _linear_squared(module: nn.Linear, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """‖Σ_t g_t a_tᵀ‖² (weight) + ‖Σ_t g_t‖² (bias) per example; direct product or Gram form, whichever is cheaper."""
    b = x.shape[0]
    a = x.reshape(b, -1, x.shape[-1]).float()
    g = g.reshape(b, -1, g.shape[-1]).float()
    t, d_in, d_out = a.shape[1], a.shape[2], g.shape[2]
    out = torch.empty(b, device=g.device, dtype=torch.float32)
    if module.weight.requires_grad:
        if t * t * (d_in + d_out) < t * d_in * d_out:  # Gram form: Σ_{t,s} (a_t·a_s)(g_t·g_s)
            for s in _chunks(b, t * t):
                out[s] = ((a[s] @ a[s].transpose(1, 2)) * (g[s] @ g[s].transpose(1, 2))).sum((1, 2))
        else:
            for s in _chunks(b, d_in * d_out):
                out[s] = (g[s].transpose(1, 2) @ a[s]).pow(2).sum((1, 2))
    else:
        out.zero_()
    if module.bias is not None and module.bias.requires_grad:
        out += g.sum(1).pow(2).sum(1)
    return out


def _embedding_squared(module: nn.Embedding, ids: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Σ over position pairs with equal ids of g_t·g_s (rows of one id add up); padding_idx rows get no gradient."""
    b = ids.shape[0]
    ids = ids.reshape(b, -1)
    g = g.reshape(b, ids.shape[1], -1).float()
    valid = torch.ones_like(ids, dtype=torch.bool) if module.padding_idx is None else ids != module.padding_idx
    out = torch.empty(b, device=g.device, dtype=torch.float32)
    t = ids.shape[1]
    for s in _chunks(b, t * t):
        same = (ids[s, :, None] == ids[s, None, :]) & valid[s, :, None] & valid[s, None, :]
        out[s] = ((g[s] @ g[s].transpose(1, 2)) * same).sum((1, 2))
    return out


def _layer_norm_squared(module: nn.LayerNorm, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """‖Σ_t g_t ⊙ x̂_t‖² (weight) + ‖Σ_t g_t‖² (bias) per example."""
    b = x.shape[0]
    out = torch.zeros(b, device=g.device, dtype=torch.float32)
    if not module.elementwise_affine:
        return out
    dims = tuple(range(x.dim() - len(module.normalized_shape), x.dim()))
    xf = x.float()
    mean = xf.mean(dims, keepdim=True)
    var = xf.var(dims, unbiased=False, keepdim=True)
    x_hat = (xf - mean) / torch.sqrt(var + module.eps)
    g = g.float()
    sum_dims = tuple(range(1, x.dim() - len(module.normalized_shape)))
    if module.weight is not None and module.weight.requires_grad:
        out += (g * x_hat).sum(sum_dims).reshape(b, -1).pow(2).sum(1)
    if module.bias is not None and module.bias.requires_grad:
        out += g.sum(sum_dims).reshape(b, -1).pow(2).sum(1)
    return out


def loop_grad_norms(model: nn.Module, example_losses: Callable[[nn.Module, Mapping[str, torch.Tensor]], torch.Tensor],
                    batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Exact ‖∇_θ ℓ_i‖ by one forward+backward per example (``example_losses`` returns ℓ of shape (1,)).

    Gradients are taken with `torch.autograd.grad`, so the model's .grad fields are left untouched.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    size = next(iter(batch.values())).shape[0]
    norms = torch.empty(size, dtype=torch.float64)
    for i in range(size):
        single = {k: v[i:i + 1] for k, v in batch.items()}
        loss = example_losses(model, single).sum()
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        norms[i] = torch.sqrt(sum((g.double() ** 2).sum() for g in grads if g is not None))
    return norms

"""Nested batches and models as the scorers see them: where a model lives, the plain module under a wrapper, how
many rows a batch holds, a batch moved to a device, and a score function's output checked as one loss per row."""
from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter (or buffer); a model without either runs where tensors are made
    by default."""
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        return tensor.device
    return torch.empty(0).device


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The module under a DistributedDataParallel / DataParallel wrapper or a ``torch.compile`` result, whose
    state dict has the plain keys (a wrapper prefixes them with ``module.`` or ``_orig_mod.``)."""
    while True:
        if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):  # torch.compile's OptimizedModule
            model = model._orig_mod
        else:
            return model


def first_tensor(batch: Any) -> torch.Tensor | np.ndarray | None:
    """The first tensor (or numpy array) of a nested batch, or None."""
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        return batch
    values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (tuple, list)) else ()
    for value in values:
        found = first_tensor(value)
        if found is not None:
            return found
    return None


def batch_rows(batch: Any, name: str) -> int | None:
    """How many rows (examples) a nested batch holds: the length of its first tensor or array (None when it holds
    none, e.g. raw strings that the score function tokenizes)."""
    found = first_tensor(batch)
    if found is None:
        return None
    if found.ndim == 0 or len(found) == 0:
        raise ValueError(f"{name} must hold at least one row (its first tensor has shape {tuple(found.shape)})")
    return len(found)


def to_device(batch: Any, device: torch.device) -> Any:
    """A nested batch with every tensor on ``device`` (nothing moves if it is there already)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def per_example(out: Any, rows: int | None, where: str) -> torch.Tensor:
    """``out`` as a 1-D float tensor of one loss per row, or a ValueError saying what came back."""
    if isinstance(out, np.ndarray):
        out = torch.from_numpy(out)
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"{where} must return a tensor of per-example losses, got {type(out).__name__}")
    want = "(n,)" if rows is None else f"({rows},)"
    if out.ndim != 1 or (rows is not None and len(out) != rows) or not out.is_floating_point():
        raise ValueError(f"{where} must return one floating-point loss per candidate, shape {want}, got dtype "
                         f"{out.dtype} shape {tuple(out.shape)}")
    return out

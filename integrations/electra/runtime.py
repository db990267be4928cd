"""Where and how a run computes, chosen the same way by pretraining and fine-tuning: one meaning of
``--device auto``, one seeding of every generator, one autocast rule for ``--amp``. Both use
`transformers.get_linear_schedule_with_warmup` for the learning rate."""
from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass

import numpy as np
import torch

from .errors import UserError


def pick_device(name: str | None = "auto") -> torch.device:
    """"auto" (or None) picks CUDA, then MPS, then CPU; an unavailable explicit device is a `UserError`."""
    if name in (None, "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown --device {name!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name!r} requested but CUDA is not available")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError("--device 'mps' requested but MPS is not available")
    return device


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host batch tensor on ``device``. To a GPU through pinned memory without blocking: a copy from pageable
    memory makes the host wait for the device's queued work (pretraining's batch stream and fine-tuning's batches
    both copy so)."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def set_seed(seed: int) -> None:
    """Seed Python, NumPy's global generator and torch (every device) in one place."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Autocast:
    """Autocast for one run, as a callable giving a fresh context each time (pretraining and fine-tuning).

    ``amp`` ("none", "bf16" or "fp16") applies on CUDA only; CPU runs float32. A disabled
    ``torch.autocast(enabled=False)`` is a no-op, so callers take no branch.
    """

    device_type: str
    dtype: torch.dtype | None  # None: off; fp16 also needs loss scaling (see `pretrain.loop`)

    @classmethod
    def choose(cls, device: torch.device, amp: str) -> Autocast:
        return cls(device.type, AMP_DTYPES[amp] if device.type == "cuda" else None)

    def __call__(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.device_type, dtype=self.dtype or torch.bfloat16, enabled=self.dtype is not None)

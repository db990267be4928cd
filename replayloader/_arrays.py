"""Arrays at the bottom of the package: tell torch tensors apart and bring feedback to the host, without importing
torch (the core must run on numpy + numba alone). Everything above uses these two, so they sit below every folder."""
from __future__ import annotations

from typing import Any

import numpy as np


def is_torch_tensor(x: Any) -> bool:
    """True for torch tensors, without importing torch (the core does not require it)."""
    return type(x).__module__.startswith("torch") and hasattr(x, "device") and hasattr(x, "dtype")


def to_numpy(x: Any, name: str) -> np.ndarray:
    """Per-example feedback as a host numpy array (torch tensors on any device are detached and copied)."""
    if is_torch_tensor(x):
        x = x.detach()
        if str(x.dtype) in ("torch.bfloat16", "torch.float16"):
            x = x.float()
        return x.cpu().numpy()
    try:
        return np.asarray(x)
    except Exception as exc:  # pragma: no cover - exotic inputs
        raise TypeError(f"{name} must be array-like, got {type(x).__name__}") from exc

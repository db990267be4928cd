"""CUDA tensors between two streams: the worker waits for what the trainer's stream wrote (`cuda_event`), and
the trainer's stream takes over what the worker made (`adopted`). Off CUDA both do nothing."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def adopted(value: Any) -> Any:
    """Hand the worker's CUDA tensors (a tensor or a dict of them) to the caller's stream: the caching allocator
    must not give their memory back to the worker's stream while the caller's kernels may still read it."""
    tensors = value.values() if isinstance(value, Mapping) else [value]
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and tensor.is_cuda:
            tensor.record_stream(torch.cuda.current_stream(tensor.device))
    return value


def cuda_event(device: torch.device) -> torch.cuda.Event | None:
    """An event recorded now on ``device``'s current stream (None off CUDA): the worker waits on it before it
    reads what the trainer's stream wrote."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event

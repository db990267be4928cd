"""Count the calls that copy a tensor's values to the host, which on a GPU make the host wait for the device.

A CUDA step that calls ``.item()``, ``.cpu()``, ``.numpy()``, ``.tolist()``, ``float(t)`` or ``.to("cpu")`` (without
``non_blocking``) stops the host until every kernel queued before it has run: the GPU then idles while Python
catches up. `count_host_transfers` counts such calls (``.to("cpu")`` only when it moves a device tensor), by name, on the tensors of one device type (``"cuda"`` on a
GPU; ``None``, every tensor, on a CPU machine, where it counts what a GPU run of the same code would wait for), so
a test can pin the number per training step. Tensors that are host staging by design (the pinned copies of
`deferred.DeferredFeedback`) are marked with `mark_host_staging` and not counted.
"""
from __future__ import annotations

import contextlib
import weakref
from collections import Counter
from collections.abc import Iterator
from typing import Any

_STAGING: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # id -> tensor (a WeakSet would compare
# tensors with ==, which is elementwise)


def mark_host_staging(tensor: Any) -> Any:
    """Mark a host tensor that exists to receive a device copy (its reads are not transfers); returns it."""
    _STAGING[id(tensor)] = tensor
    return tensor


def _is_staging(tensor: Any) -> bool:
    return _STAGING.get(id(tensor)) is tensor
_METHODS = ("item", "tolist", "numpy", "cpu", "__float__", "__int__", "__bool__", "__index__")


def _to_host(args: tuple, kwargs: dict) -> bool:
    """Whether a ``Tensor.to`` call moves to the CPU and waits (no ``non_blocking=True``)."""
    flags = [a for a in args if isinstance(a, bool)]  # positional non_blocking, then copy, in every signature
    if kwargs.get("non_blocking") or (flags and flags[0]):
        return False
    target = kwargs.get("device", args[0] if args else None)
    return str(target).startswith("cpu")


@contextlib.contextmanager
def count_host_transfers(device_type: str | None = None) -> Iterator[Counter]:
    """Within the block, count host transfers (method name -> calls) of tensors on ``device_type`` (None: all).

    The counting patches `torch.Tensor` methods for the duration of the block, in every thread; not re-entrant.
    """
    import torch

    counts: Counter = Counter()
    originals = {name: getattr(torch.Tensor, name) for name in (*_METHODS, "to")}

    def watched(tensor: Any) -> bool:
        return (device_type is None or tensor.device.type == device_type) and not _is_staging(tensor)

    def counting(name: str, original: Any) -> Any:
        def method(self, *args, **kwargs):
            if watched(self):
                counts[name] += 1
            return original(self, *args, **kwargs)
        return method

    def to(self, *args, **kwargs):  # a move, not a no-op .to("cpu") of a host tensor (e.g. into host storage)
        if watched(self) and self.device.type != "cpu" and _to_host(args, kwargs):
            counts["to(cpu)"] += 1
        return originals["to"](self, *args, **kwargs)

    own = {name for name in originals if name in vars(torch.Tensor)}  # the rest are inherited from TensorBase
    try:
        for name in _METHODS:
            setattr(torch.Tensor, name, counting(name, originals[name]))
        torch.Tensor.to = to
        yield counts
    finally:
        for name, original in originals.items():
            if name in own:
                setattr(torch.Tensor, name, original)
            else:
                delattr(torch.Tensor, name)

"""Deferred feedback: per-example signals handed to the buffer later, so a training step never waits on the GPU.

The sum tree lives on the host. Feedback computed on a GPU (a loss per example) must be copied back before the
tree can use it, and a plain ``.cpu()`` waits for every kernel queued so far: the GPU then idles while the host
updates the tree and launches the next step. `DeferredFeedback.push` starts the copy without waiting
(``non_blocking`` into pinned host memory, with a CUDA event recorded behind it) and `flush` waits for that event
and applies the update. A loader built with ``defer_feedback=True`` flushes right after the next producer call
and before its examples are added, so the GPU is already busy with the next step's producer while the host waits
and updates. The buffer then sees the same calls in the same order as without deferral (update of step t, then
add and sample of step t+1): the results are identical, only the waiting moves.

What changes for the caller: an invalid feedback value (NaN, a negative loss) is reported by `flush`, one step
later, since checking it earlier would need the very copy being avoided. Shapes and ids are checked at `push`.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .host_sync import mark_host_staging
from .. import _checks as checks
from .._arrays import is_torch_tensor


def _host_dtype(dtype: Any) -> Any:
    """numpy has no bfloat16: half-precision feedback is staged as float32 (what `to_numpy` would give)."""
    import torch

    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


class _PinnedPool:
    """Reusable pinned host tensors, two per (shape, dtype), so pushes do not allocate pinned memory each step."""

    def __init__(self) -> None:
        self._free: dict[tuple, list] = {}

    def take(self, like: Any) -> Any:
        import torch

        dtype = _host_dtype(like.dtype)
        free = self._free.setdefault((tuple(like.shape), dtype), [])
        if free:
            return free.pop()
        return mark_host_staging(torch.empty(like.shape, dtype=dtype, pin_memory=True))

    def give(self, tensor: Any) -> None:
        free = self._free.setdefault((tuple(tensor.shape), tensor.dtype), [])
        if len(free) < 2:
            free.append(tensor)


class DeferredFeedback:
    """Queue ``update(ids, **signals)`` calls and run them at `flush`, copying device tensors without waiting.

    Args:
        update: what applies the feedback, e.g. ``buffer.feedback`` or a `LockedBuffer`'s ``feedback``.
    """

    def __init__(self, update: Callable[..., int]) -> None:
        if not callable(update):
            raise TypeError(f"update must be callable, got {type(update).__name__}")
        self._update = update
        self._pending: list[tuple[np.ndarray, dict[str, Any], Any, list]] = []
        self._pool = _PinnedPool()

    def __len__(self) -> int:
        """Feedback calls waiting for `flush`."""
        return len(self._pending)

    def push(self, ids: Any, **signals: Any) -> None:
        """Start moving ``signals`` to the host and remember the call; nothing reaches the buffer yet."""
        ids = checks.index_array("ids", ids).copy()  # a copy: the caller may reuse its array before the flush
        if not signals:
            raise TypeError("push needs at least one feedback keyword (loss=, grad_norm=, ...)")
        staged, pinned, event = {}, [], None
        for name, value in signals.items():
            if is_torch_tensor(value):
                value = value.detach()
                if value.device.type == "cuda":
                    host = self._pool.take(value)
                    host.copy_(value, non_blocking=True)
                    pinned.append(host)
                    value = host
                    event = _record_event(value)
                else:  # a copy: the caller may reuse its tensor before the flush
                    value = mark_host_staging(value.to(dtype=_host_dtype(value.dtype), copy=True))
            else:
                value = np.array(value, copy=True)
            staged[name] = value
        self._pending.append((ids, staged, event, pinned))

    def discard(self) -> int:
        """Drop every queued call without applying it (a loaded state replaces the buffer they were meant for);
        returns how many were dropped."""
        pending, self._pending = self._pending, []
        for _, _, event, pinned in pending:
            if event is not None:
                event.synchronize()  # the copy into a pinned tensor must end before the pool hands it out again
            for tensor in pinned:
                self._pool.give(tensor)
        return len(pending)

    def flush(self) -> int:
        """Wait for the copies and apply every queued call in order; returns how many weights changed.

        If one call is refused (say a NaN loss), the calls before it stay applied, the rest are dropped, and the
        error says which queued call failed."""
        pending, self._pending = self._pending, []
        changed = 0
        for position, (ids, staged, event, pinned) in enumerate(pending):
            if event is not None:
                event.synchronize()
            # Staged tensors are host tensors already: a copy out of them (the pinned ones are reused).
            arrays = {name: np.array(value.numpy(), copy=True) if is_torch_tensor(value) else value
                      for name, value in staged.items()}
            for tensor in pinned:
                self._pool.give(tensor)
            try:
                changed += self._update(ids, **arrays)
            except Exception as err:
                if hasattr(err, "add_note"):  # Python >= 3.11
                    err.add_note(f"(deferred feedback call {position + 1} of {len(pending)}; the "
                                 f"{len(pending) - position - 1} calls after it were dropped)")
                raise
        return changed


def _record_event(tensor: Any) -> Any:
    import torch

    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream())
    return event

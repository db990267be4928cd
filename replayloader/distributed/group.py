"""ProcessGroup: this process's place in a torch.distributed group and the few collectives the library uses.

Every distributed part (the shared sampler, score-then-select, state files) talks to the group through this one
class, so the backend choice (NCCL on the current CUDA device, gloo on the CPU), the launcher watchdog and the
"fail on every rank, never hang" rule live in one place.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .launcher import started_by_launcher, watch_launcher


class ProcessGroup:
    """This process's place in a torch.distributed group and the few collectives the samplers use.

    ``group=None`` is the default group. Tensors travel on the current CUDA device under NCCL and on the CPU
    otherwise (gloo), so the same code runs on both backends.
    """

    def __init__(self, group: Any = None) -> None:
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("torch.distributed is not initialized: call torch.distributed.init_process_group "
                               "first (torchrun, accelerate launch and Lightning's DDP do it), or use a plain "
                               "PrioritizedSampler in one process")
        self.torch, self.dist, self.group = torch, dist, group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        on_nccl = dist.get_backend(group) == "nccl"
        self.device = torch.device("cuda", torch.cuda.current_device()) if on_nccl else torch.device("cpu")
        self._gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        if started_by_launcher():  # a rank must not outlive the launcher that supervises it (launcher.py)
            watch_launcher()

    def all_gather_rows(self, row: np.ndarray) -> np.ndarray:
        """Every rank's int64 ``row`` (all of one length), as a (size, len) array in rank order."""
        return self.start_all_gather_rows(row)()

    def start_all_gather_rows(self, row: np.ndarray) -> Callable[[], np.ndarray]:
        """`all_gather_rows` started in the background; call the result to wait for it and get the table."""
        local = self.torch.from_numpy(np.ascontiguousarray(row, np.int64)).to(self.device)
        table = self.torch.empty(self.size * len(row), dtype=self.torch.int64, device=self.device)
        work = self._gather_single(table, local, group=self.group, async_op=True)

        def finish() -> np.ndarray:
            work.wait()
            return table.cpu().numpy().reshape(self.size, len(row))

        return finish

    def all_gather_ragged(self, indices: np.ndarray, values: np.ndarray, lengths: np.ndarray
                          ) -> tuple[np.ndarray, np.ndarray]:
        """Every rank's int64 ``indices`` and float64 ``values`` (one of each per entry), concatenated in rank
        order. ``lengths`` holds every rank's entry count, already gathered (ranks send rows of the longest
        length, so one collective carries both arrays)."""
        width = int(np.max(lengths))
        row = np.zeros(2 * width, np.int64)
        row[:len(indices)] = indices
        row[width:width + len(values)] = np.ascontiguousarray(values, np.float64).view(np.int64)
        table = self.all_gather_rows(row)
        merged_indices = np.concatenate([table[r, :lengths[r]] for r in range(self.size)])
        merged_values = np.concatenate([table[r, width:width + lengths[r]] for r in range(self.size)])
        return merged_indices, merged_values.view(np.float64)

    def all_gather_objects(self, value: Any) -> list:
        everyone: list = [None] * self.size
        self.dist.all_gather_object(everyone, value, group=self.group)
        return everyone

    def require_same(self, fields: dict[str, Any], what: str, hint: str) -> None:
        """Raise the same error on every rank unless every field equals rank 0's, naming the first that differs
        (a collective: every rank calls it with the same field names)."""
        everyone = self.all_gather_objects(fields)
        for name in everyone[0]:
            values = [fields_of_rank[name] for fields_of_rank in everyone]
            odd = next((rank for rank, value in enumerate(values) if value != values[0]), None)
            if odd is not None:
                raise ValueError(f"the {what} differs across ranks: {name} is {values[0]!r} on rank 0 but "
                                 f"{values[odd]!r} on rank {odd}; {hint}")

    def agree(self, action: Any, what: str) -> list:
        """Run ``action()`` here and gather every rank's result. If it raised on any rank, raise on every rank
        (this rank's own exception where it failed), so a collective that follows never waits for a dead rank."""
        try:
            result, error = action(), None
        except Exception as exc:  # reported to every rank below, then re-raised here
            result, error = None, exc
        everyone = self.all_gather_objects((error is None, result if error is None else
                                            f"{type(error).__name__}: {error}"))
        if error is not None:
            raise error
        failed = [(rank, message) for rank, (ok, message) in enumerate(everyone) if not ok]
        if failed:
            rank, message = failed[0]
            raise RuntimeError(f"{what} failed on rank {rank}: {message}")
        return [value for _, value in everyone]


def current_group(group: Any = None) -> ProcessGroup | None:
    """The `ProcessGroup` of a running job of more than one process, else None (one process, nothing to share)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return None
    return ProcessGroup(group)



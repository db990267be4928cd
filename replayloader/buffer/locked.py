"""LockedBuffer: a ReplayBuffer shared between threads.

A bare `ReplayBuffer` is not thread-safe: an add, a sample and an update each read and write the tree, the
storage and the per-slot bookkeeping, and two of them at once can corrupt all three. `LockedBuffer` serialises
every call on one re-entrant lock; hold ``locked.lock`` yourself to make several calls one atomic step (for
example a sample and reading ``last_add_slots``). Ids keep their generation stamps, so feedback for an example
that another thread evicted in the meantime is still ignored and counted in ``stats()["stale_feedback"]``.
The Numba kernels release the GIL, so producers computing outside the lock overlap with buffer work.
"""
from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from .protocol import FillableBufferLike
from .replay_buffer import Sample
from .._moved import renamed


class LockedBuffer:
    """Thread-safe facade over a `ReplayBuffer` (same methods, each under ``self.lock``, a new `threading.RLock`
    unless one is given). Any `FillableBufferLike` can be wrapped: the facade needs the methods, not the class."""

    def __init__(self, buffer: FillableBufferLike, lock: Any = None) -> None:
        if not isinstance(buffer, FillableBufferLike):
            raise TypeError(f"buffer must be a ReplayBuffer or another FillableBufferLike (add, sample, feedback, "
                            f"stats, state_dict, load_state_dict, len, capacity), got {type(buffer).__name__}")
        self.buffer = buffer
        self.lock = threading.RLock() if lock is None else lock

    @property
    def capacity(self) -> int:
        return self.buffer.capacity

    def __len__(self) -> int:
        with self.lock:
            return len(self.buffer)

    def add(self, batch: Mapping[str, Any]) -> np.ndarray:
        with self.lock:
            return self.buffer.add(batch)

    def sample(self, k: int) -> Sample:
        with self.lock:
            return self.buffer.sample(k)

    update = renamed("feedback")

    def feedback(self, ids: Any, **feedback: Any) -> int:
        with self.lock:
            return self.buffer.feedback(ids, **feedback)

    def stats(self) -> dict[str, float]:
        with self.lock:
            return self.buffer.stats()

    def state_dict(self) -> dict:
        with self.lock:
            return self.buffer.state_dict()

    def load_state_dict(self, state: Mapping) -> None:
        with self.lock:
            self.buffer.load_state_dict(state)

"""The buffer family as a `Protocol`: what a part that samples a memory and feeds scores back needs of it.

A `ReplayBuffer`, a `LockedBuffer`, and Ray's `RemoteBuffer` and `ShardedBuffer` all qualify by having these
methods, not by being named in a list, so score-then-select and the loaders take any of them (and your own).
`FillableBufferLike` adds what a part that also *fills* a buffer needs (`LockedBuffer`, `ReplayDataLoader`).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class BufferLike(Protocol):
    """Sample k examples by weight, feed per-example values back by id, checkpoint, and say how many it holds."""

    def sample(self, k: int) -> Any: ...

    def feedback(self, ids: Any, **feedback: Any) -> int: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: Mapping) -> None: ...

    def __len__(self) -> int: ...


@runtime_checkable
class FillableBufferLike(BufferLike, Protocol):
    """A `BufferLike` that also takes produced examples: ``add(batch)`` returns their ids (what a batch's ``fresh``
    mask is computed from), ``capacity`` bounds it, ``stats()`` reports it. `ReplayBuffer` and `LockedBuffer`
    qualify."""

    capacity: int

    def add(self, batch: Mapping[str, Any]) -> Any: ...

    def stats(self) -> dict: ...

"""The sampler family as a `Protocol`: what a DataLoader batch sampler needs of the thing that draws indices.

`PrioritizedSampler` (one process) and `DistributedPrioritizedSampler` (every rank of a DDP job) both qualify by
their methods, so `PrioritizedBatchSampler` takes either, or your own, without a list of accepted classes.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class SamplerLike(Protocol):
    """Draws batches of dataset indices (an epoch at a time), takes feedback per batch, checkpoints."""

    num_examples: int
    epoch: int

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Any]: ...

    def next_batch(self) -> Any: ...

    def feedback(self, batch: Any, **feedback: Any) -> int | None: ...

    def settle(self) -> int: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: Mapping) -> None: ...

"""What `RayReplayLoader` needs of its buffer, as a `Protocol`: a `BufferLike` that takes produced batches in two
steps, so a batch moves from the producer's node to the buffer (`stage`) before the rate limiter admits it, and
enters it only once admitted (`commit`). `RemoteBuffer` and `ShardedBuffer` qualify by these methods (and a
buffer of your own that serves them can be used in their place).
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ..buffer.protocol import BufferLike


@runtime_checkable
class StagingBufferLike(BufferLike, Protocol):
    """``stage(token, produced)``: take a produced batch (an ObjectRef) and check it, returning its number of
    examples; ``commit(token)``: add the batch staged under ``token``, returning its ids."""

    def stage(self, token: int, produced: Any) -> int: ...

    def commit(self, token: int) -> Any: ...

"""Replay across machines on Ray (the optional ``ray`` extra: ``pip install "replayloader[ray]"``).

- `RemoteBuffer`: a `ReplayBuffer` served by a Ray actor, called like the buffer from any node.
- `ShardedBuffer`: several buffer actors sampled as one prioritized buffer (draws in proportion to each shard's
  priority mass).
- `RayReplayLoader`: `ReplayDataLoader`'s iteration contract with Ray actors as producers, paced by a
  `RateLimiter` (both sides block), with producer restarts and checkpoints of every shard; its buffer is any
  `StagingBufferLike` (the two above qualify).

``import replayloader`` never imports Ray; importing this package does.
"""
try:
    import ray  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError('replayloader.ray needs Ray: pip install "replayloader[ray]"') from exc

from .loader import ActorPool, ProducerDied, RayReplayLoader
from .protocol import StagingBufferLike
from .remote import BufferActorDied, RemoteBuffer, call
from .server import BufferServer, Mass
from .sharded_buffer import ShardedBuffer

__all__ = ["RemoteBuffer", "ShardedBuffer", "RayReplayLoader", "ProducerDied", "BufferActorDied", "BufferServer", "Mass",
           "ActorPool", "call", "StagingBufferLike"]

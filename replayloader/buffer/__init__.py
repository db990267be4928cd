"""The replay memory: a fixed-size store of produced examples, sampled by learned importance.

- `ReplayBuffer`: add / sample / update over a Numba sum tree; the strategy object decides the weights.
- `Sample`: what a draw returns (data, ids, probabilities, importance weights, ages).
- `Storage`: the preallocated field arrays (numpy or torch, on their own device).
- `LockedBuffer`: the same buffer shared between threads.
- `BufferLike`: the family as a Protocol (what score-then-select needs of any buffer, local or remote);
  `FillableBufferLike`: one that also takes produced examples (what `LockedBuffer` and the loader wrap).
"""
from .locked import LockedBuffer
from .protocol import BufferLike, FillableBufferLike
from .replay_buffer import ReplayBuffer, Sample
from .storage import Storage

__all__ = ["ReplayBuffer", "Sample", "Storage", "LockedBuffer", "BufferLike", "FillableBufferLike"]

"""The loop side of a buffer: producers in the background, paced, and mini-batches out.

- `ReplayDataLoader`: wraps a producer and a buffer; ``for batch in loader`` plus one feedback call a batch.
- `RateLimiter` (and its errors): keeps producing and sampling within a ratio (Reverb's semantics).
- `WorkerError`: a producer failed in a worker; its traceback travels with it.
- ``loader.workers``: the background producers (threads or processes); ``loader.pacing``: the one paced
  background pass (`RayReplayLoader` runs it too); ``loader.deferred``: feedback kept on the device until the
  step after (no host sync in the step).
"""
from .rate_limiter import LimiterClosed, LimiterConfigError, RateLimiter, RateLimitTimeout
from .replay_loader import ReplayBatch, ReplayDataLoader
from .workers import WorkerError

__all__ = ["ReplayDataLoader", "ReplayBatch", "RateLimiter", "RateLimitTimeout", "LimiterClosed",
           "LimiterConfigError", "WorkerError"]

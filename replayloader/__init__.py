"""replayloader: prioritized-replay data loading with a Numba sum tree and pluggable weighting strategies."""
from .buffer import ReplayBuffer, Sample
from .checkpoint import flatten_state, load_state, save_state, unflatten_state
from .loader import ReplayBatch, ReplayDataLoader
from .locked import LockedBuffer
from .rate_limiter import LimiterClosed, LimiterConfigError, RateLimiter, RateLimitTimeout
from .sampler import LinearSchedule, PrioritizedSampler, SampledBatch
from .storage import Storage
from .sumtree import SumTree
from .workers import WorkerError
from . import strategies

__version__ = "0.1.0"

__all__ = ["ReplayBuffer", "ReplayDataLoader", "ReplayBatch", "Sample", "Storage", "SumTree", "strategies",
           "LockedBuffer", "RateLimiter", "RateLimitTimeout", "LimiterClosed", "LimiterConfigError",
           "WorkerError",
           "flatten_state", "unflatten_state", "save_state", "load_state", "__version__", "PrioritizedSampler",
           "SampledBatch", "LinearSchedule", "PrioritizedBatchSampler"]


def __getattr__(name: str):
    """`PrioritizedBatchSampler` needs torch: imported on first use, so `import replayloader` never loads torch."""
    if name == "PrioritizedBatchSampler":
        from .torch_sampler import PrioritizedBatchSampler
        return PrioritizedBatchSampler
    raise AttributeError(f"module 'replayloader' has no attribute {name!r}")

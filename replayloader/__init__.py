"""replayloader: prioritized replay and data selection, with a Numba sum tree and pluggable strategies.

What you have, and what to use (each folder's ``__init__`` is its public face):

- data a model or environment *produces* → `ReplayBuffer` + `ReplayDataLoader` (``replayloader.buffer``,
  ``replayloader.loader``; weighting rules in ``replayloader.strategies``);
- a *fixed dataset* → `PrioritizedSampler` inside your DataLoader, HF Trainer or Lightning
  (``replayloader.sampler``, ``replayloader.torch``), shared across DDP ranks (``replayloader.distributed``);
- *score many, train on few* → `Selector` with `ScoreThenSelect` (``replayloader.selection``);
- *several sources* (domains) to mix → `MixtureSampler` with a rule learned from training loss
  (``replayloader.mixing``);
- several machines → ``replayloader.ray``.

``import replayloader`` needs only numpy and numba: names that need torch are imported on first use.
"""
from . import _moved, strategies
from .buffer import ReplayBuffer
from .loader import LimiterClosed, RateLimitTimeout, ReplayDataLoader, WorkerError
from .sampler import LinearSchedule, PrioritizedSampler
from .selection import ScoreThenSelect, Selector
from .mixing import MixtureSampler
from .state import InvalidState, StateFileError, load_state, save_state

__version__ = "1.0.0"

_moved.install()

_NEEDS_TORCH = {"PrioritizedBatchSampler": "replayloader.torch",
                "DistributedPrioritizedSampler": "replayloader.distributed"}

# The front: what a user starts from, and the errors. Everything else is in its subpackage's ``__all__``; a
# name that was here in 1.0 still works for one release, with a DeprecationWarning naming its home.
__all__ = ["ReplayBuffer", "ReplayDataLoader", "strategies", "PrioritizedSampler", "PrioritizedBatchSampler",
           "DistributedPrioritizedSampler", "LinearSchedule", "Selector", "ScoreThenSelect", "MixtureSampler",
           "save_state", "load_state",
           "InvalidState", "StateFileError", "WorkerError", "RateLimitTimeout", "LimiterClosed", "__version__"]


def __getattr__(name: str):
    """Names that need torch, imported on first use (``import replayloader`` never loads torch); and the names
    that left the top level (plumbing in 1.0, everything but the front in 1.1), still served for one release
    with a DeprecationWarning."""
    if name in _NEEDS_TORCH:
        import importlib

        return getattr(importlib.import_module(_NEEDS_TORCH[name]), name)
    found = _moved.moved_name(name)
    if found is None:
        raise AttributeError(f"module 'replayloader' has no attribute {name!r}")
    return found

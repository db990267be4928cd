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
from .buffer import ReplayBuffer, Sample
from .loader import RateLimiter, RateLimitTimeout, LimiterClosed, ReplayBatch, ReplayDataLoader, WorkerError
from .sampler import LinearSchedule, PrioritizedSampler, SampledBatch
from .selection import (BufferScoreThenSelect, Proportional, ReducibleLoss, ReusedPool, ScoreThenSelect,
                        SelectionSwitch, SelectiveBackprop, Selector, TopK, TrainingLoss, fit_irreducible,
                        irreducible_losses)
from .mixing import ODM, ExcessLoss, FixedMixture, MixtureBatch, MixtureSampler
from .state import InvalidState, StateFileError, load_state, save_state

__version__ = "1.0.0"

_moved.install()

_NEEDS_TORCH = {"PrioritizedBatchSampler": "replayloader.torch", "CandidateBatchSampler": "replayloader.torch",
                "DistributedPrioritizedSampler": "replayloader.distributed",
                "DistributedScoreThenSelect": "replayloader.distributed",
                "BackgroundScorer": "replayloader.torch", "ProxyScorer": "replayloader.torch",
                "MixtureBatchSampler": "replayloader.mixing.torch", "MixtureIterableDataset": "replayloader.mixing.torch",
                "concat_sources": "replayloader.mixing.torch"}

__all__ = ["ReplayBuffer", "Sample", "ReplayDataLoader", "ReplayBatch", "strategies", "RateLimiter",
           "RateLimitTimeout", "LimiterClosed", "WorkerError", "PrioritizedSampler", "SampledBatch",
           "LinearSchedule", "Selector", "TopK", "Proportional", "SelectiveBackprop", "TrainingLoss",
           "ReducibleLoss", "ScoreThenSelect", "BufferScoreThenSelect", "irreducible_losses", "fit_irreducible",
           "ReusedPool", "SelectionSwitch", "InvalidState", "StateFileError", "save_state", "load_state",
           "MixtureSampler", "MixtureBatch", "FixedMixture", "ODM", "ExcessLoss", *_NEEDS_TORCH, "__version__"]


def __getattr__(name: str):
    """Names that need torch, imported on first use (``import replayloader`` never loads torch); and the
    plumbing that left the top level in 1.0, still served for one release with a DeprecationWarning."""
    if name in _NEEDS_TORCH:
        import importlib

        return getattr(importlib.import_module(_NEEDS_TORCH[name]), name)
    found = _moved.moved_name(name)
    if found is None:
        raise AttributeError(f"module 'replayloader' has no attribute {name!r}")
    return found

"""Several processes, one job (torch needed): what torch.distributed ranks share, and how they start and end.

- `DistributedPrioritizedSampler`: one prioritized distribution on every rank, feedback gathered each step.
- `DistributedScoreThenSelect`: score-then-select with a global candidate pool, per-rank slices.
- `save_shared_state` / `load_shared_state` / `state_digest`: one checkpoint file for every rank.
- `ReplayShard`: a replay buffer per rank (examples produced on each rank stay there).
- `session`, `shutdown`, `watch_launcher`, `fork_safe_context`: start, end without an abort, never outlive the
  launcher, never fork a threaded rank (``distributed.launcher``).
- `ProcessGroup`: the few collectives every part above uses.
"""
import importlib as _importlib

from .group import ProcessGroup
from .launcher import (LAUNCHER_GONE_EXIT, fork_safe_context, session, shutdown, started_by_launcher,
                       watch_launcher)
from .replay_shard import ReplayShard
from .sampler import DistributedPrioritizedSampler, RankBatch
from .select import DistributedScoreThenSelect
from .state_files import load_shared_state, save_shared_state, state_digest, verify_identical

__all__ = ["DistributedPrioritizedSampler", "DistributedScoreThenSelect", "RankBatch", "ReplayShard",
           "save_shared_state", "load_shared_state", "state_digest", "verify_identical", "session", "shutdown",
           "watch_launcher", "fork_safe_context", "started_by_launcher", "LAUNCHER_GONE_EXIT", "ProcessGroup"]

# Plumbing that 1.0 exported here, served from its module for one release with a DeprecationWarning.
_PLUMBING = {"current_group": "group", "check_dataset_size": "sampler", "advance_to_epoch": "sampler",
             "share_positions": "sampler"}


def __getattr__(name: str):
    if name in _PLUMBING:
        from .._moved import _warn

        home = f"{__name__}.{_PLUMBING[name]}"
        _warn(f"{__name__}.{name}", f"{home}.{name}", "1.1")
        return getattr(_importlib.import_module(home), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

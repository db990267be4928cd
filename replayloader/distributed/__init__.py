"""Several processes, one job (torch needed): what torch.distributed ranks share, and how they start and end.

- `DistributedPrioritizedSampler`: one prioritized distribution on every rank, feedback gathered each step.
- `DistributedScoreThenSelect`: score-then-select with a global candidate pool, per-rank slices.
- `save_shared_state` / `load_shared_state` / `state_digest`: one checkpoint file for every rank.
- `ReplayShard`: a replay buffer per rank (examples produced on each rank stay there).
- `session`, `shutdown`, `watch_launcher`, `fork_safe_context`: start, end without an abort, never outlive the
  launcher, never fork a threaded rank (``distributed.launcher``).
- `ProcessGroup`: the few collectives every part above uses.
"""
from .group import ProcessGroup, current_group
from .launcher import (LAUNCHER_GONE_EXIT, fork_safe_context, session, shutdown, started_by_launcher,
                       watch_launcher)
from .replay_shard import ReplayShard
from .sampler import (DistributedPrioritizedSampler, RankBatch, advance_to_epoch, check_dataset_size,
                      share_positions)
from .select import DistributedScoreThenSelect
from .state_files import load_shared_state, save_shared_state, state_digest, verify_identical

__all__ = ["DistributedPrioritizedSampler", "DistributedScoreThenSelect", "RankBatch", "ReplayShard",
           "save_shared_state", "load_shared_state", "state_digest", "verify_identical", "session", "shutdown",
           "watch_launcher", "fork_safe_context", "started_by_launcher", "LAUNCHER_GONE_EXIT", "ProcessGroup",
           "current_group", "check_dataset_size", "advance_to_epoch", "share_positions"]

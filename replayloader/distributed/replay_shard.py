"""ReplayShard: one `ReplayBuffer` per rank in a data-parallel job (torch.distributed, torchrun).

A replay buffer of examples produced *on* a rank (TMR's corrupted sentences, an environment's transitions) is
not shared: each rank fills its own shard with what it produced and samples its share of the global batch from
it, so no example crosses the network. What that takes, in one place:

- `split`: the per-rank batch (the global batch must divide evenly) and shard capacity (capacity // W);
- `seed`: an independent seed per rank derived from the run's seed (NumPy's `SeedSequence` spawn keys), so
  the shards sample independently and reproducibly; one process keeps the seed as it is;
- per-rank checkpoint files (`file`, `save_state` / `load_state`) and the world-size check: a shard's
  contents exist on its rank only, so a checkpoint resumes on the same number of ranks, and a different number
  is a clear error rather than silently dropped or duplicated shards.

Numpy only; `ReplayShard.current()` reads the rank and world size from torch.distributed when it is running.
For a fixed dataset whose sampling distribution all ranks share, see `DistributedPrioritizedSampler` (one state,
one file, any world size) instead.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import _checks as checks
from ..state import checks as state_checks
from ..state.files import StateFileError
from .state_files import read_state_file, state_digest, write_state_file


def check_world_size(saved: int, current: int, where: str, why: str = "its replay shards are per rank") -> None:
    """A state written by ``saved`` ranks continues on that many ranks only."""
    if saved != current:
        how = ("one process (plain python)" if saved == 1
               else f"{saved} processes in total (e.g. torchrun with {saved} processes in total)")
        raise ValueError(f"{where} was written by {saved} rank(s) but this run has {current}; {why}, so resume it "
                         f"with {how}")


@dataclass(frozen=True)
class ReplayShard:
    """Rank ``rank`` of ``world_size``: its batch and capacity, its seed, its checkpoint file."""

    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        world_size = checks.integer("world_size", self.world_size, 1)
        checks.integer("rank", self.rank, 0, world_size - 1, why=f"world_size is {world_size}")

    @classmethod
    def current(cls, group: Any = None) -> ReplayShard:
        """This process's shard in a running torch.distributed job; rank 0 of 1 without one."""
        try:
            import torch.distributed as dist
        except ImportError:
            return cls()
        if not (dist.is_available() and dist.is_initialized()):
            return cls()
        return cls(dist.get_rank(group), dist.get_world_size(group))

    def seed(self, seed: int) -> int:
        """This rank's seed: ``seed`` itself in one process, else an independent 63-bit seed spawned from it."""
        if self.world_size == 1:
            return seed
        state = np.random.SeedSequence(seed, spawn_key=(self.rank,)).generate_state(1, np.uint64)[0]
        return int(state >> np.uint64(1))

    def split(self, batch_size: int, capacity: int, batch_name: str = "batch_size") -> tuple[int, int]:
        """(per-rank batch, shard capacity) for a global ``batch_size`` and a total ``capacity``."""
        if batch_size % self.world_size:
            raise ValueError(f"{batch_name} {batch_size} (the global batch) must be divisible by the number of "
                             f"ranks {self.world_size}")
        if capacity < self.world_size:
            raise ValueError(f"capacity {capacity} must be at least the number of ranks {self.world_size} (each "
                             f"shard holds capacity // ranks)")
        return batch_size // self.world_size, capacity // self.world_size

    def file(self, directory: str | Path, suffix: str) -> Path:
        """This rank's file in a checkpoint directory: ``rank-RRRRR<suffix>``."""
        return Path(directory) / f"rank-{self.rank:05d}{suffix}"

    def save_state(self, state: Mapping, directory: str | Path) -> Path:
        """Write this rank's state (e.g. its buffer's or loader's ``state_dict()``) to its own file in
        ``directory`` (atomically, no pickle), with the world size; every rank calls it with its own state."""
        path = self.file(directory, ".npz")
        payload = {"world_size": self.world_size, "rank": self.rank, "state": dict(state)}
        write_state_file(payload, state_digest(payload), path)
        return path

    def load_state(self, directory: str | Path) -> dict:
        """This rank's state from ``directory``; a checkpoint of another world size is a ValueError."""
        path = self.file(directory, ".npz")
        if not path.is_file():
            first = ReplayShard(0, 1).file(directory, ".npz")
            if first.is_file():  # written by fewer ranks than this run has
                check_world_size(_saved_world_size(read_state_file(first)[0], first), self.world_size,
                                 str(directory))
            raise StateFileError(path, "no such shard file")
        payload = read_state_file(path)[0]
        check_world_size(_saved_world_size(payload, path), self.world_size, str(directory))
        return state_checks.field(payload, "state", str(path))


def _saved_world_size(payload: Any, path: Path) -> int:
    """The world size a shard file records (`InvalidState` naming the file if it holds none: a shared state file
    of another kind, whose digest is intact, put where a shard belongs)."""
    return state_checks.integer(payload, "world_size", str(path), 1)

"""Data-parallel pretraining on torch.distributed: what one rank needs to know about the others.

`make_world` reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). Without it
(or with WORLD_SIZE=1) the run is a `World` of one process whose methods change nothing, so a plain
``python examples/electra_tmr.py pretrain`` computes exactly what it did before. Under torchrun it is a
`DistributedWorld` (NCCL on ``cuda:LOCAL_RANK``, gloo on CPU): one `DistributedDataParallel` around the whole
generator+discriminator pair, one replay buffer and one seed stream per rank (`replayloader.distributed.ReplayShard`),
a disjoint share of every epoch's examples per rank, and one all-reduce per step for the loss shares and one per
logged step (`--log-every`) for the logged numbers.

Why one DDP around the pair: the token table is used three times (generator input, generator output layer,
discriminator input). In one module it is one parameter of one reducer, so its gradient is all-reduced once;
two DDP wrappers (one per model) would each own it and reduce it twice. Both passes of a step go through the
wrapper (``model("generator", ...)``, ``model("discriminator", ...)``, see `models.PairPart`), then one backward
of L_G + λ·L_D.
"""
from __future__ import annotations

import contextlib
import datetime
import math
import os
from collections.abc import Iterator
from typing import Any

import torch

from replayloader.distributed import LAUNCHER_GONE_EXIT, shutdown, watch_launcher  # noqa: F401 (re-exported)
from replayloader.distributed import ReplayShard

from ..errors import UserError
from ..runtime import pick_device, set_seed


class World:
    """One process: every method is the identity, so the loop reads the same with or without torchrun."""

    rank = 0
    size = 1
    local_rank = 0

    @property
    def is_main(self) -> bool:
        """Rank 0 logs, shows progress, writes the model and exports."""
        return self.rank == 0

    def device(self, name: str) -> torch.device:
        return pick_device(name)

    def start_rank_streams(self, seed: int) -> int:
        """Seed this rank's own streams (masking, Gumbel noise, dropout) and return its buffer's seed. Call after
        the model is built (the same initial weights on every rank). One process keeps ``seed`` untouched."""
        return seed

    @property
    def shard(self) -> ReplayShard:
        """This rank's replay shard: its batch and buffer capacity, seed stream and checkpoint file names."""
        return ReplayShard(self.rank, self.size)

    def per_rank(self, batch_size: int, buffer_size: int) -> tuple[int, int]:
        """(batch, buffer capacity) of one rank: the global batch split evenly, the buffer in the same ratio."""
        try:
            return self.shard.split(batch_size, buffer_size, batch_name="--batch-size")
        except ValueError as exc:
            raise UserError(str(exc)) from exc

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def loss_shares(self, generator_count: Any, discriminator_count: Any) -> tuple[Any, Any]:
        """Factors for this rank's mean L_G and mean L_D so that averaging the gradients over ranks gives the
        gradient of the global means (the counts are this rank's masked and real tokens: numbers or 0-dim
        tensors). One process: 1 and 1, without reading the counts, which may still be queued on the device."""
        return 1.0, 1.0

    def reduce_record(self, record: dict) -> dict:
        """A step's logged numbers, averaged over ranks, with every rank's step time."""
        return record

    @contextlib.contextmanager
    def main_first(self) -> Iterator[None]:
        """Rank 0 runs the block first (e.g. building a shared cache), the others after it."""
        yield

    def barrier(self) -> None:
        pass

    def share(self, value: Any) -> Any:
        """Rank 0's ``value`` (any picklable object), returned on every rank."""
        return value

    def all_agree(self, ok: bool) -> bool:
        """True on every rank when ``ok`` is true on every rank (how a failed checkpoint write is told to all)."""
        return ok

    def close(self, finished: bool = True) -> None:
        pass


class DistributedWorld(World):
    """One rank of a torchrun job; the process group is created here and destroyed by `close`."""

    def __init__(self, device_name: str, timeout_seconds: float) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.rank = int(os.environ["RANK"])
        self.size = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        wanted = pick_device(device_name)
        if wanted.type == "cuda":
            self._device = torch.device("cuda", self.local_rank)
            torch.cuda.set_device(self._device)
            backend = "nccl"
        else:
            self._device = wanted
            backend = "gloo"
        # A dead peer makes a collective fail after this timeout instead of blocking forever (torchrun's agent
        # normally takes the job down sooner, when it sees the worker exit).
        watch_launcher()  # before the rendezvous, which blocks too
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_seconds))
        self._reduce_device = self._device if backend == "nccl" else torch.device("cpu")

    def device(self, name: str) -> torch.device:
        return self._device

    def start_rank_streams(self, seed: int) -> int:
        own = self.shard.seed(seed)
        set_seed(own)
        return own

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [self._device.index] if self._device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)

    def loss_shares(self, generator_count: Any, discriminator_count: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The shares as 0-dim float64 tensors on the reduce device: the counts are summed there, never read on
        the host, so the step does not wait for the device."""
        own = torch.stack([torch.as_tensor(count, dtype=torch.float64, device=self._reduce_device)
                           for count in (generator_count, discriminator_count)])
        totals = own.clone()
        self.dist.all_reduce(totals)
        share_g, share_d = own * self.size / totals
        return share_g, share_d

    def reduce_record(self, record: dict) -> dict:
        # Numbers (or None) are averaged over the ranks that have a finite value; one all-reduce carries the sums,
        # the counts and every rank's step time (each rank fills its own slot).
        keys = [k for k, v in record.items() if k != "step" and (v is None or isinstance(v, (int, float)))]
        finite = [v is not None and math.isfinite(v) for v in (record[k] for k in keys)]
        times = [0.0] * self.size
        times[self.rank] = float(record.get("step_seconds", 0.0))
        vector = torch.tensor([float(record[k]) if ok else 0.0 for k, ok in zip(keys, finite)]
                              + [float(ok) for ok in finite] + times, dtype=torch.float64,
                              device=self._reduce_device)
        self.dist.all_reduce(vector)
        values = vector.tolist()
        sums, counts, times = values[:len(keys)], values[len(keys):2 * len(keys)], values[2 * len(keys):]
        out = dict(record)
        out.update({k: (s / c if c else None) for k, s, c in zip(keys, sums, counts)})
        out["step_seconds"] = max(times)  # the step ends when the slowest rank's gradients arrive
        out["step_seconds_per_rank"] = times
        return out

    @contextlib.contextmanager
    def main_first(self) -> Iterator[None]:
        if not self.is_main:
            self.barrier()
        yield
        if self.is_main:
            self.barrier()

    def barrier(self) -> None:
        if self._device.type == "cuda":
            self.dist.barrier(device_ids=[self._device.index])
        else:
            self.dist.barrier()

    def share(self, value: Any) -> Any:
        box = [value]
        self.dist.broadcast_object_list(box, src=0, device=self._reduce_device)
        return box[0]

    def all_agree(self, ok: bool) -> bool:
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=self._reduce_device)
        self.dist.all_reduce(flag, op=self.dist.ReduceOp.MIN)
        return bool(flag.item())

    def close(self, finished: bool = True) -> None:
        """After a finished run every rank waits for the others, then the group goes (`shutdown`: no abort at
        exit); after a failure it goes at once, since the other ranks may never reach a barrier."""
        if finished:
            shutdown()
        elif self.dist.is_initialized():
            self.dist.destroy_process_group()


def make_world(device_name: str = "auto", timeout_seconds: float = 600.0) -> World:
    """A `DistributedWorld` when launched by torchrun with more than one process, else the one-process `World`."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return World()
    return DistributedWorld(device_name, timeout_seconds)

"""PrioritizedBatchSampler: a `PrioritizedSampler` as a torch `BatchSampler`, for ``DataLoader(batch_sampler=...)``.

Optional module (torch is imported here only). The DataLoader iterates a batch sampler in the main process, also
with ``num_workers > 0``, so every draw, and every weight it reads, stays in one process; workers only fetch the
examples of the index lists they are sent. Prefetching draws a few batches ahead of training: those draws use
the weights known at that moment.

How the training loop learns which indices and importance weights a batch has: the DataLoader returns batches in
the order the batch sampler yielded them (its default ``in_order=True``), so the batch sampler keeps the
`SampledBatch` of every list it yields in a queue (`records.RecordedBatchSampler`, the base of every batch sampler
here), and `next_batch_info()` pops the one of the batch the loop has just received. Call it once per batch
received. A new ``iter()`` (a new DataLoader epoch or iterator) drops what the previous iterator had prefetched
and never returned.

Exact resume through a DataLoader: `state_dict()` holds the sampler and the batches drawn ahead but not yet
received by the loop (prefetched); after `load_state_dict`, the next ``iter()`` yields those first, then draws
on. With the same ``num_workers`` and ``prefetch_factor``, the resumed run sees the batches the uninterrupted
run would have seen (tested).

Several processes: pass a `DistributedPrioritizedSampler`; each rank's DataLoader then yields that rank's share
of every global batch, and `feedback` is a collective (every rank calls it once per batch). Pending batches are
checkpointed whole (global), so a state resumes on any number of ranks.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from ..distributed.sampler import DistributedPrioritizedSampler, advance_to_epoch
from ..sampler.prioritized import PrioritizedSampler, SampledBatch
from ..sampler.protocol import SamplerLike
from ..state.checks import array, field, integer, require
from .._moved import renamed
from .records import RecordedBatchSampler


class PrioritizedBatchSampler(RecordedBatchSampler[SampledBatch]):
    """Index lists drawn by a `PrioritizedSampler`; ``len()`` is its steps per epoch.

    Each ``iter()`` yields the remaining batches of the sampler's current epoch (all of them at an epoch start;
    the rest of it after `load_state_dict` of a mid-epoch checkpoint).
    """

    def __init__(self, sampler: PrioritizedSampler | DistributedPrioritizedSampler) -> None:
        if not isinstance(sampler, SamplerLike):  # the family, not a list (PrioritizedSampler, the DDP one, yours)
            raise TypeError(f"sampler must be a PrioritizedSampler or a DistributedPrioritizedSampler (a SamplerLike: "
                            f"next_batch, feedback, settle, state_dict, ...), got {type(sampler).__name__}")
        super().__init__()
        self.sampler = sampler

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[list[int]]:
        self._restart()
        # Batches drawn before a checkpoint come first; if they closed their epoch, the sampler is past it.
        epoch_closed = bool(self._waiting) and self._waiting[-1].epoch != self.sampler.epoch
        while self._waiting:
            yield self._hand_out(self._waiting.popleft()).indices.tolist()
        for batch in () if epoch_closed else self.sampler:
            yield self._hand_out(batch).indices.tolist()

    def set_epoch(self, epoch: int) -> None:
        """What frameworks call at each epoch start; see `distributed.sampler.advance_to_epoch`. Batches drawn ahead for
        an epoch that is being skipped are dropped.

        After `load_state_dict` the loop's epoch is that of the oldest batch drawn before the checkpoint and not
        received yet: a DataLoader that fetched ahead may have drawn the last batch of that epoch, so the sampler
        itself is already in the next one. Asking for the loop's epoch then changes nothing; asking for a later
        one (the loop ended that epoch early, and the checkpoint was taken at its end) drops those batches."""
        if self._waiting and epoch == self._waiting[0].epoch:
            return
        if self._waiting or epoch != self.sampler.epoch:
            self._load_pending(())
        advance_to_epoch(self.sampler, epoch)

    def next_batch_info(self) -> SampledBatch:
        """The `SampledBatch` (indices, importance weights, probabilities, epoch) of the next batch the
        DataLoader returns, oldest first."""
        return super().next_batch_info()

    def settle(self) -> None:
        """Apply feedback still in flight (a `DistributedPrioritizedSampler` with ``overlap=True``), e.g. when
        training ends; nothing to do for one process."""
        self.sampler.settle()

    def importance_weights(self, batch: SampledBatch, like: torch.Tensor) -> torch.Tensor:
        """The batch's importance weights as a tensor of ``like``'s dtype and device (to scale per-example losses)."""
        return torch.as_tensor(batch.weights, dtype=like.dtype).to(like.device, non_blocking=True)

    update = renamed("feedback")

    def feedback(self, batch: SampledBatch | Any, **feedback: Any) -> int:
        """`PrioritizedSampler.feedback` (torch tensors are accepted and detached)."""
        return self.sampler.feedback(batch, **feedback)

    def state_dict(self) -> dict:
        """The sampler's state plus the batches it drew that the loop has not received yet."""
        # a rank's share is kept as its global batch, so the state resumes on any number of ranks
        wholes = [b if getattr(b, "whole", None) is None else b.whole for b in self._pending()]
        pending = [{"indices": b.indices.copy(), "weights": b.weights.copy(), "probabilities": b.probabilities.copy(),
                    "epoch": b.epoch, "step": b.step} for b in wholes]
        return {"sampler": self.sampler.state_dict(), "pending": pending}

    def load_state_dict(self, state: Mapping) -> None:
        """All or nothing: the pending batches are checked before the sampler loads (which checks its own)."""
        pending = field(state, "pending", "batch sampler state")
        require(isinstance(pending, list), f"batch sampler state['pending'] must be a list, got {type(pending).__name__}")
        n = self.sampler.num_examples
        batches = []
        for j, batch in enumerate(pending):
            where = f"batch sampler state['pending'][{j}]"
            indices = array(batch, "indices", where, (-1,), "iu", np.int64)
            require(bool(((indices >= 0) & (indices < n)).all()), f"{where}['indices'] must lie in [0, {n})")
            batches.append(SampledBatch(indices, array(batch, "probabilities", where, indices.shape, "fiu", np.float64),
                                        array(batch, "weights", where, indices.shape, "fiu", np.float64),
                                        integer(batch, "epoch", where, 0), integer(batch, "step", where, 0)))
        self.sampler.load_state_dict(field(state, "sampler", "batch sampler state"))
        share = getattr(self.sampler, "share", lambda whole: whole)  # a rank's slice of a distributed batch
        self._load_pending(share(batch) for batch in batches)

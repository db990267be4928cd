"""PrioritizedModule: a Lightning `LightningModule` whose training batches come from a `PrioritizedSampler`, on
one device or under DDP (``Trainer(strategy="ddp", use_distributed_sampler=False)``).

Optional module (needs the ``lightning`` extra). Lightning normally swaps a DataLoader's sampler for a
`DistributedSampler`; a prioritized sampler shares its draws across ranks itself (`DistributedPrioritizedSampler`),
so the Trainer must leave it alone: ``use_distributed_sampler=False`` (Lightning raises a clear error otherwise).
The sampler's state travels inside Lightning's checkpoints (``on_save_checkpoint`` checks that every rank holds
the same state; ``ckpt_path=`` brings it back), as tensors plus plain values, so ``weights_only`` loading works.
"""
from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader

from ..state.files import flatten_state, unflatten_state
from ..distributed.sampler import DistributedPrioritizedSampler, check_dataset_size
from ..distributed.state_files import verify_identical
from ..distributed.launcher import fork_safe_context
from ..sampler.prioritized import PrioritizedSampler, SampledBatch
from .batch_sampler import PrioritizedBatchSampler

CHECKPOINT_KEY = "prioritized_sampler"


class PrioritizedModule(pl.LightningModule):
    """Subclass it: ``super().__init__(sampler)``; in ``train_dataloader`` return
    ``self.prioritized_dataloader(dataset, ...)``; in ``training_step`` take ``info = self.batch_info()``, compute
    the per-example loss of the batch and return ``self.prioritized_loss(info, per_example)``.

    ``sampler.batch_size`` is the global batch: each of W processes trains batch_size / W examples a step.
    """

    def __init__(self, sampler: PrioritizedSampler) -> None:
        super().__init__()
        if not isinstance(sampler, PrioritizedSampler):
            raise TypeError(f"sampler must be a PrioritizedSampler, got {type(sampler).__name__}")
        self.sampler = sampler
        self.batches: PrioritizedBatchSampler | None = None
        self._restored: dict | None = None

    def prioritized_dataloader(self, dataset: Any, **loader_kwargs: Any) -> DataLoader:
        """A DataLoader of ``dataset`` whose batches the sampler draws (under DDP: this rank's share of each)."""
        if self.batches is None:
            if self.trainer.world_size > 1:  # checks the sampler and dataset size on every rank
                sampler = DistributedPrioritizedSampler(self.sampler, dataset_size=len(dataset), overlap=True)
            else:
                check_dataset_size(self.sampler, len(dataset))
                sampler = self.sampler
            self.batches = PrioritizedBatchSampler(sampler)
        if self._restored is not None:
            self.batches.load_state_dict(self._restored)
            self._restored = None
        # workers never forked from this threaded rank (launcher.py); a context the caller gives is kept
        loader_kwargs.setdefault("multiprocessing_context", fork_safe_context(loader_kwargs.get("num_workers", 0)))
        return DataLoader(dataset, batch_sampler=self.batches, **loader_kwargs)

    def batch_info(self) -> SampledBatch:
        """Indices, importance weights and epoch of the batch ``training_step`` got (call once per batch)."""
        return self.batches.next_batch_info()

    def prioritized_loss(self, info: SampledBatch, per_example: torch.Tensor, **feedback: Any) -> torch.Tensor:
        """Feed the per-example losses back (``loss=``, unless other ``feedback`` is given; a collective under DDP,
        whose gather runs during the backward pass) and return their importance-weighted mean."""
        self.batches.feedback(info, **(feedback or {"loss": per_example.detach()}))
        return (per_example * self.batches.importance_weights(info, per_example)).mean()

    def on_train_end(self) -> None:
        if self.batches is not None:
            self.batches.settle()  # the last step's feedback, still in flight under DDP

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        if self.batches is not None:
            state = self.batches.state_dict()
            verify_identical(state, what="saving the sampler into a Lightning checkpoint")
            arrays, meta = flatten_state(state)
            checkpoint[CHECKPOINT_KEY] = {"meta": meta, "arrays": {k: torch.from_numpy(np.ascontiguousarray(v))
                                                                   for k, v in arrays.items()}}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        saved = checkpoint.get(CHECKPOINT_KEY)
        if saved is not None:  # applied when the train DataLoader is (re)built
            self._restored = unflatten_state({k: v.numpy() for k, v in saved["arrays"].items()}, saved["meta"])

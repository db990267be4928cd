"""Score-then-select in a torch training loop: DataLoader workers fetch the n_B candidates, the main process
scores them and trains on the chosen rows.

Optional module (torch is imported here only). `CandidateBatchSampler` is a `PrioritizedBatchSampler` whose
batches are candidate batches (the sampler's ``batch_size`` is n_B) and which owns a `ScoreThenSelect`: the
DataLoader's workers fetch all n_B examples of a candidate batch, the loop scores them with one no-grad forward
pass, ``choose`` picks the rows, and `take_rows` cuts them out of the batch already in memory. Nothing is
fetched twice and the workers never see a model.

Exact resume: ``state_dict()`` holds the sampler, the candidate batches prefetched but not received yet, and the
selector (generator, SelectiveBackprop's history); a resumed DataLoader run continues with the same candidate
and selection stream (tested with 2 workers).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..distributed.sampler import DistributedPrioritizedSampler
from ..distributed.select import DistributedScoreThenSelect
from ..sampler.prioritized import PrioritizedSampler, SampledBatch
from ..selection.score_then_select import ScoreThenSelect, load_together
from ..selection.rules import Selection, Selector
from .batch_sampler import PrioritizedBatchSampler


def take_rows(batch: Any, positions: Any) -> Any:
    """The rows ``positions`` of a collated batch: a tensor, or a mapping (returned as a dict) / tuple / list of
    them, nested; anything else (a string, a number) passes through unchanged. Tensors keep their device."""
    if isinstance(batch, torch.Tensor):
        return batch[torch.as_tensor(np.asarray(positions), dtype=torch.long, device=batch.device)]
    if isinstance(batch, Mapping):
        return {k: take_rows(v, positions) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(take_rows(v, positions) for v in batch)
    return batch


class CandidateBatchSampler(PrioritizedBatchSampler):
    """Candidate batches of n_B indices for ``DataLoader(batch_sampler=...)``, and the choice among them.

    Args:
        sampler: draws the candidates (its ``batch_size`` is n_B; ``alpha=0`` for uniform candidates); under DDP
            a `DistributedPrioritizedSampler` (n_B global: each rank fetches and scores n_B / W candidates and
            trains n_b / W of them, see `replayloader.distributed.select`).
        selector: picks the rows (`Selector(TopK(n_b))`, ...; n_b global).
        refresh: feed every candidate's score back to the sampler's weights.
    """

    def __init__(self, sampler: PrioritizedSampler | DistributedPrioritizedSampler, selector: Selector, *,
                 refresh: bool = True) -> None:
        super().__init__(sampler)
        distributed = isinstance(sampler, DistributedPrioritizedSampler)
        self.select = (DistributedScoreThenSelect if distributed else ScoreThenSelect)(sampler, selector,
                                                                                       refresh=refresh)

    def choose(self, candidates: SampledBatch, losses: torch.Tensor | np.ndarray) -> Selection:
        """`ScoreThenSelect.choose` for the batch `next_batch_info()` returned and its per-example losses (under
        DDP `DistributedScoreThenSelect.choose`, a collective: every rank calls it once per batch)."""
        return self.select.choose(candidates, losses)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "selector": self.select.selector.state_dict()}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore sampler, prefetched batches and selector; if any part is rejected, nothing changes."""
        load_together(self.select.selector, state["selector"], lambda: super(CandidateBatchSampler, self)
                      .load_state_dict(state))

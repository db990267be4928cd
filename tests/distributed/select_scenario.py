"""Score-then-select on 2 ranks (jobs.py) and its one-process reference (the tests): one process that applies the
same per-slice rule (slice r = rank r's share of each global candidate batch, k / W rows each, slices in rank
order) to the same global candidate batches, and refreshes its sampler with the whole batch's scores.

Scores are a deterministic function of the index and the epoch (some negative: the refresh clips them at 0), so
a rank and the reference score the same candidates alike.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from replayloader import PrioritizedSampler
from replayloader.distributed.sampler import share_positions
from replayloader.selection import Proportional, SelectiveBackprop, Selector, TopK

from . import scenario as sc

N, CANDIDATES, CHOSEN = 51, 8, 4  # 51 mod 8 = 3: the warm-up's last candidate batch is padded to 4 on 2 ranks
STEPS_PER_EPOCH = -(-N // CANDIDATES)
STEPS = 4 * STEPS_PER_EPOCH  # the warm-up pass, then three epochs of candidates drawn by the refreshed weights
SAVE_AT, TOTAL = 10, 20  # the DataLoader run: checkpoint after step 10 of 20
AHEAD = 2  # DataLoader(num_workers=1, prefetch_factor=2) draws 2 candidate batches ahead
RULES = {"top_k": TopK, "proportional": lambda k: Proportional(k, alpha=1.0, beta=0.5),
         "selective_backprop": lambda k: SelectiveBackprop(selectivity=1.0, history=16)}


def make_sampler() -> PrioritizedSampler:
    return PrioritizedSampler(N, batch_size=CANDIDATES, beta=0.5, uniform_fraction=0.1, seed=0)


def make_selector(rule: str, k: int = CHOSEN, seed: int = 0) -> Selector:
    return Selector(RULES[rule](k), seed=seed)


def score_of(indices: Any, epoch: int) -> np.ndarray:
    return sc.loss_of(np.asarray(indices), epoch) - 0.3


def record(candidates: Any, positions: Any, selection: Any) -> dict:
    """One rank's step: its candidates (dataset indices, positions in the global batch) and what it chose."""
    return {"step": candidates.step, "epoch": candidates.epoch, "candidates": np.asarray(candidates.indices).tolist(),
            "positions": np.asarray(positions).tolist(), "chosen": selection.positions.tolist(),
            "indices": selection.indices.tolist(), "weights": selection.weights.tolist()}


def drive(select: Any, steps: int) -> list[dict]:
    """``steps`` candidate batches through a `DistributedScoreThenSelect` (this rank's records)."""
    out = []
    for _ in range(steps):
        candidates = select.next_candidates()
        selection = select.choose(candidates, score_of(candidates.indices, candidates.epoch))
        out.append(record(candidates, candidates.positions, selection))
    return out


class Reference:
    """One process applying the per-slice rule; ``world_at(count)`` slices the batch after ``count`` steps (a
    resume on another world size changes it), each slice choosing with a rule of k / W by plain `choose`."""

    def __init__(self, rule: str, world_at: Any = lambda count: 2) -> None:
        self.rule, self.world_at, self.count = rule, world_at, 0
        self.sampler, self.selector, self.world = make_sampler(), None, None

    def _selector_for(self, world: int) -> Selector:
        """A selector with k / world that carries on the generator and memory of the previous one."""
        if world != self.world:
            fresh = make_selector(self.rule, CHOSEN // world)
            if self.selector is not None:
                fresh.rng_state = self.selector.rng_state.copy()
                fresh.rule.load_state_dict(self.selector.rule.state_dict())
            self.selector, self.world = fresh, world
        return self.selector

    def step(self, whole: Any) -> list[dict]:
        """One global candidate batch: every slice's record (rank order), then the refresh."""
        selector = self._selector_for(self.world_at(self.count))
        scores, records = score_of(whole.indices, whole.epoch), []
        for rank in range(self.world):
            positions = share_positions(len(whole), rank, self.world)
            chosen = selector.choose(scores[positions], whole.indices[positions], whole.weights[positions],
                                     short_batch=len(whole) < CANDIDATES)
            records.append(record(_Slice(whole, positions), positions, chosen))
        self.sampler.feedback(whole, loss=np.maximum(scores, 0.0))
        self.count += 1
        return records

    def drive(self, steps: int) -> list[list[dict]]:
        """Per rank, the records of ``steps`` draws without prefetching."""
        return transpose([self.step(self.sampler.next_batch()) for _ in range(steps)])

    def train(self, steps: int, ahead: int = AHEAD) -> list[list[dict]]:
        """Per rank, the records of ``steps`` steps of a DataLoader that draws ``ahead`` batches early."""
        from replayloader import PrioritizedBatchSampler

        return transpose(sc.train(PrioritizedBatchSampler(self.sampler), steps, ahead,
                                  step=lambda batches, info: self.step(info)))


class _Slice:
    def __init__(self, whole: Any, positions: np.ndarray) -> None:
        self.step, self.epoch, self.indices = whole.step, whole.epoch, whole.indices[positions]


def transpose(steps: list[list[dict]]) -> list[list[dict]]:
    """Per-step lists of rank records -> per-rank lists of step records (a world that shrank: rank 0 only)."""
    ranks = max(len(s) for s in steps)
    return [[s[rank] for s in steps if rank < len(s)] for rank in range(ranks)]


def loader_step(batches: Any, info: Any, batch: Any) -> dict:
    """One step of the DataLoader recipe on a dataset of indices: score the fetched candidates, choose, cut out."""
    from replayloader.torch.candidates import take_rows

    (rows,) = batch
    assert rows.tolist() == info.indices.tolist()  # the rows fetched are the candidates drawn
    selection = batches.choose(info, score_of(rows.numpy(), info.epoch))
    assert take_rows(rows, selection.positions).tolist() == selection.indices.tolist()
    positions = getattr(info, "positions", None)
    return record(info, np.arange(len(info)) if positions is None else positions, selection)


def loader(batches: Any) -> Any:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from replayloader.distributed import fork_safe_context

    return DataLoader(TensorDataset(torch.arange(N)), batch_sampler=batches, num_workers=1,
                      prefetch_factor=AHEAD, multiprocessing_context=fork_safe_context(1))  # never fork a rank

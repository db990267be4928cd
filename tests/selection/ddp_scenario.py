"""The 2-rank scenarios of ddp_jobs.py and their one-process references (used by test_ddp.py).

Losses are deterministic functions of the index and the step, so a rank and the reference measure the same
candidates alike. The references apply what each rank does to the global batch: every rank's slice is positions
rank, rank + 2, ... of it (`share_positions`), and the sampler is refreshed with the whole batch's scores.
"""
from __future__ import annotations

import numpy as np

from replayloader import PrioritizedSampler
from replayloader.distributed.sampler import share_positions
from replayloader.selection import (ReducibleLoss, ReusedPool, SelectionSwitch, Selector, TopK,
                                    stale_reducible_sampler, stale_rows)

N = 48
IL = np.linspace(0.0, 0.5, N)
CHOSEN = 4  # n_b (global): 2 per rank
POOLS, SAVE_POOL, STEPS_PER_POOL = 6, 4, 3
STALE_STEPS, REFRESH = 12, 4
SWITCH_STEPS, SWITCH_SAVE = 24, 10


def loss_of(indices, step: int) -> np.ndarray:
    return ((np.asarray(indices) * 37 + step * 11) % 101) / 101 + 0.05


# ----------------------------------------------------------------------------- ReusedPool
def reuse_sampler() -> PrioritizedSampler:
    return PrioritizedSampler(N, 12, alpha=1.0, beta=0.5, uniform_fraction=0.1, seed=0)  # 4 pools per pass


def reuse_pool() -> ReusedPool:
    return ReusedPool(Selector(TopK(CHOSEN), ReducibleLoss(IL), seed=0), steps=STEPS_PER_POOL)


def reuse_reference() -> list[list[dict]]:
    """Per rank, per step: its candidates and the chosen indices: TopK(2) over the rank's own slice, the slice's
    top 6 handed out 2 at a time."""
    sampler, out = reuse_sampler(), [[], []]
    for number in range(POOLS):
        whole = sampler.next_batch()
        scores = loss_of(whole.indices, number) - IL[whole.indices]
        for rank in (0, 1):
            share = whole.indices[share_positions(len(whole), rank, 2)]
            mine = scores[share_positions(len(whole), rank, 2)]
            order = sorted(range(len(mine)), key=lambda j: (-mine[j], j))[:STEPS_PER_POOL * 2]
            for step in range(STEPS_PER_POOL):
                out[rank].append({"candidates": share.tolist(),
                                  "chosen": share[order[2 * step:2 * step + 2]].tolist()})
        sampler.feedback(whole, loss=np.maximum(scores, 0.0))
    return out, sampler


# ----------------------------------------------------------------------------- the stale tree
def stale_sampler() -> PrioritizedSampler:
    return stale_reducible_sampler(IL, batch_size=8, initial_loss=0.69, beta=0.5, seed=0)


def stale_reference() -> tuple[list[list[dict]], PrioritizedSampler]:
    """One sampler fed the whole batch per step; a refresh as the ranks' plain feedback arrives: rank 0's share,
    then rank 1's."""
    sampler, out = stale_sampler(), [[], []]
    for step in range(STALE_STEPS):
        whole = sampler.next_batch()
        sampler.feedback(whole, loss=loss_of(whole.indices, step))
        if step % 3 == 2:
            rows = stale_rows(sampler, REFRESH)
            for rank in (0, 1):
                sampler.feedback(rows[rank::2], loss=loss_of(rows[rank::2], -step))
        for rank in (0, 1):
            positions = share_positions(len(whole), rank, 2)
            out[rank].append({"indices": whole.indices[positions].tolist(),
                              "weights": whole.weights[positions].tolist(),
                              "probabilities": whole.probabilities[positions].tolist()})
    return out, sampler


# ----------------------------------------------------------------------------- SelectionSwitch
def switch_sampler() -> PrioritizedSampler:
    return PrioritizedSampler(N, 16, alpha=0.0, seed=0)


def switch() -> SelectionSwitch:
    return SelectionSwitch(Selector(TopK(CHOSEN), ReducibleLoss(IL), seed=0), window=3, probe_every=3)


def switch_losses(indices, step: int) -> np.ndarray:
    """Training losses: a learnable part that falls with the step, plus the irreducible loss."""
    return np.maximum(0.8 - 0.04 * step, -0.2) + 0.3 * loss_of(indices, step) + IL[np.asarray(indices)]


def switch_reference() -> tuple[list[list[dict]], SelectionSwitch]:
    """Two switches in one process, as two ranks: every rank's slice to choose_split in selection steps, each
    its own slice to uniform(), the gathered losses to step_done; one sampler, refreshed once per selection."""
    sampler, ranks, out = switch_sampler(), [switch(), switch()], [[], []]
    for step in range(SWITCH_STEPS):
        whole = sampler.next_batch()
        shares = [share_positions(len(whole), rank, 2) for rank in (0, 1)]
        if ranks[0].selecting:
            losses = switch_losses(whole.indices, step)
            for rank, chooser in enumerate(ranks):
                refresh = (lambda s: sampler.feedback(whole, loss=np.maximum(
                    np.concatenate([x.scores for x in s])[np.argsort(np.concatenate(shares))], 0.0))) \
                    if rank == 0 else None
                chosen = chooser.choose_split([losses[p] for p in shares], [whole.indices[p] for p in shares],
                                              [whole.weights[p] for p in shares], refresh)
                out[rank].append({"selecting": True, "chosen": chosen[rank].indices.tolist()})
        else:
            picked = [chooser.uniform(whole.indices[p], rows=CHOSEN // 2) for chooser, p in zip(ranks, shares)]
            gathered = np.concatenate([p.indices for p in picked])
            for rank, chooser in enumerate(ranks):
                chooser.step_done(switch_losses(gathered, step), indices=gathered)
                out[rank].append({"selecting": False, "chosen": picked[rank].indices.tolist()})
    return out, ranks[0]

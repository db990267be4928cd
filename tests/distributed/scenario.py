"""One training scenario, run on 2 ranks (jobs.py) and in one process (the tests), so the two can be compared.

Feedback is a deterministic function of the index and the epoch, so a rank and one process that hold the same
sampler give the same feedback for the same draws. Records are JSON-able; `assemble` joins the ranks' shares of
each step back into the global batch (a padded repeat dropped).
"""
from __future__ import annotations

from collections import deque
from itertools import islice
from typing import Any

import numpy as np

from replayloader import LinearSchedule, PrioritizedSampler
from replayloader.strategies import LossDifference

N, B = 51, 8  # N mod B = 3: the warm-up's last batch is padded to 4 on 2 ranks
STEPS_PER_EPOCH = -(-N // B)
EPOCHS = 4  # the warm-up pass, then three prioritized epochs
SAVE_AT, TOTAL = 10, 20  # checkpoint after step 10 of 20 (inside the 2nd epoch)


def make_sampler(num_examples: int = N, **overrides: Any) -> PrioritizedSampler:
    options = dict(batch_size=B, beta=LinearSchedule(0.4, 1.0, 20), update=LossDifference(), uniform_fraction=0.1,
                   seed=0)
    options.update(overrides)
    return PrioritizedSampler(num_examples, **options)


def loss_of(indices: np.ndarray, epoch: int) -> np.ndarray:
    return 0.05 + ((np.asarray(indices) * 37 + epoch * 11) % 101) / 101


def record(batch: Any) -> dict:
    positions = getattr(batch, "positions", None)
    return {"step": batch.step, "epoch": batch.epoch, "indices": batch.indices.tolist(),
            "probabilities": batch.probabilities.tolist(), "weights": batch.weights.tolist(),
            "positions": list(range(len(batch))) if positions is None else positions.tolist()}


def drive(sampler: Any, steps: int) -> list[dict]:
    """Draw, then feed back, ``steps`` times through the sampler's own API (a sampler or a distributed one)."""
    out = []
    for _ in range(steps):
        batch = sampler.next_batch()
        sampler.feedback(batch, loss=loss_of(batch.indices, batch.epoch))
        out.append(record(batch))
    return out


def feed_back(batches: Any, info: Any) -> dict:
    """One training step's feedback: the loss of each index, through the batch sampler's `update`."""
    batches.feedback(info, loss=loss_of(info.indices, info.epoch))
    return record(info)


def train(batches: Any, steps: int, ahead: int = 1, on_step: Any = None, step: Any = feed_back) -> list[dict]:
    """``steps`` steps over a `PrioritizedBatchSampler` the way a DataLoader uses it, drawing ``ahead`` batches
    early; ``step(batches, info)`` trains on one batch and returns its record; ``on_step(count)`` runs after it
    (e.g. to save a checkpoint)."""
    out: list[dict] = []
    while len(out) < steps:
        iterator = iter(batches)
        window = deque(islice(iterator, ahead))
        for indices in iterator:
            window.append(indices)
            if _consume(batches, window, out, steps, on_step, step):
                return out
        while window:
            if _consume(batches, window, out, steps, on_step, step):
                return out
    return out


def _consume(batches: Any, window: deque, out: list, steps: int, on_step: Any, step: Any) -> bool:
    received = window.popleft()
    info = batches.next_batch_info()
    assert info.indices.tolist() == received
    out.append(step(batches, info))
    if on_step is not None:
        on_step(len(out))
    return len(out) == steps


def assemble(shares: list[list[dict]]) -> list[dict]:
    """The global batches from every rank's records of its shares (same steps, rank order)."""
    out = []
    for parts in zip(*shares):
        positions = np.concatenate([p["positions"] for p in parts])
        order = np.argsort(positions, kind="stable")
        _, first = np.unique(positions[order], return_index=True)
        keep = order[first]
        joined = {key: np.concatenate([p[key] for p in parts])[keep].tolist()
                  for key in ("indices", "probabilities", "weights")}
        assert len({(p["step"], p["epoch"]) for p in parts}) == 1
        out.append({"step": parts[0]["step"], "epoch": parts[0]["epoch"], **joined})
    return out


def run_loader(loader: Any, batches: Any, steps: int, step: Any, on_step: Any = None) -> list:
    """``steps`` steps of a real DataLoader loop over ``batches`` (its batch sampler), epoch after epoch:
    ``step(batches, info, batch)`` trains on one batch and returns its record; ``on_step(count)`` follows."""
    out: list = []
    while len(out) < steps:
        for batch in loader:
            info = batches.next_batch_info()
            out.append(step(batches, info, batch))
            if on_step is not None:
                on_step(len(out))
            if len(out) == steps:
                break
    return out

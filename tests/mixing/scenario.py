"""The scenario the DDP test runs on 2 ranks (jobs.py) and in one process (test_distributed.py): a mixture with
per-source prioritized sampling in a DataLoader with one worker, fed a loss that depends only on the example and
the step, so one process and two ranks must agree bit for bit."""
from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from replayloader.distributed import fork_safe_context
from replayloader.mixing import ODM, MixtureSampler
from replayloader.torch.mixing import MixtureBatchSampler

SIZES = [40, 25, 15]
BATCH = 8  # the global batch: 4 per rank
STEPS_PER_PASS = 10  # ceil(80 / 8)
TOTAL, SAVE_AT = 24, 7


def make(seed: int = 3) -> MixtureSampler:
    return MixtureSampler(SIZES, batch_size=BATCH, rule=ODM(warmup_steps=0), seed=seed, within="prioritized",
                          prioritized={"uniform_fraction": 0.1}, names=["a", "b", "c"])


class IndexData(Dataset):
    def __len__(self) -> int:
        return sum(SIZES)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(i)


def loss_of(indices: np.ndarray, step: int) -> np.ndarray:
    return 0.5 + (np.asarray(indices) % 7) * 0.3 + 0.02 * step


def loader(batches: MixtureBatchSampler) -> DataLoader:
    return DataLoader(IndexData(), batch_sampler=batches, num_workers=1, prefetch_factor=2, persistent_workers=True,
                      multiprocessing_context=fork_safe_context(1))


def train(batches: MixtureBatchSampler, steps: int, on_step=None) -> list[dict]:
    """Receive ``steps`` batches through a 1-worker DataLoader, feeding each back; return them (this rank's
    slices). ``on_step(count)`` runs after each feedback (to save a checkpoint)."""
    seen: list[dict] = []
    data = loader(batches)
    while len(seen) < steps:
        for received in data:
            info = batches.next_batch_info()
            assert received.tolist() == info.indices.tolist()
            batches.feedback(info, loss=torch.as_tensor(loss_of(info.indices, info.step)))
            seen.append({"indices": info.indices.tolist(), "sources": info.sources.tolist(),
                         "mixture": info.mixture.tolist(), "step": info.step})
            if on_step is not None:
                on_step(len(seen))
            if len(seen) == steps:
                break
    return seen


def assemble(shares: list[list[dict]]) -> list[dict]:
    """Ranks' slices (rank order) as the global batches they came from."""
    return [{"indices": [j for s in shares for j in s[i]["indices"]],
             "sources": [k for s in shares for k in s[i]["sources"]],
             "mixture": shares[0][i]["mixture"], "step": shares[0][i]["step"]} for i in range(len(shares[0]))]

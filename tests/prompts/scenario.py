"""The scenario the 2-rank test runs (jobs.py) and one process runs too (test_torch.py, test_distributed.py): a
GRPO-shaped loop over GRPOPromptSampler. Generation batches of B·G indices are fetched one ahead of scoring, as
accelerate's DataLoaderShard does, so each chunk but the first is drawn with one generation batch awaiting
feedback; each rank feeds back its contiguous slice of the generation batch (a slice may cut a group, as TRL's
can), with rewards that depend only on the prompt, the completion's place in its group and the step, so one
process and two ranks must agree bit for bit."""
from __future__ import annotations

import numpy as np

from replayloader.prompts import GRPOPromptSampler, PromptSampler

N, B, G, R = 40, 3, 4, 1  # B·G = 12 completions a generation batch: 6 a rank, so a rank's slice cuts a group
TOTAL, SAVE_AT = 16, 6  # generation batches; the checkpoint is taken after batch SAVE_AT is fed back


def make(seed: int = 0, **options) -> GRPOPromptSampler:
    prompts = PromptSampler(N, B, group_size=G, labels=np.arange(N) % 4, retest_every=3, stale_after=5,
                            retire_after=3, exploration=0.1, seed=seed)
    return GRPOPromptSampler(prompts, num_generations=G, repeat_count=R, **options)


def rewards_of(indices: np.ndarray, step: int) -> np.ndarray:
    """One 0/1 reward per completion: prompt i passes with probability (i mod 5) / 4 (a fifth never, a fifth
    always), a deterministic function of the prompt, the completion's place in its group and the step."""
    place = np.arange(len(indices)) % G
    u = (indices * 0.6180339887 + place * 0.37 + step * 0.1103) % 1.0
    return (u < (indices % 5) / 4).astype(float)


def generation_batches(sampler: GRPOPromptSampler):
    """B·G indices at a time, epoch after epoch (each ``iter`` continues where the sampler stands)."""
    def stream():
        while True:
            yield from sampler

    indices = stream()
    while True:
        yield [next(indices) for _ in range(B * G)]


def train(sampler: GRPOPromptSampler, steps: int, *, rank: int = 0, world: int = 1, start: int = 0,
          pending: list | None = None, on_step=None) -> list[list[int]]:
    """``steps`` generation batches from step ``start``; the next batch is fetched before this one is scored.
    ``pending``: the batch fetched ahead before a checkpoint (a resumed loop starts with it). ``on_step(step,
    fetched_ahead)`` is called after each feedback. Returns the batches, as every rank sees them (whole)."""
    batches = generation_batches(sampler)
    ahead = next(batches) if pending is None else pending
    seen = []
    for step in range(start, start + steps):
        batch, ahead = ahead, next(batches)
        seen.append(batch)
        if step % R == 0:
            whole = np.array(batch)
            mine = slice(rank * len(whole) // world, (rank + 1) * len(whole) // world)
            sampler.feedback(whole[mine], rewards=rewards_of(whole, step)[mine])
        if on_step is not None:
            on_step(step, ahead)
    return seen

"""`MixtureSampler` per phase, uniform against prioritized: why `within="prioritized"` costs more than 2x (issue 41).

    python -m bench.mixing_phases

Four sources of 40k/30k/20k/10k examples, `ODM` updating every step, batches of 64 and 256 (as bench.hot_paths).
Prints the median thread-CPU µs of ``next_batch()`` and of ``feedback(batch, loss=...)`` over 4,000 steps, and for
``within="prioritized"`` the group draw over the sources' trees (`SamplerGroup.draw_singles`: the compiled pass and the Python around it) timed alone on a
second, identical sampler, so the first one's stream is untouched.
"""
from __future__ import annotations

import os
import time

import numpy as np
import torch

from replayloader.mixing import ODM, MixtureSampler

SIZES = [40_000, 30_000, 20_000, 10_000]


def make(within: str, batch: int) -> MixtureSampler:
    options = {"prioritized": {"warmup_epochs": 0}} if within == "prioritized" else {}
    return MixtureSampler(SIZES, batch_size=batch, rule=ODM(warmup_steps=0), seed=0, within=within, **options)


def median_us(samples: list[int]) -> float:
    return float(np.median(samples)) / 1e3


def main() -> None:
    torch.set_num_threads(1)
    print(f"load average: {os.getloadavg()}")
    print("| batch | within | next_batch µs | feedback µs | SamplerGroup.draw_singles alone µs |\n|---|---|---|---|---|")
    for batch in (64, 256):
        loss = torch.rand(batch, generator=torch.Generator().manual_seed(0)) + 0.1
        for within in ("uniform", "prioritized"):
            sampler = make(within, batch)
            for _ in range(300):
                sampler.feedback(sampler.next_batch(), loss=loss)
            draws, feeds = [], []
            for _ in range(4000):
                t0 = time.thread_time_ns()
                drawn = sampler.next_batch()
                t1 = time.thread_time_ns()
                sampler.feedback(drawn, loss=loss)
                draws.append(t1 - t0)
                feeds.append(time.thread_time_ns() - t1)
            alone = "–"
            if within == "prioritized":
                other = make(within, batch)
                counts = np.bincount(drawn.sources, minlength=len(SIZES)).astype(np.int64)
                out = np.empty(batch, np.int64)
                times = []
                for _ in range(300):  # fewer than a source's epoch: the compiled path every time
                    t0 = time.thread_time_ns()
                    other.group.draw_singles(counts, out)
                    times.append(time.thread_time_ns() - t0)
                alone = f"{median_us(times):.1f}"
            print(f"| {batch} | {within} | {median_us(draws):.1f} | {median_us(feeds):.1f} | {alone} |")


if __name__ == "__main__":
    main()

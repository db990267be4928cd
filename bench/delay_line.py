"""Cost of ELECTRA's fixed-age delay line (``--delay-steps D``) per training step, beside the step it sits in.

A `DelayLine` adds a queue push and pop (and a no-op ``.to(device)``) around the producer; this times exactly
that on batches of the tiny preset's shape (32 × 128 token ids, the corrupted batch's four fields), against the
bare producer, and reports the memory the queue holds (it is also what each checkpoint stores). Each figure is
the best of several repeats (the machine is shared: the minimum is the least disturbed). Compare it with the
tiny preset's measured step time (results/reproduce_tmr/REPRODUCTION.md's runtime table: ~0.2-0.6 s on the shared 2-core CPU).

    python -m bench.delay_line
"""
from __future__ import annotations

import argparse
import os
import platform
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from replayloader_electra.pretrain.delay import delayed  # noqa: E402


def corrupted_batch(batch: int, length: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(5, 4096, (batch, length))
    return {"input_ids": ids.clone(), "original_ids": ids, "attention_mask": torch.ones_like(ids),
            "masked": torch.rand(batch, length) < 0.15}


def seconds_per_call(steps: int, delay: int, batch: int, length: int, repeats: int) -> float:
    """Best-of-``repeats`` mean seconds of one producer call, behind a delay line of ``delay`` (0: bare)."""
    batches = [corrupted_batch(batch, length) for _ in range(64)]  # fresh tensors each step, as the generator makes
    aux = {"generator_loss": torch.zeros(()), "produce_seconds": 0.0}
    best = float("inf")
    for _ in range(repeats):
        made = iter(range(steps))
        producer = delayed(lambda raw: (batches[next(made) % len(batches)], aux), delay)
        started = time.perf_counter()
        for _ in range(steps):
            producer(None)
        best = min(best, (time.perf_counter() - started) / steps)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"# delay line cost, {args.batch} x {args.length} batches, {args.steps} calls, best of {args.repeats}; "
          f"{platform.processor() or platform.machine()}, torch {torch.__version__}, 1 thread")
    bare = seconds_per_call(args.steps, 0, args.batch, args.length, args.repeats)
    print(f"| D | µs per call | added by the delay line, µs | queue memory, MiB |\n|---|---|---|---|\n"
          f"| 0 (bare producer) | {bare * 1e6:.1f} | – | 0 |")
    one = sum(t.element_size() * t.numel() for t in corrupted_batch(args.batch, args.length).values())
    for delay in (15, 31):
        cost = seconds_per_call(args.steps, delay, args.batch, args.length, args.repeats)
        print(f"| {delay} | {cost * 1e6:.1f} | {(cost - bare) * 1e6:.1f} | {delay * one / 2**20:.2f} |")


if __name__ == "__main__":
    main()

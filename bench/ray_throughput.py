"""Throughput of replay through Ray actors against the in-process buffer and thread workers.

    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 python -m bench.ray_throughput --out results/ray_throughput/ray_throughput.md

Examples of 128 float32 (512 B), inserted 64 at a time, sampled 64 at a time, PER settings (alpha 0.6, beta 0.4,
max-priority init, FIFO), buffer capacity 100,000. Rows:
- direct calls: ``add`` calls per second (blocking, one after another), and the latency of one ``sample`` +
  ``update`` pair, for the in-process `ReplayBuffer`, one buffer actor (`RemoteBuffer`) and 2 shards
  (`ShardedBuffer`);
- loaders: examples inserted and sampled per second through a whole loader pass (2 producers, the learner feeding
  back each batch), `ReplayDataLoader` with 2 thread workers and `RayReplayLoader` with 2 producer actors on one
  buffer actor and on 2 shards. No rate limiter, replay ratio 1.
Medians over ``--repeats`` timed runs after a warm-up.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

import ray  # noqa: E402

from replayloader import ReplayBuffer, ReplayDataLoader  # noqa: E402
from replayloader.ray import RayReplayLoader, RemoteBuffer, ShardedBuffer  # noqa: E402
from replayloader.strategies import by_name  # noqa: E402

ROWS, WIDTH, K, CAPACITY = 64, 128, 64, 100_000


def batch(item: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(item).random((ROWS, WIDTH), dtype=np.float32)}


@ray.remote(num_cpus=0)
class Producer:
    def produce(self, item: int) -> dict[str, np.ndarray]:
        return batch(item)


def make(kind: str):
    args = dict(alpha=0.6, beta=0.4, strategy=by_name("per"), seed=0)
    if kind == "in-process":
        return ReplayBuffer(CAPACITY, **args)
    if kind == "1 buffer actor":
        return RemoteBuffer(CAPACITY, **args)
    return ShardedBuffer([RemoteBuffer(CAPACITY // 2, **{**args, "seed": s}) for s in range(2)], seed=0)


def direct(buffer, calls: int) -> tuple[float, float]:
    """(add calls per second, seconds per sample + update)."""
    batches = [batch(i) for i in range(calls)]
    start = time.perf_counter()
    for b in batches:
        buffer.add(b)
    adds = calls / (time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(calls):
        sample = buffer.sample(K)
        buffer.feedback(sample.ids, weight=np.ones(K))
    return adds, (time.perf_counter() - start) / calls


def loader_pass(kind: str, buffer, producers, items: int) -> tuple[float, float]:
    """(examples inserted per second, examples sampled per second) over one pass."""
    if kind == "thread workers":
        loader = ReplayDataLoader(batch, buffer, K, source=range(items), workers=2)
    else:
        loader = RayReplayLoader(producers, buffer, K, source=range(items))
    start = time.perf_counter()
    sampled = 0
    for b in loader:
        loader.feedback(b, weight=np.ones(K))
        sampled += K
    seconds = time.perf_counter() - start
    return items * ROWS / seconds, sampled / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--items", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    producers = [Producer.remote() for _ in range(2)]
    rows = []
    for kind in ("in-process", "1 buffer actor", "2 shards"):
        buffer = make(kind)
        direct(buffer, 20)  # warm-up: kernels loaded, actors started
        runs = [direct(buffer, args.calls) for _ in range(args.repeats)]
        adds = statistics.median(r[0] for r in runs)
        latency = statistics.median(r[1] for r in runs)
        rows.append(("direct calls", kind, adds * ROWS, latency * 1e3, None))
        print(rows[-1], flush=True)
    for kind in ("thread workers", "1 buffer actor", "2 shards"):
        runs = []
        for repeat in range(args.repeats + 1):
            buffer = make("in-process" if kind == "thread workers" else kind)
            run = loader_pass(kind, buffer, producers, args.items if repeat else 20)
            if repeat:
                runs.append(run)
            if kind != "thread workers":
                for shard in getattr(buffer, "shards", [buffer]):
                    shard.kill()
        rows.append(("loader, 2 producers", kind, statistics.median(r[0] for r in runs), None,
                     statistics.median(r[1] for r in runs)))
        print(rows[-1], flush=True)
    if args.out is not None:
        report(args, rows, (load_before, os.getloadavg()[0]))


def report(args, rows, load: tuple[float, float]) -> None:
    lines = ["# Replay through Ray actors vs in process", "",
             f"Command: `OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 python -m bench.ray_throughput --calls {args.calls} "
             f"--items {args.items} --repeats {args.repeats} --out {args.out}`  ",
             f"Date: {datetime.date.today():%Y-%m-%d}  ",
             f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores shared with other "
             f"jobs, no GPU; one local Ray {ray.__version__} node (`ray.init(num_cpus=2)`), Python "
             f"{platform.python_version()}; 1-minute load average {load[0]:.1f} before and {load[1]:.1f} after "
             "the run (other jobs)", "",
             f"Examples of {WIDTH} float32, inserts of {ROWS}, samples of {K}, PER settings, capacity "
             f"{CAPACITY:,}; medians of {args.repeats} runs. Direct calls: blocking calls one after another "
             f"({args.calls} adds, then {args.calls} sample + update pairs). Loaders: one pass of {args.items} "
             "produced batches with 2 producers (threads or actors) and the learner feeding back every batch.", "",
             "| path | buffer | inserted examples/s | sample + update (ms) | sampled examples/s |",
             "|---|---|---:|---:|---:|"]
    for path, kind, inserts, latency, samples in rows:
        lines.append(f"| {path} | {kind} | {inserts:,.0f} | {'' if latency is None else f'{latency:.2f}'} | "
                     f"{'' if samples is None else f'{samples:,.0f}'} |")
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

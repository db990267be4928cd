"""Steps/s and examples/s of TMR pretraining on 1 vs 2 ranks (torchrun, gloo, one thread each), and the share of
a step each rank spends in its replay buffer (add + sample + update; goal <= 1%).

    python -m bench.distributed_throughput --repeats 3            # runs 1 and 2 ranks alternately, prints a table
    python -m bench.distributed_throughput --repeats 3 --write results/distributed_throughput/distributed_throughput.md

Both world sizes train on the same global batch, so examples/s = global batch x steps/s. Timing covers the steps
after ``--warmup`` (first-call compilation and cache reads excluded). Each run is a separate `torchrun` (or plain
python for 1 rank) launch of this same file with ``--worker``; every rank writes its own figures.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(args: argparse.Namespace) -> None:
    """One rank: pretrain with a buffer that times its own calls; write this rank's figures."""
    import torch

    torch.set_num_threads(1)
    from replayloader_electra.pretrain import PretrainConfig, loop

    spent = {"buffer": 0.0}
    step_times: list[float] = []

    class TimedBuffer(loop.ReplayBuffer):
        def _timed(self, method, *a, **k):
            started = time.perf_counter()
            try:
                return method(*a, **k)
            finally:
                spent["buffer"] += time.perf_counter() - started

        def add(self, *a, **k):
            return self._timed(super().add, *a, **k)

        def sample(self, *a, **k):
            step_times.append(time.perf_counter())  # one sample per step: a step boundary
            if len(step_times) == args.warmup + 1:
                spent["buffer"] = 0.0
            return self._timed(super().sample, *a, **k)

        def feedback(self, *a, **k):
            return self._timed(super().feedback, *a, **k)

    loop.ReplayBuffer = TimedBuffer
    out = Path(args.out)
    config = PretrainConfig(variant=args.variant, preset=args.preset, corpus=args.corpus, max_len=args.max_len,
                            batch_size=args.batch_size, steps=args.steps, buffer_size=args.buffer_size,
                            output_dir=str(out / "run"), cache_dir=args.cache_dir, progress=False,
                            export_hf=False, device="cpu", max_lines=args.max_lines)
    loop.pretrain(config)
    window = step_times[-1] - step_times[args.warmup]  # from the first timed step's start to the last one's start
    steps = len(step_times) - 1 - args.warmup
    rank = int(os.environ.get("RANK", 0))
    # the last step's buffer calls fall outside the window; scale the buffer time to the window's step count
    (out / f"rank-{rank}.json").write_text(json.dumps({
        "rank": rank, "steps_per_second": steps / window,
        "buffer_share": spent["buffer"] * steps / (steps + 1) / window}))


def launch(args: argparse.Namespace, ranks: int, out: Path) -> list[dict]:
    common = ["-m", "bench.distributed_throughput", "--worker", "--out", str(out), *forwarded(args)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if ranks == 1:
        command = [sys.executable, *common]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", *common]
    subprocess.run(command, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(ranks)]


def forwarded(args: argparse.Namespace) -> list[str]:
    return ["--variant", args.variant, "--preset", args.preset, "--corpus", args.corpus, "--max-len",
            str(args.max_len), "--batch-size", str(args.batch_size), "--steps", str(args.steps), "--buffer-size",
            str(args.buffer_size), "--warmup", str(args.warmup), "--cache-dir", args.cache_dir,
            "--max-lines", str(args.max_lines)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="tmr-loss_diff")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--corpus", default="python-docs")
    parser.add_argument("--max-lines", type=int, default=20000)
    parser.add_argument("--max-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32, help="global batch (split over the ranks)")
    parser.add_argument("--buffer-size", type=int, default=250, help="total capacity (split over the ranks)")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache-dir", default=str(Path(tempfile.gettempdir()) / "replayloader-bench-cache"))
    parser.add_argument("--write", default=None, help="also write the Markdown table to this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    rows = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for ranks in (1, 2):  # interleaved, so slow phases of the shared machine hit both
                rows[ranks].append(launch(args, ranks, Path(tmp) / f"{ranks}-{repeat}"))
                print(f"repeat {repeat} ranks {ranks}: {rows[ranks][-1]}", flush=True)
    lines = ["# Distributed pretraining throughput: 1 vs 2 ranks (gloo, CPU, 1 thread per rank)", "",
             f"Command: `python -m bench.distributed_throughput {shlex.join(sys.argv[1:])}`  ",
             f"Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC. Machine: {os.cpu_count()} CPU cores, no GPU, "
             f"{platform.platform()}; shared with other jobs, so the spread over repeats is part of the result.  ",
             f"Run: variant {args.variant}, preset {args.preset}, max_len {args.max_len}, global batch "
             f"{args.batch_size}, buffer {args.buffer_size} in total, {args.steps} steps, first {args.warmup} "
             "untimed.", "",
             "| ranks | steps/s per repeat | steps/s median | examples/s median (min-max) | buffer share of a step "
             "per rank: median (min-max) |", "|---|---|---|---|---|"]
    for ranks, runs in rows.items():
        speeds = [min(r["steps_per_second"] for r in run) for run in runs]  # a step is as fast as its slowest rank
        median = statistics.median(speeds)
        shares = []
        for rank in range(ranks):
            values = [100 * run[rank]["buffer_share"] for run in runs]
            shares.append(f"rank {rank}: {statistics.median(values):.2f}% ({min(values):.2f}-{max(values):.2f}%)")
        lines.append(f"| {ranks} | {', '.join(f'{s:.2f}' for s in speeds)} | {median:.2f} | "
                     f"{median * args.batch_size:.1f} ({min(speeds) * args.batch_size:.1f}-"
                     f"{max(speeds) * args.batch_size:.1f}) | {'; '.join(shares)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        Path(args.write).write_text(text)


if __name__ == "__main__":
    main()

"""Environment steps per second of SB3's DQN: SB3's uniform `ReplayBuffer` vs `replayloader.sb3.PrioritizedDQN`.

    python -m bench.sb3_speed                                 # sizes 1e4 1e5 1e6, 5 paired repeats, 15k steps
    python -m bench.sb3_speed --sizes 10000 --repeats 2 --steps 2000 --out /tmp/x.md   # a quick look

Why paired and alternated: the machine this was written on is shared with other long jobs, so its speed drifts
over minutes. Each repeat runs both arms back to back with the same seed and settings, the order alternating
between repeats, and the ratio is taken within the pair; the table reports the median over repeats.

Wall-clock steps/s are what the table reports; the process CPU-time ratio is printed beside them because it
is less disturbed by other jobs on the cores. Settings are SB3's DQN defaults (train_freq 4, gradient_steps 1, batch 32, learning_starts 100, MLP 64x64)
on CartPole-v1, one torch thread, CPU. Only ``model.learn`` is timed (model construction, which allocates the
buffer, is not). Each arm runs once untimed first (numba and torch warm-up). With ``--steps`` transitions, a
buffer larger than that is never full: its size changes the tree's depth and the arrays' footprint, not how
many transitions are sampled from.
"""
from __future__ import annotations

import argparse
import datetime
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import stable_baselines3
import torch
from stable_baselines3 import DQN

from replayloader.sb3 import PrioritizedDQN

ARMS = {"uniform": DQN, "prioritized": PrioritizedDQN}


def run_once(arm: str, buffer_size: int, steps: int, seed: int, device: str = "cpu") -> tuple[float, float]:
    """Wall seconds and process CPU seconds of ``learn(steps)`` for one fresh model."""
    model = ARMS[arm]("MlpPolicy", "CartPole-v1", buffer_size=buffer_size, seed=seed, device=device)
    wall, cpu = time.perf_counter(), time.process_time()
    model.learn(total_timesteps=steps)
    return time.perf_counter() - wall, time.process_time() - cpu


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=15_000, help="environment steps per timed run")
    parser.add_argument("--device", default="cpu", help="torch device of the networks and sampled batches "
                        "(the buffers store on the host, as SB3's do)")
    parser.add_argument("--load", default="no other jobs were reported",
                        help="what else ran on the machine meanwhile, written into the report")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results" / "sb3_speed" / "sb3_speed.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    for arm in ARMS:  # warm-up, untimed
        run_once(arm, 10_000, 500, seed=0, device=args.device)

    started = time.perf_counter()
    rows = []
    for size in args.sizes:
        seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
        cpu: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for repeat in range(args.repeats):
            order = list(ARMS) if repeat % 2 == 0 else list(ARMS)[::-1]
            for arm in order:
                wall, used = run_once(arm, size, args.steps, seed=repeat, device=args.device)
                seconds[arm].append(wall)
                cpu[arm].append(used)
            print(f"size {size:>9,} repeat {repeat}: " + ", ".join(
                f"{arm} {args.steps / seconds[arm][-1]:,.0f} steps/s" for arm in ARMS), flush=True)
        ratios = [p / u for p, u in zip(seconds["prioritized"], seconds["uniform"])]
        cpu_ratios = [p / u for p, u in zip(cpu["prioritized"], cpu["uniform"])]
        rows.append((size, *(args.steps / statistics.median(seconds[arm]) for arm in ARMS),
                     statistics.median(ratios), min(ratios), max(ratios), statistics.median(cpu_ratios)))
    total = time.perf_counter() - started

    command = shlex.join(["python", "-m", "bench.sb3_speed", *(argv or sys.argv[1:])])
    lines = [
        "# SB3 DQN: environment steps per second, uniform `ReplayBuffer` vs `replayloader.sb3.PrioritizedDQN`",
        "",
        f"Command: `{command.strip()}`  ",
        f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC  ",
        f"Machine: {cpu_name()}, {torch.get_num_threads()} torch thread, "
        f"{torch.cuda.get_device_name(args.device) + ' for the networks' if args.device.startswith('cuda') else 'CPU only'}"
        f"; meanwhile: {args.load}. "
        "Absolute speeds move with the machine's load; the paired ratio is the number to read.  ",
        f"Software: Python {platform.python_version()}, stable-baselines3 {stable_baselines3.__version__}, "
        f"torch {torch.__version__}, numpy {np.__version__}.  ",
        f"Setup: CartPole-v1, SB3 DQN defaults (train_freq 4, gradient_steps 1, batch 32, learning_starts 100, "
        f"MLP 64x64), {args.steps:,} steps per timed `learn`, {args.repeats} repeats per size, the two arms "
        f"alternated within each repeat (same seed). Wall time of the timed part: {total / 60:.1f} min.",
        "",
        "| buffer size | uniform steps/s (median) | prioritized steps/s (median) | time/step ratio "
        "prioritized/uniform (median of pairs) | ratio min-max | CPU-time ratio (median of pairs) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for size, uniform, prioritized, ratio, low, high, cpu_ratio in rows:
        lines.append(f"| {size:,} | {uniform:,.0f} | {prioritized:,.0f} | {ratio:.3f} | {low:.3f}-{high:.3f} "
                     f"| {cpu_ratio:.3f} |")
    lines += ["", "Steps/s and the time ratio are wall clock; the CPU-time ratio (process CPU seconds, less "
              "sensitive to other jobs taking the cores) is given beside it.",
              "", "Target: ratio <= 1.10. A ratio above 1 is the prioritized arm's extra time per environment "
              "step (sum-tree writes on every add, the tree descent, weights and the priority write-back on "
              "every update, and the weighted loss)."]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return text


if __name__ == "__main__":
    main()

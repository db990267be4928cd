"""Environment steps per second of SB3's DQN: SB3's uniform `ReplayBuffer` vs `replayloader.sb3.PrioritizedDQN`.

    python -m bench.sb3_speed                                 # sizes 1e4 1e5 1e6, 5 paired repeats, 15k steps
    python -m bench.sb3_speed --sizes 10000 --repeats 2 --steps 2000 --out /tmp/x.md   # a quick look
    python -m bench.sb3_speed --against /tmp/before --out /tmp/x.md   # PrioritizedDQN here vs another checkout

Why paired and alternated: the machine this was written on is shared with other long jobs, so its speed drifts
over minutes. Each repeat runs both arms back to back with the same seed and settings, the order alternating
between repeats, and the ratio is taken within the pair; the table reports the median over repeats.

Wall-clock steps/s are what the table reports; the process CPU-time ratio is printed beside them because it
is less disturbed by other jobs on the cores. Settings are SB3's DQN defaults (train_freq 4, gradient_steps 1, batch 32, learning_starts 100, MLP 64x64)
on CartPole-v1, one torch thread, CPU. Only ``model.learn`` is timed (model construction, which allocates the
buffer, is not). Each arm runs once untimed first (numba and torch warm-up). With ``--steps`` transitions, a
buffer larger than that is never full: its size changes the tree's depth and the arrays' footprint, not how
many transitions are sampled from.

``--lockstep N`` pairs more tightly, for a machine whose load moves within a run: the two arms' ``learn`` calls
run side by side in two threads that take turns every N environment steps (a callback hands over), so both
see the same load at a grain of a few tens of milliseconds; each arm's wall and thread CPU time are summed over
its own turns. Each ``learn`` is one whole call (its beta schedule, logging and updates unchanged); the two
models share numpy's and torch's global RNGs, so their episodes are not those of separate runs.

``--against DIR`` measures a change instead: the arms become `PrioritizedDQN` of this checkout and of the
checkout DIR (say a ``git worktree`` of the commit before), each in its own worker process that imports
``replayloader`` from its checkout, asked in turn (never both at once), paired and alternated as above.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import stable_baselines3
import torch
from stable_baselines3 import DQN
from stable_baselines3.common.callbacks import BaseCallback

from replayloader.sb3 import PrioritizedDQN

ARMS = {"uniform": DQN, "prioritized": PrioritizedDQN}
ROOT = Path(__file__).resolve().parents[1]


def run_once(arm: str, buffer_size: int, steps: int, seed: int, device: str = "cpu") -> tuple[float, float]:
    """Wall seconds and process CPU seconds of ``learn(steps)`` for one fresh model."""
    model = ARMS[arm]("MlpPolicy", "CartPole-v1", buffer_size=buffer_size, seed=seed, device=device)
    wall, cpu = time.perf_counter(), time.process_time()
    model.learn(total_timesteps=steps)
    return time.perf_counter() - wall, time.process_time() - cpu


class Baton:
    """Which of the two arms may run: one at a time, handed over at the end of each turn."""

    def __init__(self, first: str) -> None:
        self.holder = first
        self.finished: set[str] = set()
        self.changed = threading.Condition()

    def take(self, arm: str) -> None:
        with self.changed:
            self.changed.wait_for(lambda: self.holder == arm)

    def hand(self, arm: str, other: str, finished: bool = False) -> None:
        """End ``arm``'s turn; ``other`` runs next unless it has finished (then ``arm`` goes on)."""
        with self.changed:
            if finished:
                self.finished.add(arm)
            if other not in self.finished:
                self.holder = other
                self.changed.notify_all()


class Turns(BaseCallback):
    """An arm's side of ``--lockstep``: hands the baton over every ``every`` environment steps, and sums the wall
    and thread CPU seconds of its own turns only."""

    def __init__(self, baton: Baton, arm: str, other: str, every: int) -> None:
        super().__init__()
        self.baton, self.arm, self.other, self.every = baton, arm, other, every
        self.wall = self.cpu = 0.0

    def begin(self) -> None:
        self.baton.take(self.arm)
        self.started = (time.perf_counter(), time.thread_time())

    def end(self, finished: bool = False) -> None:
        wall, cpu = self.started
        self.wall += time.perf_counter() - wall
        self.cpu += time.thread_time() - cpu
        self.baton.hand(self.arm, self.other, finished)

    def _on_step(self) -> bool:
        if self.n_calls % self.every == 0:
            self.end()
            self.begin()
        return True


def run_lockstep(order: list[str], buffer_size: int, steps: int, seed: int, device: str, every: int
                 ) -> dict[str, tuple[float, float]]:
    """Wall and thread CPU seconds of ``learn(steps)`` for one fresh model per arm, the two taking turns every
    ``every`` steps (``order[0]`` first)."""
    models = {arm: ARMS[arm]("MlpPolicy", "CartPole-v1", buffer_size=buffer_size, seed=seed, device=device)
              for arm in order}
    baton = Baton(order[0])
    turns = {arm: Turns(baton, arm, other, every) for arm, other in zip(order, order[::-1])}
    failures: list[BaseException] = []

    def learn(arm: str) -> None:
        torch.set_num_threads(1)
        turns[arm].begin()
        try:
            models[arm].learn(total_timesteps=steps, callback=turns[arm])
        except BaseException as err:  # re-raised in the main thread
            failures.append(err)
        finally:
            turns[arm].end(finished=True)

    threads = [threading.Thread(target=learn, args=(arm,)) for arm in order]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return {arm: (turns[arm].wall, turns[arm].cpu) for arm in order}


class CheckoutWorker:
    """`PrioritizedDQN` of another checkout, timed in a process of its own: this file run as a script with that
    checkout first on the path, answering one line per timed run."""

    def __init__(self, checkout: Path, device: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(checkout))
        self.process = subprocess.Popen([sys.executable, __file__, "--serve", "--device", device], cwd=checkout,
                                        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.source = self._answer()  # the replayloader it imported, sent once warmed up

    def _answer(self) -> str:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the worker of {self.process.args} ended early (exit {self.process.wait()})")
        return line.strip()

    def __call__(self, buffer_size: int, steps: int, seed: int) -> tuple[float, float]:
        self.process.stdin.write(f"{buffer_size} {steps} {seed}\n")
        self.process.stdin.flush()
        wall, cpu = self._answer().split()
        return float(wall), float(cpu)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def serve(device: str) -> None:
    """The worker's side: warm up, say which replayloader it runs, then time one run per line asked."""
    import replayloader

    torch.set_num_threads(1)
    run_once("prioritized", 10_000, 500, seed=0, device=device)
    print(Path(replayloader.__file__).parent, flush=True)
    for line in sys.stdin:
        size, steps, seed = map(int, line.split())
        print(*run_once("prioritized", size, steps, seed, device=device), flush=True)


def in_process(arm: str, device: str) -> Callable[[int, int, int], tuple[float, float]]:
    """An arm timed in this process, after one untimed warm-up run."""
    run_once(arm, 10_000, 500, seed=0, device=device)
    return lambda size, steps, seed: run_once(arm, size, steps, seed, device=device)


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
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "sb3_speed" / "sb3_speed.md")
    parser.add_argument("--against", type=Path, default=None, metavar="DIR",
                        help="time PrioritizedDQN of this checkout against that of the checkout DIR")
    parser.add_argument("--lockstep", type=int, default=0, metavar="N",
                        help="run the two arms side by side, taking turns every N environment steps")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the worker of --against
    args = parser.parse_args(argv)
    if args.lockstep and args.against is not None:
        parser.error("--lockstep pairs the uniform and prioritized arms of one process; not with --against")
    if args.serve:
        serve(args.device)
        return ""
    torch.set_num_threads(1)

    if args.against is None:
        arms = {arm: in_process(arm, args.device) for arm in ARMS}
        workers = []
    else:
        workers = [CheckoutWorker(args.against.resolve(), args.device), CheckoutWorker(ROOT, args.device)]
        arms = dict(zip(["DIR", "this checkout"], workers))
        for name, worker in arms.items():
            print(f"{name}: replayloader from {worker.source}", flush=True)
    started = time.perf_counter()
    rows = measure(arms, args)
    total = time.perf_counter() - started
    for worker in workers:
        worker.close()
    make = report if args.against is None else against_report
    return write(make(args, argv, rows, total), args.out)


def measure(arms: dict[str, Callable[[int, int, int], tuple[float, float]]], args: argparse.Namespace
            ) -> list[tuple]:
    """Per buffer size: both arms' median steps/s (the baseline arm, the first, then the other) and the paired
    ratios other / baseline (wall: median, min, max; CPU: median)."""
    bottom, top = arms
    rows = []
    for size in args.sizes:
        seconds: dict[str, list[float]] = {arm: [] for arm in arms}
        cpu: dict[str, list[float]] = {arm: [] for arm in arms}
        for repeat in range(args.repeats):
            order = list(arms) if repeat % 2 == 0 else list(arms)[::-1]
            if args.lockstep:
                timed = run_lockstep(order, size, args.steps, repeat, args.device, args.lockstep)
            else:
                timed = {arm: arms[arm](size, args.steps, repeat) for arm in order}
            for arm, (wall, used) in timed.items():
                seconds[arm].append(wall)
                cpu[arm].append(used)
            print(f"size {size:>9,} repeat {repeat}: " + ", ".join(
                f"{arm} {args.steps / seconds[arm][-1]:,.0f} steps/s" for arm in arms), flush=True)
        ratios = [a / b for a, b in zip(seconds[top], seconds[bottom])]
        cpu_ratios = [a / b for a, b in zip(cpu[top], cpu[bottom])]
        rows.append((size, *(args.steps / statistics.median(seconds[arm]) for arm in arms),
                     statistics.median(ratios), min(ratios), max(ratios), statistics.median(cpu_ratios)))
    return rows


def header(args: argparse.Namespace, argv: list[str] | None, total: float, title: str, arms: str) -> list[str]:
    """The lines above a report's table: what ran, where, with what, and how the arms were paired."""
    command = shlex.join(["python", "-m", "bench.sb3_speed", *(argv or sys.argv[1:])])
    return [
        title,
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
        f"MLP 64x64), {args.steps:,} steps per timed `learn`, {args.repeats} repeats per size, {arms} "
        + (f"run side by side, taking turns every {args.lockstep} environment steps (same seed; CPU time: "
           f"each arm's thread)" if args.lockstep else "alternated within each repeat (same seed)")
        + f". Wall time of the timed part: {total / 60:.1f} min.",
        "",
    ]


def table(rows: list[tuple], first: str, second: str) -> list[str]:
    """One line per buffer size: both arms' median steps/s, then the paired ratios (first / second)."""
    lines = [f"| buffer size | {second} steps/s (median) | {first} steps/s (median) | time/step ratio "
             f"{first}/{second} (median of pairs) | ratio min-max | CPU-time ratio (median of pairs) |",
             "|---:|---:|---:|---:|---:|---:|"]
    for size, second_speed, first_speed, ratio, low, high, cpu_ratio in rows:
        lines.append(f"| {size:,} | {second_speed:,.0f} | {first_speed:,.0f} | {ratio:.3f} | {low:.3f}-{high:.3f} "
                     f"| {cpu_ratio:.3f} |")
    return lines


def report(args: argparse.Namespace, argv: list[str] | None, rows: list[tuple], total: float) -> str:
    lines = header(args, argv, total, "# SB3 DQN: environment steps per second, uniform `ReplayBuffer` vs "
                   "`replayloader.sb3.PrioritizedDQN`", "the two arms")
    lines += table(rows, "prioritized", "uniform")
    cpu = ("each arm's thread CPU seconds over its own turns" if args.lockstep else
           "process CPU seconds, less sensitive to other jobs taking the cores")
    lines += ["", f"Steps/s and the time ratio are wall clock; the CPU-time ratio ({cpu}) is given beside it.",
              "", "Target (issue 41): ratio <= 1.05 (<= 1.10 before). A ratio above 1 is the prioritized arm's "
              "extra time per environment step (the sum-tree write of the transitions added since the last "
              "update, the tree descent, weights and the priority write-back on every update, and the weighted "
              "loss)."]
    return "\n".join(lines) + "\n"


def against_report(args: argparse.Namespace, argv: list[str] | None, rows: list[tuple], total: float) -> str:
    lines = header(args, argv, total, f"# SB3 `PrioritizedDQN`: environment steps per second, this checkout vs "
                   f"`{args.against}`", "the two checkouts (each in its own worker process)")
    lines += table(rows, "this checkout", "DIR")
    lines += ["", "Steps/s and the time ratio are wall clock; the CPU-time ratio is the workers' process CPU "
              "seconds. A ratio below 1: this checkout's PrioritizedDQN takes less time per environment step."]
    return "\n".join(lines) + "\n"


def write(text: str, out: Path) -> str:
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text


if __name__ == "__main__":
    main()

"""The per-step hot paths, each beside the peer a user would otherwise reach for, in one command.

    python -m bench.hot_paths                                   # this checkout
    python -m bench.hot_paths --against /tmp/old                # paired before/after: another checkout's code
    python -m bench.hot_paths --against /tmp/old --out results/hot_paths/mixing.md
    python -m bench.hot_paths --everything --out /tmp/all.md   # and every other row of issue 41, peers beside

``--everything`` appends, after this script's rows, the reports of the benches that time the other rows of
issue 41, each in its own process: the sum tree and whole buffer beside TorchRL and cpprb (`bench_sumtree`, run
by ``.bench-venv/bin/python`` when that venv exists, see bench/README.md, since TorchRL 0.14 needs torch 2.14),
the same paired call by call with cpprb and the memory floor (`paired_tree_kernels`), what evict-lowest costs
(`evict_lowest_cost`) and SB3's step (`sb3_speed`, whole training runs: by far the longest part).

What a row times is one training step's share of the library: for `MixtureSampler`, ``next_batch()`` plus
``feedback(batch, loss=...)`` with the loss as a torch tensor (as a training loop sends it); for its peers,
the same for a `PrioritizedSampler` over the whole dataset, and one batch of torch's
``BatchSampler(RandomSampler(...))`` (draws only: it takes no feedback). Mixing rows use K = 4 sources of
40k/30k/20k/10k examples and `ODM` updating every step (``warmup_steps=0``), or `FixedMixture` (the sampler's own
cost: a rule that only checks its input); ``within="prioritized"`` rows and the `PrioritizedSampler` peer skip
the warm-up pass (``warmup_epochs=0``: the phase most of a run is in).

Why workers and interleaved pairs: the machine this runs on is shared (other jobs, two cores), so a figure taken
alone moves with the load. Each checkout's code runs in its own worker process (one thread each); the parent
asks them, row by row and repeat by repeat, for one timed repeat in turn (alternating who goes first), so load
hits both sides of a pair alike, and a repeat is timed in the worker thread's CPU time (`time.thread_time`), which
does not count the turns other jobs take on the cores. Each cell is the median over repeats of µs per step; the
ratio is the median of the per-pair ratios after / before, with its interquartile range. Machine, versions, commits and the load
average (before and after the run) are printed with the table.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
SIZES = [40_000, 30_000, 20_000, 10_000]
RUN_CODE = ("replayloader/mixing", "replayloader/sampler", "replayloader/kernels", "replayloader/strategies",
            "replayloader/prompts")
REPEAT_SECONDS = 0.03  # one timed repeat lasts about this long (steps per repeat are calibrated once per worker)


# ----------------------------------------------------------------------------------------------- rows
def _mixing(within: str, batch: int, rule: str = "odm"):
    def make():
        import torch
        from replayloader.mixing import ODM, FixedMixture, MixtureSampler

        options = {"prioritized": {"warmup_epochs": 0}} if within == "prioritized" else {}
        mix = ODM(warmup_steps=0) if rule == "odm" else FixedMixture.stratified(len(SIZES))
        sampler = MixtureSampler(SIZES, batch_size=batch, rule=mix, seed=0, within=within, **options)
        loss = torch.rand(batch, generator=torch.Generator().manual_seed(0)) + 0.1

        def step():
            sampler.feedback(sampler.next_batch(), loss=loss)

        return step
    return make


def _prioritized_sampler(batch: int):
    def make():
        import torch
        from replayloader import PrioritizedSampler

        sampler = PrioritizedSampler(sum(SIZES), batch, warmup_epochs=0, seed=0)
        loss = torch.rand(batch, generator=torch.Generator().manual_seed(0)) + 0.1

        def step():
            sampler.feedback(sampler.next_batch(), loss=loss)

        return step
    return make


def _random_sampler(batch: int):
    def make():
        from torch.utils.data import BatchSampler, RandomSampler

        batches = BatchSampler(RandomSampler(range(sum(SIZES))), batch, drop_last=False)
        it = iter(batches)

        def step():
            nonlocal it
            try:
                next(it)
            except StopIteration:
                it = iter(batches)
                next(it)

        return step
    return make


def _prompts(n: int, batch: int):
    """One generation batch of `PromptSampler` (draw + feedback of 8 completions a prompt, 0/1 rewards at pass
    rate 0.5), with difficulty labels, staleness and retests on, as `bench/bench_prompts.py` times it. The rewards
    are drawn once (a fresh draw per step would time numpy's generator, not the sampler)."""
    def make():
        import numpy as np
        from replayloader.prompts import PromptSampler

        sampler = PromptSampler(n, batch, group_size=8, labels=np.arange(n) % 5, stale_after=50, retest_every=4,
                                seed=0)
        rewards = (np.random.default_rng(0).random((batch, 8)) < 0.5).astype(float)

        def step():
            sampler.feedback(sampler.next_batch().indices, rewards=rewards)

        return step
    return make


# name -> (group, how to build its step, whether it runs replayloader code: then it runs on both sides)
ROWS = {}
for _b in (64, 256):
    ROWS[f"MixtureSampler uniform, FixedMixture, batch {_b}"] = (f"mixing {_b}", _mixing("uniform", _b, "fixed"), True)
    ROWS[f"MixtureSampler uniform, batch {_b}"] = (f"mixing {_b}", _mixing("uniform", _b), True)
    ROWS[f"MixtureSampler prioritized, batch {_b}"] = (f"mixing {_b}", _mixing("prioritized", _b), True)
    ROWS[f"peer: PrioritizedSampler (one, N = 100k), batch {_b}"] = (f"mixing {_b}", _prioritized_sampler(_b), True)
    ROWS[f"peer: torch BatchSampler(RandomSampler), batch {_b}"] = (f"mixing {_b}", _random_sampler(_b), False)
for _b in (16, 64, 256):
    ROWS[f"PromptSampler N = 1e6, generation batch {_b} prompts"] = ("prompts", _prompts(1_000_000, _b), True)


# ----------------------------------------------------------------------------------------------- worker
def worker() -> None:
    """Serve timing requests on stdin/stdout, one JSON line each: {"row", "steps"} -> {"us"} (µs per step);
    {"row", "calibrate": seconds} -> {"steps"}; {"versions": true} -> versions and where replayloader is."""
    import torch

    torch.set_num_threads(1)
    import replayloader

    steps_of: dict = {}
    built: dict = {}
    for line in sys.stdin:
        request = json.loads(line)
        if "versions" in request:
            import numba
            import numpy

            reply = {"replayloader": replayloader.__file__, "numpy": numpy.__version__, "numba": numba.__version__,
                     "torch": torch.__version__, "python": platform.python_version()}
        else:
            name = request["row"]
            if name not in built:
                built[name] = ROWS[name][1]()
                for _ in range(20):  # compilation-cache loads and first touches are not timed
                    built[name]()
            step = built[name]
            if "calibrate" in request:
                n, started = 0, time.thread_time()
                while time.thread_time() - started < request["calibrate"] / 3:
                    step()
                    n += 1
                per_step = (time.thread_time() - started) / n
                steps_of[name] = max(3, int(request["calibrate"] / per_step))
                reply = {"steps": steps_of[name]}
            else:
                n = steps_of[name]
                started = time.thread_time_ns()
                for _ in range(n):
                    step()
                reply = {"us": (time.thread_time_ns() - started) / n / 1e3}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


class Worker:
    def __init__(self, root: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1"}
        self.root = root
        self.proc = subprocess.Popen([sys.executable, str(HERE), "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=str(root))
        self.versions = self.ask({"versions": True})
        if not Path(self.versions["replayloader"]).resolve().is_relative_to(root.resolve()):
            raise SystemExit(f"the worker for {root} imported {self.versions['replayloader']}")

    def ask(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the worker for {self.root} died (request {request})")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def commit_of(root: Path) -> str:
    done = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=10", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", *RUN_CODE],
                           capture_output=True, text=True).stdout.strip()
    return (done.stdout.strip() or "?") + (f" (+ uncommitted changes in {', '.join(RUN_CODE)})" if dirty else "")


def machine() -> str:
    model = ""
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{platform.machine()} {model}, {os.cpu_count()} CPU cores, {platform.system()} {platform.release()}"


def quartiles(values: list[float]) -> tuple[float, float, float]:
    import numpy as np

    return tuple(float(q) for q in np.percentile(values, [25, 50, 75]))


# The other benches of issue 41's rows, each run as its own process (--everything): (command, writes --out).
OTHER_BENCHES = [(["bench.bench_sumtree", "--sizes", "1e3,1e5,1e6,1e7", "--budget", "0.3"], True),
                 (["bench.paired_tree_kernels", "--reps", "800"], True),
                 (["bench.evict_lowest_cost"], False),
                 (["bench.sb3_speed"], True)]


def other_report(command: list[str], writes_out: bool) -> str:
    """Run one of OTHER_BENCHES (bench_sumtree in the bench venv when it exists) and return its report."""
    import tempfile

    venv = ROOT / ".bench-venv" / "bin" / "python"
    in_venv = command[0] == "bench.bench_sumtree" and venv.exists()
    shown = f"`{'.bench-venv/bin/python' if in_venv else 'python'} -m {shlex.join(command)}`"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.md"
        done = subprocess.run([str(venv) if in_venv else sys.executable, "-m", *command,
                               *(["--out", str(out)] if writes_out else [])],
                              cwd=str(ROOT), capture_output=True, text=True)
        if done.returncode != 0:
            return f"{shown} failed ({done.returncode}):\n\n```\n{done.stderr[-2000:]}\n```\n"
        return f"{shown}:\n\n" + (out.read_text() if writes_out else done.stdout)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, default=None,
                        help="another checkout (e.g. `git worktree add /tmp/old <commit>`): its rows are timed as "
                             "'before', interleaved with this checkout's")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--rows", default="", help="only the rows whose name contains this text")
    parser.add_argument("--out", type=Path, default=None, help="also write the report (Markdown) here")
    parser.add_argument("--everything", action="store_true",
                        help="also run the other benches of issue 41 (tree, buffer, evict-lowest, SB3) and append "
                             "their reports")
    args = parser.parse_args(argv)
    names = [name for name in ROWS if args.rows in name]
    load_before = os.getloadavg()
    started = time.time()
    after = Worker(ROOT)
    before = Worker(args.against) if args.against else None
    sides = [("after", after)] + ([("before", before)] if before else [])
    for name in names:
        for _, w in sides if ROWS[name][2] else sides[:1]:
            w.ask({"row": name, "calibrate": REPEAT_SECONDS})
    times = {(name, side): [] for name in names for side, _ in sides}
    for r in range(args.repeats):
        for name in names:
            pair = sides if ROWS[name][2] else sides[:1]
            for side, w in (pair if r % 2 else pair[::-1]):
                times[(name, side)].append(w.ask({"row": name})["us"])
        print(f"repeat {r + 1}/{args.repeats}", file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    for _, w in sides:
        w.close()

    command = "python -m bench.hot_paths " + shlex.join(sys.argv[1:] if argv is None else argv)
    v = after.versions
    lines = ["# Hot paths beside their peers", "",
             f"Command: `{command}`  ",
             f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
             f"{time.time() - started:.0f} s  ",
             f"Machine: {machine()} (shared with other jobs); one thread per worker  ",
             f"Versions: Python {v['python']}, numpy {v['numpy']}, numba {v['numba']}, torch {v['torch']}  ",
             f"Load average (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in load_before)} at the start, "
             f"{', '.join(f'{x:.2f}' for x in load_after)} at the end  ",
             f"After: this checkout, {commit_of(ROOT)}  "]
    if before:
        lines.append(f"Before: {args.against}, {commit_of(args.against)}  ")
    lines += [f"Each cell: median µs (worker thread CPU time) per step over {args.repeats} interleaved repeats "
              f"(each about {REPEAT_SECONDS * 1000:.0f} ms of steps).", ""]
    if before:
        lines += ["| row | before µs | after µs | after / before (median of pairs, IQR) |", "|---|---|---|---|"]
    else:
        lines += ["| row | µs per step (IQR) |", "|---|---|"]
    group = None
    for name in names:
        if ROWS[name][0] != group and group is not None:
            lines.append("| | | | |" if before else "| | |")
        group = ROWS[name][0]
        a = quartiles(times[(name, "after")])
        if not before:
            lines.append(f"| {name} | {a[1]:.1f} ({a[0]:.1f}-{a[2]:.1f}) |")
        elif times[(name, "before")]:
            b = quartiles(times[(name, "before")])
            ratio = quartiles([x / y for x, y in zip(times[(name, "after")], times[(name, "before")])])
            lines.append(f"| {name} | {b[1]:.1f} | {a[1]:.1f} | {ratio[1]:.3f} ({ratio[0]:.3f}-{ratio[2]:.3f}) |")
        else:
            lines.append(f"| {name} | (same code) | {a[1]:.1f} | |")
    text = "\n".join(lines) + "\n"
    if args.everything:
        text += "".join(f"\n---\n\n{other_report(command, writes)}" for command, writes in OTHER_BENCHES)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker()
    else:
        main()

"""Run each torchrun recipe of the docs standalone, many times, and count how each run ended (issue 32).

For every python block of docs/distributed.md that starts its own group (`session`), it runs
``torchrun --nproc_per_node=2 train.py`` ``--runs`` times in a fresh folder and counts: exit 0, any other exit,
an abort at exit (``terminate called`` on stderr), a hang (past ``--timeout``), and processes left alive after
the launcher ended (found by the environment tag of tests/processes.py, then killed). Then ``--kills`` times it
starts the first recipe, SIGKILLs the launcher once both ranks train, and counts the runs where a process of the
job was still alive ``--grace`` seconds later. Markdown to stdout (and ``--out``).

    python -m checks.ddp_stress --runs 20 --kills 10 --out results/ddp_stress/ddp_stress.md
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from tests import processes  # noqa: E402


def recipes() -> dict[str, str]:
    """The torchrun recipes of docs/distributed.md, by their bold headings (as the suite finds them)."""
    from tests.distributed.test_lifecycle import torchrun_recipes

    return torchrun_recipes()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(script: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master-port={free_port()}",
            "--monitor-interval=0.2", str(script)]


def env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def one_run(code: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder, "train.py")
        script.write_text(code)
        started = time.monotonic()
        with processes.job(torchrun(script), env=env(), cwd=folder, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, grace=0) as job:
            try:
                _, stderr = job.communicate(timeout=timeout)
                status = job.returncode
            except subprocess.TimeoutExpired:
                processes.kill_tagged(job.tag)
                _, stderr = job.communicate()
                status = "hang"
            left = processes.wait_until_gone(job.tag, 5)
            processes.kill_tagged(job.tag)  # counted, so the job block does not fail
        return {"status": status, "abort": "terminate called" in stderr, "left": len(left),
                "seconds": time.monotonic() - started}


def one_kill(code: str, grace: float) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder, "train.py")
        # the recipe, slowed down so that it is still training when the launcher dies
        script.write_text(code.replace("for epoch in range(3):", "for epoch in range(1_000_000):"))
        with processes.job(torchrun(script), env=env(), cwd=folder, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, grace=0) as job:
            time.sleep(6)  # both ranks past the rendezvous and training (about 3 s on 2 cores)
            os.kill(job.pid, signal.SIGKILL)
            job.wait()
            killed = time.monotonic()
            left = processes.wait_until_gone(job.tag, grace)
            gone = time.monotonic() - killed
            processes.kill_tagged(job.tag)
            said = job.stderr.read().count("its launcher (pid")
        return {"left": len(left), "seconds": gone, "said": said}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=180)
    parser.add_argument("--grace", type=float, default=5)
    parser.add_argument("--out")
    args = parser.parse_args()
    lines = [f"# The torchrun recipes of docs/distributed.md, standalone ({datetime.date.today()}, {platform.node()}, "
             f"{os.cpu_count()} cores, torch {__import__('torch').__version__})", "",
             f"`python -m checks.ddp_stress --runs {args.runs} --kills {args.kills}`", "",
             "| recipe | runs | exit 0 | other exit | abort at exit | hang | runs leaving processes | s per run |",
             "|---|---|---|---|---|---|---|---|"]
    all_recipes = recipes()
    for heading, code in all_recipes.items():
        results = []
        for number in range(args.runs):
            results.append(one_run(code, args.timeout))
            print(f"{heading}: run {number + 1}: {results[-1]}", file=sys.stderr, flush=True)
        seconds = sorted(r["seconds"] for r in results)
        lines.append(f"| {heading} | {len(results)} | {sum(r['status'] == 0 for r in results)} | "
                     f"{sum(r['status'] not in (0, 'hang') for r in results)} | {sum(r['abort'] for r in results)} | "
                     f"{sum(r['status'] == 'hang' for r in results)} | {sum(r['left'] > 0 for r in results)} | "
                     f"{seconds[len(seconds) // 2]:.1f} |")
    if args.kills:
        heading, code = next(iter(all_recipes.items()))
        kills = []
        for number in range(args.kills):
            kills.append(one_kill(code, args.grace))
            print(f"launcher SIGKILL {number + 1}: {kills[-1]}", file=sys.stderr, flush=True)
        slowest = max(k["seconds"] for k in kills)
        lines += ["", f"Launcher SIGKILLed while \"{heading}\" trained: {args.kills} runs, "
                  f"{sum(k['left'] > 0 for k in kills)} with a process of the job alive {args.grace:g} s later; "
                  f"every process gone after at most {slowest:.2f} s; "
                  f"{sum(k['said'] for k in kills)} of {2 * args.kills} ranks said why on stderr."]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        Path(args.out).write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

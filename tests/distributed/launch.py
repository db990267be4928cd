"""Start a job on 2 CPU processes the way users do (torchrun, accelerate launch, a Lightning script) and read
each rank's JSON report. Process start-up is the cost of these tests, so one launch runs several checks."""
from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from tests import processes

ROOT = Path(__file__).resolve().parents[2]
JOBS = Path(__file__).with_name("jobs.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def launch(launcher: list[str], out: Path, jobs: list[str], timeout: float = 300, script: Path = JOBS,
           clean_exit: bool = False) -> list[dict]:
    """Run ``script OUT JOB...`` (default this folder's jobs.py) under ``launcher``; return each rank's report
    (rank order). ``clean_exit``: also fail when a rank aborted at exit ("terminate called" on stderr)."""
    out.mkdir(parents=True, exist_ok=True)
    # every process of the job is killed on timeout, and none may be left after it (tests/processes.py)
    done = processes.run([*launcher, str(script), str(out), *jobs], env=job_env(), cwd=ROOT, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"{launcher[:3]} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                             f"{done.stderr[-6000:]}")
    assert not clean_exit or "terminate called" not in done.stderr, done.stderr[-6000:]
    return [json.loads(p.read_text()) for p in sorted(out.glob("report-*.json"))]


def torchrun_command(ranks: int = 2) -> list[str]:
    """torchrun on a free port; its agent checks its ranks every 0.2 s (a dead rank ends the job that soon)."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}",
            f"--master-port={free_port()}", "--monitor-interval=0.2"]


def torchrun(out: Path, jobs: list[str], ranks: int = 2) -> list[dict]:
    return launch(torchrun_command(ranks), out, jobs)


def accelerate_command() -> list[str]:
    """Accelerate 1.15 starts several CPU processes only through mpirun under ``--cpu``; ``--multi_gpu`` on a
    machine without GPUs starts them through torch's elastic launcher (gloo, MULTI_CPU), as here."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(free_port())]


def accelerate_launch(out: Path, jobs: list[str]) -> list[dict]:
    return launch(accelerate_command(), out, jobs)

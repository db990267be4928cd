"""A tiny resumable job queue for the experiment drivers (regime_search.py, reproduce_tmr_cpu.py).

A job is a command that writes one run directory and, when it has finished, a ``done`` file in it. Drivers may
be stopped and restarted at will: a done job is never redone, a job with checkpoints is restarted with its
resume command, and a job another driver is running (its ``running.pid`` names a live process) is left alone.
At most ``parallel`` jobs of one folder run at once, counted over every driver: a driver checks the folder and
launches under an exclusive lock on ``OUT/.queue.lock``, so two drivers never take the same slot or the same
job. Each job runs one torch thread under ``nice``, because the machine has two cores and other work on them.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Job:
    name: str
    run_dir: Path
    start: list[str]  # the command of a new run
    resume: list[str] | None = None  # the command when the run has checkpoints (None: always start)
    done_file: str = "summary.json"  # written by the job when it has finished

    def status(self) -> str:
        """done, running (a live process holds running.pid), partial (checkpoints to resume from) or new."""
        if (self.run_dir / self.done_file).exists():
            return "done"
        if running_pid(self.run_dir) is not None:
            return "running"
        checkpoints = self.run_dir / "checkpoints"
        if self.resume is not None and checkpoints.is_dir() and any(checkpoints.glob("step-*")):
            return "partial"
        return "new"


def running_pid(run_dir: Path) -> int | None:
    """The live process named by the run's running.pid, or None. A zombie (its driver died) counts as dead, and so
    does a live process whose command line does not name the run folder: after a reboot the file's pid may
    belong to an unrelated process, and trusting it would skip the run forever."""
    try:
        pid = int((run_dir / "running.pid").read_text())
        os.kill(pid, 0)
    except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
        return None
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except (FileNotFoundError, IndexError):
        return pid  # no /proc (not Linux): trust the signal test
    if state == "Z" or (command_line and str(run_dir) not in command_line):
        return None
    return pid  # an empty command line is a process still being exec'd: it cannot be told apart, so trust it


def pretrain_command(*flags: str, nice: int = 15) -> list[str]:
    """`electra_tmr.py pretrain` with one torch thread, no progress bar, at low priority."""
    return ["nice", "-n", str(nice), sys.executable, str(REPO / "examples" / "electra_tmr.py"), "pretrain",
            "--threads", "1", "--no-progress", *flags]


def _log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


def launch(job: Job, log_dir: Path) -> subprocess.Popen:
    resume = job.status() == "partial"
    job.run_dir.mkdir(parents=True, exist_ok=True)
    data = REPO.parent / "shared" / "data"  # the workspace's GLUE and SQuAD copies, as $REPLAYLOADER_DATA
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               **({"REPLAYLOADER_DATA": str(data)} if data.is_dir() and "REPLAYLOADER_DATA" not in os.environ else {}),
               PYTHONPATH=str(REPO))
    command = job.resume if resume else job.start
    log = open(log_dir / f"{job.name}.log", "a")
    log.write(f"\n$ {' '.join(command)}\n")
    log.flush()
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    (job.run_dir / "running.pid").write_text(str(process.pid))
    _log(f"{'resume' if resume else 'start'} {job.name} (pid {process.pid})")
    return process


@contextlib.contextmanager
def queue_lock(log_dir: Path) -> Iterator[None]:
    """Held while a driver counts the folder's running jobs and launches one (released when the job's
    running.pid is written), so that a check and the launch it allows are one step for every driver."""
    with open(log_dir / ".queue.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def run_jobs(jobs: Iterable[Job], log_dir: Path, parallel: int, wait: bool = True, poll: float = 5.0,
             on_done: Callable[[Job], None] | None = None) -> list[str]:
    """Run every job not done or running elsewhere, at most ``parallel`` of ``log_dir``'s jobs at a time.

    With ``wait``, also wait for the jobs other drivers are running, so the caller may rely on every job having
    ended. ``on_done(job)`` is called as soon as one of this driver's jobs has finished (e.g. to export its
    results). Returns the names of the jobs that are done at the end.
    """
    jobs = list(jobs)
    log_dir.mkdir(parents=True, exist_ok=True)
    mine: dict[str, tuple[Job, subprocess.Popen]] = {}

    def busy() -> int:
        return sum(running_pid(p.parent) is not None for p in log_dir.rglob("running.pid"))

    def reap() -> None:  # a finished child stays a zombie (and looks alive to os.kill) until it is waited for
        for name, (job, process) in list(mine.items()):
            if process.poll() is not None:
                (job.run_dir / "running.pid").unlink(missing_ok=True)
                _log(f"{name} exited with {process.returncode}")
                del mine[name]
                if on_done is not None and job.status() == "done":
                    on_done(job)

    for job in jobs:
        while True:
            with queue_lock(log_dir):
                if job.status() in ("done", "running"):  # finished, or another driver has it
                    break
                if busy() < parallel:
                    mine[job.name] = (job, launch(job, log_dir))
                    break
            time.sleep(poll)
            reap()
    while mine or (wait and any(job.status() == "running" for job in jobs)):
        time.sleep(poll)
        reap()
    return [job.name for job in jobs if job.status() == "done"]

"""Start launcher jobs (torchrun, accelerate launch, a Lightning script) so that nothing they start can outlive them.

Killing the launcher is not enough: torchrun starts every rank in a session of its own, DataLoader workers and
forkservers are children of the ranks, and an orphan is adopted by init, out of reach of a process-group kill.
So every process of a job is marked: the job's environment carries ``REPLAYLOADER_TEST_JOB=<unique tag>``, which
every descendant inherits, and `tagged` finds them all through /proc, wherever they were reparented. `run`
kills the whole tagged set on timeout and, after every job, asserts that nothing tagged is left (a leftover is
killed and reported, so one leak cannot hang the next test).
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

TAG = "REPLAYLOADER_TEST_JOB"


def tagged(tag: str) -> list[int]:
    """The live processes (zombies excluded) whose environment holds ``TAG=tag``."""
    marker = f"{TAG}={tag}".encode()
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if marker in (proc / "environ").read_bytes().split(b"\0") and not zombie(int(proc.name)):
                found.append(int(proc.name))
        except OSError:  # ended meanwhile, or not ours to read
            continue
    return found


def zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as ended)."""
    return Path(f"/proc/{pid}").exists() and not zombie(pid)


def kill_tagged(tag: str) -> list[int]:
    """SIGKILL every process of the job; return the pids that were still alive."""
    left = tagged(tag)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


def wait_until_gone(tag: str, seconds: float) -> list[int]:
    """The job's processes still alive after waiting up to ``seconds`` for them to end by themselves."""
    deadline = time.monotonic() + seconds
    while (left := tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@contextlib.contextmanager
def job(command: list[str], *, env: dict | None = None, grace: float = 10.0,
        **popen: object) -> Iterator[subprocess.Popen]:
    """A started job (``subprocess.Popen`` in a session of its own, tagged). On leaving the block, whatever
    happened in it: the job's processes get ``grace`` seconds to end by themselves, then every one left is
    killed, and the test fails if any was left."""
    tag = uuid.uuid4().hex
    process = subprocess.Popen(command, env={**(os.environ if env is None else env), TAG: tag},
                               start_new_session=True, **popen)
    process.tag = tag  # type: ignore[attr-defined]  # what `kill_tagged` needs to end the whole job
    failed = False
    try:
        yield process
    except BaseException:
        failed = True
        raise
    finally:
        if process.poll() is None and failed:  # the test already failed: do not wait for a hung job
            kill_tagged(tag)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace)
        left = wait_until_gone(tag, 0 if failed else grace)
        killed = kill_tagged(tag)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
        if (left or killed) and not failed:
            raise AssertionError(f"the job {command[:4]} left processes alive after it ended: "
                                 f"{sorted(set(left + killed))}")


def run(command: list[str], *, timeout: float, env: dict | None = None, cwd: Path | str | None = None,
        grace: float = 10.0) -> subprocess.CompletedProcess:
    """``subprocess.run`` for a launcher job, with text output captured: on timeout every process of the job
    is killed and `subprocess.TimeoutExpired` is raised; after the job, nothing of it may be left."""
    with job(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
             grace=grace) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tagged(process.tag)
            stdout, stderr = process.communicate()
            raise subprocess.TimeoutExpired(command, timeout, stdout, stderr) from None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)

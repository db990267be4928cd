"""Living under a launcher: end with the launcher, fork no threaded process, tear the process group down cleanly.

Three ways a torch.distributed job of this library used to fail, each handled here once (issue 32):

- **A rank that outlives its launcher.** torchrun starts every rank in a session of its own, so a SIGKILL to the
  launcher reaches no rank: the ranks went on training, unsupervised, writing into the output directory.
  `watch_launcher` polls ``os.getppid()`` in a daemon thread; when the parent dies the orphan is adopted by init
  or a subreaper, the parent pid changes, and the rank says so in one line on stderr and ends at once with
  `LAUNCHER_GONE_EXIT`. It must be a hard exit (``os._exit``): a rank may be blocked in a collective that waits
  for the other ranks, where no Python signal handler or exception would ever run. (A parent-death signal,
  ``prctl(PR_SET_PDEATHSIG)``, fires when the parent *thread* that forked us ends and cannot print a line, so
  the poll is the one implementation.) `ProcessGroup` starts the watchdog in every rank that a launcher
  started (`started_by_launcher`); the ELECTRA pretraining job calls it directly.
- **A DataLoader worker forked from a threaded process.** After ``init_process_group("gloo")`` a rank runs three
  C++ threads (``gloo_tcp_loop``, the transport's event loop, and two ``pt_gloo_runloop`` threads that execute
  collectives, including an in-flight ``overlap=True`` gather). ``fork()`` copies only the forking thread: a
  lock that one of those threads held at that instant stays locked forever in the child, which then hangs
  (seen once inside ``os.fork()`` itself, in a DataLoader worker of the test suite). `fork_safe_context`
  names the start method that never forks this process, and the library's own DataLoaders use it. It is
  "spawn", not "forkserver": a spawned worker is the rank's child and DataLoader's own watchdog ends it when
  the rank dies, whereas CPython hands every forkserver child the server's keep-alive pipe, so after a rank
  is SIGKILLed its forkserver and workers keep each other alive forever (found by this project's leak check).
- **An abort at exit.** Leaving the interpreter with the group alive, or destroying it while another rank still
  finishes the last collective, ended a rank with ``terminate called without an active exception`` (SIGABRT;
  3 of 9 standalone runs of the README recipe). The abort is a gloo worker thread releasing a finished
  collective's tensors, which needs the GIL, after the interpreter began to exit (a gdb backtrace showed it:
  ``pt_gloo_runloop`` in ``~AsyncBarrierWork`` -> ``~AsyncAllgatherWork`` -> ``decref_pyobject`` ->
  ``take_gil`` -> ``pthread_exit`` -> ``std::terminate``). `shutdown` waits for every rank (a barrier, which
  also flushes any gather still in flight: a group runs its collectives in order), destroys the group, then
  waits until gloo's workers are parked (`wait_for_idle_collective_threads`); `session` wraps a job in it.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from .. import _checks as checks

LAUNCHER_GONE_EXIT = 3  # a rank's exit status when it stopped because its launcher died
# The parent at import, which is early in a rank's life (the script's first lines): a launcher that dies before
# the watchdog starts (a rank still importing torch, or waiting in the rendezvous) is still noticed.
_PARENT_AT_IMPORT = os.getppid()
_watchdog: threading.Thread | None = None
_watchdog_lock = threading.Lock()


def started_by_launcher() -> bool:
    """Whether a launcher process (torchrun, ``torch.distributed.launch``, ``accelerate launch``, a Lightning
    script's rank 0) started this process and supervises it. A plain ``python train.py`` is its own launcher:
    its parent is a shell, whose end must not stop a run started with ``nohup``."""
    if os.environ.get("TORCHELASTIC_RUN_ID"):  # torch's elastic agent (torchrun and everything built on it)
        return True
    try:
        return int(os.environ.get("LOCAL_RANK", "0")) > 0  # a rank started by rank 0 (Lightning's launcher)
    except ValueError:
        return False


def watch_launcher(*, poll_seconds: float = 0.5) -> threading.Thread:
    """End this process, with one line on stderr and exit status `LAUNCHER_GONE_EXIT`, within ``poll_seconds``
    of its parent's death (the parent it had when ``replayloader.distributed`` was first imported). Idempotent:
    the first call starts the one watchdog thread, later calls return it. `session` and every distributed part
    call it under a launcher; call it yourself in a process that a parent of yours supervises:

        from replayloader.distributed import watch_launcher
        watch_launcher()  # first thing in the child
    """
    if not poll_seconds > 0:
        raise ValueError(f"poll_seconds must be > 0, got {poll_seconds!r}")
    global _watchdog
    with _watchdog_lock:
        if _watchdog is not None and _watchdog.is_alive():
            return _watchdog
        parent = _PARENT_AT_IMPORT

        def watch() -> None:
            # a launched rank whose parent is already init (pid 1) was orphaned before the import
            while os.getppid() == parent and not (parent == 1 and started_by_launcher()):
                time.sleep(poll_seconds)
            rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK", "?"))
            print(f"replayloader: rank {rank} (pid {os.getpid()}): its launcher (pid {parent}) is gone; exiting "
                  f"with status {LAUNCHER_GONE_EXIT}", file=sys.stderr, flush=True)
            for child in multiprocessing.active_children():  # DataLoader workers: gone now, not in 5 s
                child.kill()
            os._exit(LAUNCHER_GONE_EXIT)

        _watchdog = threading.Thread(target=watch, name="replayloader-launcher-watchdog", daemon=True)
        _watchdog.start()
        return _watchdog


def is_threaded() -> bool:
    """Whether forking this process now risks a child that hangs on a lock: torch.distributed has started its
    threads, or Python threads other than this one are alive (the launcher watchdog counts: it sleeps and holds
    nothing, but then so would any thread until the one instant it does not)."""
    if threading.active_count() > 1:
        return True
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def fork_safe_context(num_workers: int) -> Any:
    """The ``multiprocessing_context`` for a DataLoader with ``num_workers`` workers in this process: None
    (DataLoader's default) with no workers or no threads to fear, else the "spawn" context. Spawned workers
    import the main script again, so a script that uses them needs the usual ``if __name__ == "__main__":``
    guard around its training; ``persistent_workers=True`` pays their start-up once instead of every epoch.

    Example:
        >>> from replayloader.distributed import fork_safe_context
        >>> fork_safe_context(0) is None
        True
    """
    checks.integer("num_workers", num_workers, 0)
    if num_workers == 0 or not is_threaded():
        return None
    return multiprocessing.get_context("spawn")


def shutdown(group: Any = None) -> None:
    """End this rank's part of a torch.distributed job without an abort: wait until every rank gets here (which
    also completes any collective still in flight), then destroy the group. A collective: every rank calls it.
    Nothing happens when torch.distributed was never started or is already torn down."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return
    dist.barrier(group=group)
    dist.destroy_process_group(group)
    wait_for_idle_collective_threads()


_RUN_LOOP_PREFIX = "pt_gloo"  # ProcessGroupGloo's worker threads ("pt_gloo_runloop")


def _run_loop_activity() -> dict[str, tuple[str, int]] | None:
    """Each gloo worker thread's scheduler state and context-switch count, from /proc (None without it)."""
    tasks = f"/proc/{os.getpid()}/task"
    if not os.path.isdir(tasks):
        return None
    activity = {}
    for tid in os.listdir(tasks):
        try:
            with open(f"{tasks}/{tid}/comm") as comm:
                if not comm.read().startswith(_RUN_LOOP_PREFIX):
                    continue
            with open(f"{tasks}/{tid}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except OSError:  # the thread ended meanwhile
            continue
        switches = int(fields["voluntary_ctxt_switches"]) + int(fields["nonvoluntary_ctxt_switches"])
        activity[tid] = (fields["State"].split()[0], switches)
    return activity


def wait_for_idle_collective_threads(timeout: float = 2.0, quiet_seconds: float = 0.02) -> bool:
    """Wait (at most ``timeout`` s) until gloo's worker threads are parked: each asleep and not switched in for
    ``quiet_seconds``. True when they are (or there are none).

    Why: a gloo worker drops its reference to a finished collective *after* the caller's wait returns. When
    that last reference frees tensors that Python created, their release needs the GIL; if the interpreter has
    begun to exit by then, the thread is ended inside a C++ destructor and the process aborts with
    ``terminate called without an active exception`` (upstream: pytorch/pytorch#190489; gloo's threads are
    not joined by ``destroy_process_group``). A loaded machine can deschedule that worker for milliseconds, long
    enough for the main thread to reach the exit, as in 1 of 5 runs here even after a barrier. Waiting until
    the workers are parked closes that window. Without /proc it waits ``quiet_seconds`` * 10 instead.
    """
    before = _run_loop_activity()
    if before is None:
        time.sleep(quiet_seconds * 10)
        return True
    deadline = time.monotonic() + timeout
    while before:
        time.sleep(quiet_seconds)
        now = _run_loop_activity() or {}
        if now == before and all(state == "S" for state, _ in now.values()):
            return True
        if time.monotonic() > deadline:
            return False
        before = now
    return True


@contextlib.contextmanager
def session(backend: str | None = None, **init_kwargs: Any) -> Iterator[None]:
    """Run a block as one rank of a torch.distributed job: start the default group (unless something already
    did: then it is left as it was found), watch the launcher when one started this process, and at the end
    `shutdown`. If the block raises, the group is not waited on (the other ranks may never get there: the
    launcher ends them when this rank exits non-zero), only the error propagates.

    Example (under ``torchrun --nproc_per_node=2``):

        with session("gloo"):  # "nccl" on GPUs
            ...  # build the DistributedPrioritizedSampler, train

    Args:
        backend: as for ``torch.distributed.init_process_group`` (None: its default for the device).
        init_kwargs: passed on to ``init_process_group`` (``timeout=``, ``device_id=``, ...).
    """
    import torch.distributed as dist

    if started_by_launcher():  # before the rendezvous, which waits on the launcher's store and can block too
        watch_launcher()
    started_here = not dist.is_initialized()
    if started_here:
        dist.init_process_group(backend, **init_kwargs)
    yield
    if started_here:
        shutdown()

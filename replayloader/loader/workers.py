"""Background producers: K worker threads (or processes) call the producer, results come back in item order.

`ProducerPool` owns the workers and two queues (tasks in, results out). `OrderedFeed` runs one coordinator
thread that takes items from an iterator, keeps at most ``window`` of them in flight (the bounded queue: a
producer that runs ahead waits for a free place), and hands every result to a ``consume`` callback in item
order, so what enters the buffer does not depend on which worker finished first. A failure in a worker or in
``consume`` is kept (`OrderedFeed.error`) for the training thread to re-raise with the worker's traceback
(except the error types ``consume`` raises about the caller's own settings, kept as they are).

Threads suit producers that release the GIL (numpy, Numba, torch); processes suit Python-heavy producers.
A process producer and its items must be picklable (the default start method is "spawn", which is safe with
the threads of numba, torch and OpenMP).
"""
from __future__ import annotations

import itertools
import multiprocessing
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

_STOP = None  # task sentinel: the worker exits


class WorkerError(RuntimeError):
    """The producer (or adding its output) failed in the background; the message holds the worker's traceback."""


def _work(producer: Callable[..., Any], tasks: Any, results: Any, use_item: bool, keep_exception: bool) -> None:
    """A worker's loop: call the producer on each task, send back (index, ok, result or error, idle seconds)."""
    while True:
        start = time.perf_counter()
        task = tasks.get()
        idle = time.perf_counter() - start
        if task is _STOP:
            return
        index, item = task
        try:
            out = producer(item) if use_item else producer()
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the training thread
            error = (traceback.format_exc(), exc if keep_exception else None)
            results.put((index, False, error, idle))
            continue
        results.put((index, True, out, idle))


class ProducerPool:
    """K workers calling ``producer(item)`` (or ``producer()``) on submitted tasks.

    Args:
        producer: the callable; with processes it must be picklable.
        workers: number of workers (>= 1).
        kind: "thread" or "process".
        use_item: call ``producer(item)`` rather than ``producer()``.
        start_method: multiprocessing start method for processes.
    """

    def __init__(self, producer: Callable[..., Any], workers: int, kind: str = "thread", use_item: bool = True,
                 start_method: str = "spawn") -> None:
        if kind not in ("thread", "process"):
            raise ValueError(f"kind must be 'thread' or 'process', got {kind!r}")
        self.kind = kind
        if kind == "thread":
            self.tasks, self.results = queue.Queue(), queue.Queue()
            make = threading.Thread
        else:
            context = multiprocessing.get_context(start_method)
            self.tasks, self.results = context.Queue(), context.Queue()
            make = context.Process
        self.workers = [make(target=_work, args=(producer, self.tasks, self.results, use_item, kind == "thread"),
                             name=f"replayloader-producer-{i}", daemon=True) for i in range(workers)]
        for worker in self.workers:
            worker.start()

    def submit(self, index: int, item: Any) -> None:
        self.tasks.put((index, item))

    def get(self, timeout: float) -> tuple[int, bool, Any, float]:
        """The next finished task (any order); raises `queue.Empty` after ``timeout`` seconds."""
        return self.results.get(timeout=timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Stop every worker and wait for it (a call in progress runs to its end); a process that does not stop
        in time is terminated."""
        try:  # drop tasks not yet started, so workers meet the sentinel next
            while True:
                self.tasks.get_nowait()
        except queue.Empty:
            pass
        for _ in self.workers:
            self.tasks.put(_STOP)
        deadline = time.monotonic() + timeout
        if self.kind == "process":  # a child exits only once its queued results are read: drain them
            while any(w.is_alive() for w in self.workers) and time.monotonic() < deadline:
                try:
                    self.results.get(timeout=0.05)
                except queue.Empty:
                    pass
        for worker in self.workers:
            worker.join(max(deadline - time.monotonic(), 0.01))
            if self.kind == "process" and worker.is_alive():
                worker.terminate()
                worker.join(1.0)
        if self.kind == "process":
            for q in (self.tasks, self.results):
                q.cancel_join_thread()  # never block interpreter exit on undelivered items
                q.close()


class OrderedFeed:
    """Produce ``items`` in a `ProducerPool` and hand the results to ``consume(index, result)`` in order.

    ``consume`` runs on the feed's coordinator thread; it may block (e.g. on a rate limiter). ``on_dispatch(index)``
    runs before each item is taken from ``items`` (to record a source's position). When everything is consumed,
    or on failure, ``on_finish()`` runs. ``producer_wait`` sums the seconds workers sat idle because ``window``
    results were already in flight. An exception of a type in ``passthrough`` that ``consume`` raises (a
    setting of the caller's that cannot work) is kept as it is, not wrapped in `WorkerError`.
    """

    def __init__(self, pool: ProducerPool, items: Iterator[Any], consume: Callable[[int, Any], None],
                 window: int, on_finish: Callable[[], None], on_dispatch: Callable[[int], None] | None = None,
                 poll: float = 0.05, passthrough: tuple[type[BaseException], ...] = ()) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        self.pool = pool
        self.items = items
        self.consume = consume
        self.window = window
        self.on_finish = on_finish
        self.on_dispatch = on_dispatch
        self.poll = poll
        self.passthrough = passthrough
        self.error: BaseException | None = None
        self.producer_wait = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replayloader-feed", daemon=True)

    def start(self) -> OrderedFeed:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self._coordinate()
        except self.passthrough as exc:
            if not self._stop.is_set():
                self.error = exc
        except BaseException as exc:  # noqa: BLE001
            if not self._stop.is_set():
                self.error = _wrap(exc, traceback.format_exc(), "while adding a produced batch to the buffer")
        finally:
            self.on_finish()

    def _coordinate(self) -> None:
        pending: dict[int, tuple[bool, Any]] = {}
        dispatched, inserted, exhausted = 0, 0, False
        counter = itertools.count()
        while not self._stop.is_set():
            while not exhausted and dispatched - inserted < self.window:
                if self.on_dispatch is not None:
                    self.on_dispatch(dispatched)
                try:
                    item = next(self.items)
                except StopIteration:
                    exhausted = True
                    break
                self.pool.submit(next(counter), item)
                dispatched += 1
            if exhausted and inserted == dispatched:
                return
            try:
                index, ok, payload, idle = self.pool.get(self.poll)
            except queue.Empty:
                continue
            self.producer_wait += idle
            pending[index] = (ok, payload)
            while inserted in pending and not self._stop.is_set():
                ok, payload = pending.pop(inserted)
                if not ok:
                    text, exc = payload
                    self.error = _wrap(exc, text, f"in a producer worker ({self.pool.kind}) on item {inserted}")
                    return
                self.consume(inserted, payload)
                inserted += 1

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def halt(self) -> None:
        """Ask the coordinator to stop; failures after this are shutdown noise, not errors."""
        self._stop.set()

    def stop(self, timeout: float = 5.0, wait_for_producers: bool = True) -> None:
        """Stop the coordinator and the workers; idempotent. Results still in flight are dropped. Without
        ``wait_for_producers``, a producer call still running is not waited for: a thread worker finishes it
        in the background and then exits, a process worker is terminated."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self.pool.close(timeout if wait_for_producers else 0.0)


def _wrap(exc: BaseException | None, text: str, where: str) -> WorkerError:
    error = WorkerError(f"producer failed {where}; its traceback:\n{text}")
    error.__cause__ = exc
    return error

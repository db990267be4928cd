"""RayReplayLoader: `ReplayDataLoader`'s iteration contract with Ray actors as the producers.

The learner process runs the loop and one feed thread (`workers.OrderedFeed`, as for thread workers). The feed
keeps one call in flight on each producer actor and adds the results in item order, so the buffer's contents do
not depend on which actor finished first. Produced batches never pass through the learner: the feed hands the
producer's ObjectRef to the buffer actor (`stage`), which fetches it from the producer's node and reports its
size; once the `RateLimiter` admits the insert, the feed commits it. A producer whose result is not admitted
gets no new call, so producers on every node wait, and the learner waits in ``acquire_sample``: both sides
block, each with its timeout, under the one limiter rule of `replayloader.loader.rate_limiter`, in the very
pass `ReplayDataLoader` runs with workers (`replayloader.loader.pacing`).

A producer actor that dies (its process or node lost) stops the loader with `ProducerDied`, or, with
``restart=``, is replaced by a new actor that produces its item again; the buffer keeps everything.
"""
from __future__ import annotations

import collections
import itertools
import queue
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import ray

from ..loader.pacing import PacedPass
from ..loader.rate_limiter import RateLimiter
from ..loader.replay_loader import ReplayBatch, checked_position, meter_report, new_meter, replay_batch
from ..loader.workers import WorkerError
from .protocol import StagingBufferLike
from .. import _checks as checks


class ProducerDied(WorkerError):
    """A producer actor died (its worker process or node was lost) and no ``restart`` was given."""


class ActorPool:
    """`OrderedFeed`'s pool over Ray actors: one call in flight per actor; results stay in Ray's object store
    (the pool hands out ObjectRefs, never the data)."""

    kind = "ray actor"

    def __init__(self, actors: Sequence[Any], method: str, use_item: bool) -> None:
        self.actors = list(actors)
        self.method, self.use_item = method, use_item
        self.waiting: collections.deque = collections.deque()  # (index, item) until an actor is free
        self.free = collections.deque(range(len(self.actors)))
        self.freed_at = [time.perf_counter()] * len(self.actors)
        self.running: dict[Any, tuple[int, int, float]] = {}  # ref -> (index, actor, seconds it sat idle)
        self.tasks: dict[int, tuple[Any, int, Any]] = {}  # index -> (item, actor, its handle), until consumed

    def call(self, actor: int, item: Any) -> Any:
        method = getattr(self.actors[actor], self.method)
        return method.remote(item) if self.use_item else method.remote()

    def submit(self, index: int, item: Any) -> None:
        self.waiting.append((index, item))
        self._dispatch()

    def _dispatch(self) -> None:
        while self.waiting and self.free:
            actor = self.free.popleft()
            index, item = self.waiting.popleft()
            idle = time.perf_counter() - self.freed_at[actor]
            self.running[self.call(actor, item)] = (index, actor, idle)
            self.tasks[index] = (item, actor, self.actors[actor])

    def get(self, timeout: float) -> tuple[int, bool, Any, float]:
        """The next finished call (any order) as (index, True, its ObjectRef, idle seconds); a failed call is
        finished too, and its failure shows when the ref is used."""
        if not self.running:
            time.sleep(timeout)
            raise queue.Empty
        ready, _ = ray.wait(list(self.running), num_returns=1, timeout=timeout, fetch_local=False)
        if not ready:
            raise queue.Empty
        index, actor, idle = self.running.pop(ready[0])
        self.free.append(actor)
        self.freed_at[actor] = time.perf_counter()
        self._dispatch()
        return index, True, ready[0], idle

    def replace(self, actor: int, handle: Any) -> None:
        self.actors[actor] = handle

    def rerun(self, index: int) -> Any:
        """Call the item of ``index`` again on its actor's current handle (after a restart)."""
        item, actor, _ = self.tasks[index]
        self.tasks[index] = (item, actor, self.actors[actor])
        return self.call(actor, item)

    def close(self, timeout: float = 5.0) -> None:
        """Forget every call; calls in progress run to their end on the actors and their results are dropped."""
        self.running.clear()
        self.waiting.clear()


def producer_failure(ref: Any) -> Exception | None:
    """The error of a produced ObjectRef (fetched only on this error path), or None if it holds a result."""
    try:
        ray.get(ref)
    except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
        return exc
    return None


class RayReplayLoader:
    """Iterate over prioritized batches of a buffer actor (or shards) fed by producer actors.

    Args:
        producers: Ray actor handles; each call of ``method`` returns a mapping of examples, or ``(mapping,
            weight)`` with one initial weight per example (Ape-X: priorities computed by the actor).
        buffer: a `RemoteBuffer` or `ShardedBuffer` (any `StagingBufferLike`).
        batch_size: examples per yielded batch.
        method: the producers' method to call, with the next item of ``source`` or without arguments.
        source: optional iterable of items (a re-iterable one, e.g. a list or range, for exact resumes).
        steps: optional number of producer calls per pass (needed without a source).
        replay_ratio: batches per produced batch when there is no rate limiter (may be fractional).
        rate_limiter: a `RateLimiter` counting inserted and sampled examples.
        window: produced batches in flight (default 2 per producer).
        timeout: seconds the loop waits for data without a rate limiter (a rate limiter has its own).
        restart: ``restart(i) -> handle`` replaces producer i when its actor dies; None raises `ProducerDied`.
    """

    def __init__(self, producers: Sequence[Any], buffer: StagingBufferLike, batch_size: int, *,
                 method: str = "produce", source: Iterable | None = None, steps: int | None = None,
                 replay_ratio: float = 1.0, rate_limiter: RateLimiter | None = None, window: int | None = None,
                 timeout: float = 60.0, restart: Callable[[int], Any] | None = None) -> None:
        producers = list(producers)
        if not producers:
            raise ValueError("producers must hold at least one Ray actor handle, got none")
        for i, producer in enumerate(producers):
            if not isinstance(producer, ray.actor.ActorHandle) or not hasattr(producer, method):
                raise TypeError(f"producers[{i}] must be a Ray actor handle with a method {method!r}, got "
                                f"{producer!r}")
        if not isinstance(buffer, StagingBufferLike):  # the methods it calls, not a list of classes
            raise TypeError(f"buffer must be a RemoteBuffer, a ShardedBuffer or another StagingBufferLike (stage, "
                            f"commit, sample, feedback, state_dict, load_state_dict, len), got "
                            f"{type(buffer).__name__}")
        checks.integer("batch_size", batch_size, 1)
        if source is None and steps is None:
            raise ValueError("give a source iterable or a number of steps, or the loader would never end")
        checks.optional_integer("steps", steps, 0)
        checks.number("replay_ratio", replay_ratio, 0, low_open=True)
        if rate_limiter is not None and not isinstance(rate_limiter, RateLimiter):
            raise TypeError(f"rate_limiter must be a RateLimiter, got {type(rate_limiter).__name__}")
        checks.optional_integer("window", window, 1)
        checks.number("timeout", timeout, 0, low_open=True)
        if restart is not None and not callable(restart):
            raise TypeError(f"restart must be None or a callable i -> actor handle, got {restart!r}")
        self.producers = producers
        self.buffer = buffer
        self.batch_size = int(batch_size)
        self.method, self.source, self.steps = method, source, steps
        self.replay_ratio = float(replay_ratio)
        self.rate_limiter = rate_limiter
        self.window = 2 * len(producers) if window is None else int(window)
        self.timeout = float(timeout)
        self.restart = restart
        self.lock = threading.Lock()  # an insert's commit and its count vs a checkpoint
        self.step = 0  # produced batches added in this pass
        self.restarts: list[dict[str, Any]] = []  # one record per replaced producer
        self._credit = 0.0
        self._resuming = False
        self._pace: PacedPass | None = None  # the pacing of a running pass
        self._latest = np.empty(0, np.int64)
        self._meter = new_meter()

    def _items(self) -> Iterator[Any]:
        """The items of the rest of this pass (None per step without a source)."""
        items = itertools.repeat(None) if self.source is None else itertools.islice(iter(self.source), self.step, None)
        left = None if self.steps is None else max(self.steps - self.step, 0)
        return items if left is None else itertools.islice(items, left)

    def __iter__(self) -> Iterator[ReplayBatch]:
        """One pass; a new iter() starts a new pass unless a state was just loaded."""
        if not self._resuming:
            self.step = 0
        self._resuming = False
        if self._meter["start"] is None:
            self._meter["start"] = time.perf_counter()
        pacing = PacedPass(self.rate_limiter, replay_ratio=self.replay_ratio, timeout=self.timeout,
                           credit=self._credit, window=self.window, batch_size=self.batch_size, lock=self.lock,
                           meter=self._meter)
        self._pace = pacing
        pool = ActorPool(self.producers, self.method, use_item=self.source is not None)

        def consume(index: int, ref: Any) -> None:
            def add() -> bool:
                self._latest = self.buffer.commit(index)
                self.step += 1
                return True

            pacing.insert(self._stage(pool, index, ref), add)
            del pool.tasks[index]

        def draw() -> ReplayBatch:
            return replay_batch(self.buffer.sample(self.batch_size), self._latest, produced=self.step)

        try:
            yield from pacing.run(pool, self._items(), consume, draw)
        finally:
            if pacing.credit is not None:
                self._credit = pacing.credit
            self._pace = None
        if pacing.finished:
            self.step = 0

    def _stage(self, pool: ActorPool, index: int, ref: Any) -> int:
        """Stage item ``index`` at the buffer; a producer that died is replaced (with ``restart``) and the item
        produced again, or reported."""
        while True:
            try:
                return self.buffer.stage(index, ref)
            except Exception:
                failure = producer_failure(ref)
                if failure is None:  # the producer's batch is fine: the buffer refused it or failed
                    raise
            _, actor, handle = pool.tasks[index]
            if not isinstance(failure, ray.exceptions.RayActorError):
                raise WorkerError(f"producer {actor} failed on item {index}; its traceback:\n{failure}") from failure
            if self.restart is None:
                raise ProducerDied(f"producer {actor} died while producing item {index}; pass restart= to "
                                   f"replace dead producers: {failure}") from failure
            if pool.actors[actor] is handle:  # not yet replaced (later items of a dead actor fail too)
                pool.replace(actor, self.restart(actor))
                self.producers[actor] = pool.actors[actor]
                self.restarts.append({"producer": actor, "item": index, "error": str(failure).splitlines()[0]})
                warnings.warn(f"producer {actor} died while producing item {index}; restarted it",
                              RuntimeWarning, stacklevel=2)
            ref = pool.rerun(index)

    def feedback(self, batch: ReplayBatch, **signals: Any) -> int:
        """Per-example signals (loss=, weight=, ...) for a yielded batch, to the buffer's strategy."""
        return self.buffer.feedback(batch.ids, **signals)

    def stats(self) -> dict[str, float]:
        """Inserted and sampled examples (and per second since the first pass), seconds the loop waited for data,
        seconds producers sat idle or held back by the limiter, and how many producers were restarted."""
        return {**meter_report(self._meter), "producer_restarts": len(self.restarts)}

    def state_dict(self) -> dict:
        """A consistent checkpoint, also while producers run: the buffer (every shard), the position of the last
        batch added and the limiter's counters. Batches in flight are produced again after a resume."""
        with self.lock:
            credit = self._credit if self._pace is None or self._pace.credit is None else self._pace.credit
            state = {"step": self.step, "credit": credit, "buffer": self.buffer.state_dict()}
            if self.rate_limiter is not None:
                state["rate_limiter"] = self.rate_limiter.state_dict()
        return state

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a checkpoint; the next iter() continues from it. All or nothing: the position and the limiter's
        state are checked before the buffer (every shard) is restored, and applied only once it has been."""
        if self._pace is not None:
            raise RuntimeError("load_state_dict while a pass runs; finish or break out of it first")
        step, credit, limiter, buffer_state = checked_position(state, self.rate_limiter)
        self.buffer.load_state_dict(buffer_state)
        self.step, self._credit = step, credit
        if limiter is not None:
            self.rate_limiter.commit_state(limiter)
        self._resuming = True

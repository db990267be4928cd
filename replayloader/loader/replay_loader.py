"""ReplayDataLoader: producer -> buffer -> prioritized mini-batches, as a plain iterable.

Each step calls the producer once (optionally on the next item of a source iterable), adds what it produced,
and yields ``replay_ratio`` sampled batches (a fractional ratio accumulates: 0.5 yields every other step).
Whatever the producer returns beside the examples (a loss that still needs a backward pass, say) rides along
on the batches of that step as ``aux``.

With ``workers=K`` the producer runs in K background threads (or processes) instead, and its results enter the
buffer in item order through a bounded queue while the training loop samples (`workers.OrderedFeed`); a
`RateLimiter` holds the two sides to a samples-per-insert ratio (`pacing.PacedPass`, `RayReplayLoader`'s too). Every buffer call then holds ``loader.lock``.
Without workers a `RateLimiter` sets how many batches each produced batch buys (the loop never waits).

A producer that keeps state between calls (a delay line, an n-step return accumulator) declares it with
``loader_state_dict()`` / ``load_loader_state_dict(state)``; the loader saves and restores that state with its
own, so a resumed run continues exactly. Such a producer runs inline (``workers=0``): in workers its state
would run ahead of the buffer's.
"""
from __future__ import annotations

import warnings

import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..buffer.protocol import FillableBufferLike
from ..buffer.replay_buffer import Sample
from .deferred import DeferredFeedback
from ..buffer.locked import LockedBuffer
from .pacing import PacedPass
from .rate_limiter import RateLimiter
from ..state.checks import InvalidState, field, integer, number
from .workers import ProducerPool
from .. import _checks as checks
from .._moved import renamed


@dataclass
class ReplayBatch(Sample):
    """A `Sample` plus the producer's side output, which examples were produced this very step, and ``produced``:
    the producer calls of this pass so far, this batch's included (with one call per training step, the step
    number). 0.1 called it ``step``; 1.0 keeps ``step`` for one meaning only, `SampledBatch`'s global batch
    number, and serves the old name with a DeprecationWarning for one release."""

    aux: Any = None
    fresh: np.ndarray | None = None  # bool (k,): True where the example came from this step's producer call
    produced: int = 0

    step = renamed("produced")


class ReplayDataLoader:
    """Wrap a producer callable in a replay buffer and iterate over sampled mini-batches.

    Args:
        producer: ``producer(item)`` (with a source) or ``producer()`` (without) returning a mapping of
            examples, or a tuple ``(examples, aux)``.
        buffer: the `ReplayBuffer` to fill and sample from (or any `FillableBufferLike`).
        batch_size: examples per yielded batch.
        replay_ratio: sampled batches per produced batch (> 0; may be fractional).
        source: optional iterable feeding the producer (e.g. a torch DataLoader); iteration ends with it.
        steps: optional number of producer calls per pass (needed when there is no source).
        min_size: produce without yielding until the buffer holds this many examples.
        workers: 0 calls the producer in the training loop; K >= 1 runs it in K background workers.
        worker_kind: "thread" (default; suits producers that release the GIL) or "process" (a picklable
            producer, for Python-heavy work).
        window: produced batches that may be in flight before workers pause (default 2 K); without a
            rate limiter, also how many produced batches the buffer may get ahead of the training loop. (The
            same name as `RayReplayLoader`'s; 0.1's ``queue_size=`` still works for one release, with a
            DeprecationWarning.)
        rate_limiter: a `RateLimiter` that paces inserted vs sampled examples (then ``replay_ratio`` is unused):
            with workers, the side that runs ahead waits; without workers, the loop yields after each produced
            batch as many batches as the limiter admits. Without one the loop takes ``replay_ratio`` batches per
            produced batch (as they arrive, with workers).
        timeout: seconds the training loop waits for background data before `RateLimitTimeout` (without a
            rate limiter; a rate limiter has its own). The error comes after that time even while a producer
            call is still running (that call is not waited for: a thread finishes it in the background).
        start_method: multiprocessing start method for process workers.
        defer_feedback: `feedback` only starts moving the signals to the host (`deferred.DeferredFeedback`); they
            reach the buffer just before the next produced batch is added (before the next sample with
            workers), so a GPU step never waits for its feedback copy. Same results; an invalid value is
            reported one step later.
    """

    def __init__(self, producer: Callable[..., Any], buffer: FillableBufferLike, batch_size: int, *,
                 replay_ratio: float = 1, source: Iterable | None = None, steps: int | None = None,
                 min_size: int = 0, workers: int = 0, worker_kind: str = "thread", window: int | None = None,
                 rate_limiter: RateLimiter | None = None, timeout: float = 60.0,
                 start_method: str = "spawn", defer_feedback: bool = False, queue_size: int | None = None) -> None:
        window = _renamed("queue_size", queue_size, "window", window)
        if not callable(producer):
            raise TypeError(f"producer must be callable, got {type(producer).__name__}")
        if not isinstance(buffer, FillableBufferLike):  # the methods it calls, not a class (a LockedBuffer, yours)
            raise TypeError(f"buffer must be a ReplayBuffer or another FillableBufferLike (add, sample, feedback, "
                            f"stats, state_dict, load_state_dict, len, capacity), got {type(buffer).__name__}")
        checks.integer("batch_size", batch_size, 1)
        checks.number("replay_ratio", replay_ratio, 0, low_open=True)
        checks.optional_integer("steps", steps, 0)
        if source is None and steps is None:
            raise ValueError("give a source iterable or a number of steps, or the loader would never end")
        if not 0 <= min_size <= buffer.capacity:
            raise ValueError(f"min_size must lie in [0, {buffer.capacity}], got {min_size!r}")
        _check_workers(workers, worker_kind, window, rate_limiter, min_size, timeout, batch_size)
        if workers and is_stateful_producer(producer):
            raise ValueError(f"workers={workers!r} with a stateful producer ({type(producer).__name__} has "
                             "loader_state_dict): its state is checkpointed with the loader, so it runs inline "
                             "(workers=0)")
        self.producer = producer
        self.buffer = buffer
        self.shared = LockedBuffer(buffer)
        self.lock = self.shared.lock  # held around every buffer call; hold it yourself for buffer calls of your own
        self._deferred = DeferredFeedback(self.shared.feedback) if defer_feedback else None
        self.batch_size = int(batch_size)
        self.replay_ratio = float(replay_ratio)
        self.source = source
        self.steps = steps
        self.min_size = min_size
        self.workers = int(workers)
        self.worker_kind = worker_kind
        self.window = 2 * self.workers if window is None else int(window)
        self.rate_limiter = rate_limiter
        self.timeout = float(timeout)
        self.start_method = start_method
        self.step = 0  # producer calls in the current pass (with workers: results added to the buffer)
        self.consumed = 0  # source items consumed in the current pass
        self._credit = 0.0
        self._skip = 0  # source items to fast-forward over after load_state_dict
        self._resuming = False  # the next pass continues a restored position instead of starting afresh
        self._pace: PacedPass | None = None  # the pacing of a running background pass
        self._source_states: dict[int, Any] = {}  # a stateful source's state before each in-flight item
        self._pass_index0 = 0  # self.step when the background pass started
        self._meter = new_meter()

    def __len__(self) -> int:
        """Number of producer calls per pass (batches per pass when replay_ratio == 1)."""
        if self.steps is not None:
            return self.steps
        return len(self.source)  # type: ignore[arg-type]

    def _items(self) -> Iterator[Any]:
        """The items of the rest of this pass (None per step without a source)."""
        left = None if self.steps is None else max(self.steps - self.step, 0)
        if self.source is None:
            return itertools.repeat(None, left)
        iterator = iter(self.source)
        if self._skip and not hasattr(self.source, "load_state_dict"):
            for _ in range(self._skip):  # a plain iterable cannot seek: replay it up to the saved position
                next(iterator)
        self._skip = 0
        return iterator if left is None else itertools.islice(iterator, left)

    def _start_pass(self) -> None:
        if not self._resuming:
            self.step, self.consumed, self._skip = 0, 0, 0
        self._resuming = False
        if self._meter["start"] is None:
            self._meter["start"] = time.perf_counter()

    def __iter__(self) -> Iterator[ReplayBatch]:
        """One pass. Like a torch DataLoader, a new iter() starts a new pass, unless a state was just loaded."""
        resumed = self._resuming
        self._start_pass()  # runs at the first next(), as before workers existed
        yield from self._iter_background() if self.workers else self._iter_inline(resumed)

    def _iter_inline(self, resumed: bool = False) -> Iterator[ReplayBatch]:
        meter, limiter = self._meter, self.rate_limiter
        if limiter is not None:
            limiter.reopen()
        items = self._items()  # the pass's source iteration starts (a restored source resumes) with the pass
        if resumed:  # batches the last produced batch bought but the saved loop had not taken yet come first,
            yield from self._owed(np.empty(0, np.int64), None)  # as they would have (aux, fresh: not in a state)
        for item in items:
            began = time.perf_counter()
            if self.source is not None:
                self.consumed += 1
            produced = self.producer() if self.source is None else self.producer(item)
            examples, aux = _split(produced)
            if limiter is not None:
                limiter.check_progress(_batch_length(examples), self.batch_size)
            self.flush_feedback()  # the producer's device work is queued: now wait for the last step's feedback
            with self.lock:
                fresh_ids = self.buffer.add(examples)
                size = len(self.buffer)
            self.step += 1
            meter["inserted"] += len(fresh_ids)
            meter["learner_wait"] += time.perf_counter() - began
            if limiter is not None:
                limiter.record_insert(len(fresh_ids))
            elif size < self.min_size:
                continue
            else:
                self._credit += self.replay_ratio
            yield from self._owed(fresh_ids, aux)
        self.step = 0
        self.consumed = 0

    def _owed(self, fresh_ids: np.ndarray, aux: Any) -> Iterator[ReplayBatch]:
        """The batches bought so far and not yet yielded: as many as the limiter admits (it never has to wait
        here), else one per whole unit of credit."""
        limiter = self.rate_limiter
        while limiter.can_sample(self.batch_size) if limiter is not None else self._credit >= 1.0 - 1e-12:
            if limiter is not None:
                limiter.acquire_sample(self.batch_size)
            else:
                self._credit -= 1.0
            self._meter["sampled"] += self.batch_size
            yield self._sample(fresh_ids, aux, self.step)

    def _sample(self, fresh_ids: np.ndarray, aux: Any, step: int) -> ReplayBatch:
        with self.lock:
            sample = self.buffer.sample(self.batch_size)
        return replay_batch(sample, fresh_ids, aux=aux, produced=step)

    # ------------------------------------------------------------------ background producers
    def _iter_background(self) -> Iterator[ReplayBatch]:
        """Producers in workers, results added in item order by the feed's thread, sampling here, paced by the
        one background pass (`pacing.PacedPass`, which `RayReplayLoader` runs too)."""
        pacing = PacedPass(self.rate_limiter, replay_ratio=self.replay_ratio, timeout=self.timeout,
                           credit=self._credit, window=self.window, batch_size=self.batch_size, lock=self.lock,
                           meter=self._meter)
        self._pace, self._pass_index0, self._latest = pacing, self.step, (np.empty(0, np.int64), None)
        consumed0 = self.consumed

        def consume(index: int, produced: Any) -> None:
            examples, aux = _split(produced)

            def add() -> bool:
                self._latest = (self.buffer.add(examples), aux)
                self.step += 1
                if self.source is not None:
                    self.consumed = consumed0 + index + 1
                self._source_states.pop(index, None)
                return len(self.buffer) >= self.min_size

            pacing.insert(_batch_length(examples), add)

        def remember_source(index: int) -> None:
            if self.source is not None and hasattr(self.source, "state_dict"):
                with self.lock:
                    self._source_states[index] = self.source.state_dict()

        def draw() -> ReplayBatch:
            with self.lock:
                fresh_ids, aux = self._latest
                return self._sample(fresh_ids, aux, self.step)

        pool = ProducerPool(self.producer, self.workers, self.worker_kind, use_item=self.source is not None,
                            start_method=self.start_method)
        try:
            yield from pacing.run(pool, self._items(), consume, draw, on_dispatch=remember_source,
                                  before_sample=self.flush_feedback)
        finally:
            if pacing.credit is not None:
                self._credit = pacing.credit
            self._pace = None
            self._source_states.clear()
        if pacing.finished:
            self.step = 0
            self.consumed = 0

    def feedback(self, batch: Sample, **signals: Any) -> int:
        """Route per-example signals (loss=, grad_norm=, ...) for a yielded batch to the buffer's strategy; returns
        how many weights changed (0 with ``defer_feedback``: they change at the next `flush_feedback`)."""
        if self._deferred is not None:
            self._deferred.push(batch.ids, **signals)
            return 0
        return self.shared.feedback(batch.ids, **signals)

    def flush_feedback(self) -> int:
        """Apply deferred feedback now (the loader does it before it next adds or samples, and before
        `state_dict`); returns how many weights changed."""
        return 0 if self._deferred is None or not len(self._deferred) else self._deferred.flush()

    def stats(self) -> dict[str, float]:
        """Throughput and waiting since the first pass began: inserted and sampled examples per second, seconds
        the training loop waited for data (without workers: the time it spent producing) and seconds producers
        waited (idle workers while the queue was full, plus rate-limiter waits). Sums over passes."""
        running = self._pace.producer_wait if self._pace is not None else 0.0
        return meter_report(self._meter, running)  # a running pass's waits so far count too

    def state_dict(self) -> dict:
        """Buffer, position and pacing. With workers running, a consistent snapshot: it holds the lock, so no
        produced batch enters the buffer meanwhile, and it records the position of the last batch added
        (batches still in flight are produced again after a resume)."""
        self.flush_feedback()  # feedback already given belongs to the state
        with self.lock:
            credit = self._credit if self._pace is None or self._pace.credit is None else self._pace.credit
            state = {"step": self.step, "consumed": self.consumed, "credit": credit,
                     "buffer": self.buffer.state_dict()}
            if self.rate_limiter is not None:
                state["rate_limiter"] = self.rate_limiter.state_dict()
            if is_stateful_producer(self.producer):
                state["producer"] = self.producer.loader_state_dict()
            if self.source is not None and hasattr(self.source, "state_dict"):
                next_index = self.step - self._pass_index0
                if self._pace is not None and next_index in self._source_states:
                    state["source"] = self._source_states[next_index]
                else:
                    state["source"] = self.source.state_dict()
        return state

    def load_state_dict(self, state: Mapping) -> None:
        """Restore the buffer and the position; a source without state_dict is fast-forwarded on next iter.

        All or nothing: the loader's own values are checked first, and if the buffer refuses its state, a source
        and a stateful producer that were already restored get their previous states back. A stateful producer
        needs its state in ``state`` and a plain one must find none there (it would be lost). Feedback still
        deferred is dropped: it was for the replaced buffer's examples."""
        if self._pace is not None:
            raise RuntimeError("load_state_dict while a background pass runs; finish or break out of it first")
        step, credit, limiter, buffer_state = checked_position(state, self.rate_limiter)
        consumed = integer(state, "consumed", "loader state", 0)
        stateful = is_stateful_producer(self.producer)
        if stateful != ("producer" in state):
            raise InvalidState(f"loader state: the producer {type(self.producer).__name__} "
                             + ("keeps state (loader_state_dict) but the state has none for it" if stateful else
                                "keeps no state (no load_loader_state_dict) but the state holds a producer state"))
        previous_producer = self.producer.loader_state_dict() if stateful else None
        if stateful:
            self.producer.load_loader_state_dict(state["producer"])  # checks its state: all or nothing
        restores_source = "source" in state and hasattr(self.source, "load_state_dict")
        previous_source = None
        try:
            if restores_source:
                previous_source = self.source.state_dict() if hasattr(self.source, "state_dict") else None
                self.source.load_state_dict(state["source"])
            self.buffer.load_state_dict(buffer_state)
        except Exception:
            if previous_source is not None:
                self.source.load_state_dict(previous_source)
            if previous_producer is not None:
                self.producer.load_loader_state_dict(previous_producer)
            raise
        self.step, self.consumed, self._credit = step, consumed, credit
        if self._deferred is not None:  # feedback still queued was for the replaced buffer's examples
            self._deferred.discard()
        if limiter is not None:
            self.rate_limiter.commit_state(limiter)
        if not restores_source:
            self._skip = self.consumed
        self._resuming = True


def replay_batch(sample: Sample, fresh_ids: np.ndarray, *, aux: Any = None, produced: int = 0) -> ReplayBatch:
    """A sample as a `ReplayBatch` (this loader's and `RayReplayLoader`'s): ``fresh`` marks, by id, the examples
    of the latest produced batch added to the buffer (``fresh_ids``, the ids its add returned)."""
    return ReplayBatch(sample.data, sample.ids, sample.probabilities, sample.weights, sample.ages, aux=aux,
                       fresh=np.isin(sample.ids, fresh_ids), produced=produced)


def new_meter() -> dict:
    """The counts behind a loader's ``stats()`` (this loader's and `replayloader.ray.RayReplayLoader`'s)."""
    return {"start": None, "inserted": 0, "sampled": 0, "learner_wait": 0.0, "producer_wait": 0.0}


def meter_report(meter: Mapping, running_producer_wait: float = 0.0) -> dict[str, float]:
    """``stats()`` from a meter: counts, rates since the first pass began, and waits (plus a running pass's
    producer waits not yet added to the meter)."""
    elapsed = time.perf_counter() - meter["start"] if meter["start"] is not None else 0.0
    rate = (lambda count: count / elapsed if elapsed > 0 else 0.0)
    return {"elapsed_s": elapsed, "inserted": meter["inserted"], "sampled": meter["sampled"],
            "inserts_per_s": rate(meter["inserted"]), "samples_per_s": rate(meter["sampled"]),
            "learner_wait_s": meter["learner_wait"], "producer_wait_s": meter["producer_wait"] + running_producer_wait}


def checked_position(state: Mapping, rate_limiter: RateLimiter | None) -> tuple[int, float, Any, Any]:
    """A loader checkpoint's step, pacing credit, rate-limiter state (checked, not applied; None without a
    limiter) and buffer state, read and checked before anything is restored (`InvalidState` names the field)."""
    where = "loader state"
    step = integer(state, "step", where, 0)
    credit = number(state, "credit", where)
    limiter = None
    if rate_limiter is not None and "rate_limiter" in state:
        limiter = rate_limiter.checked_state(state["rate_limiter"])
    return step, credit, limiter, field(state, "buffer", where)


def is_stateful_producer(producer: Any) -> bool:
    """Whether the loader checkpoints ``producer``'s state (see the module docstring). Names of their own, not
    ``state_dict``: a torch module used as a producer must not put its weights into the loader's state."""
    return callable(getattr(producer, "loader_state_dict", None)) and \
        callable(getattr(producer, "load_loader_state_dict", None))


def _split(produced: Any) -> tuple[Mapping, Any]:
    examples, aux = produced if isinstance(produced, tuple) else (produced, None)
    if not isinstance(examples, Mapping):
        raise TypeError("producer must return a mapping of examples or a tuple (examples, aux), got "
                        f"{type(produced).__name__}")
    return examples, aux


def _batch_length(examples: Mapping) -> int:
    if not examples:
        raise ValueError("producer returned an empty mapping; it must hold at least one field")
    return int(len(next(iter(examples.values()))))


def _renamed(old: str, old_value: Any, new: str, new_value: Any) -> Any:
    """A keyword renamed in 1.0: the old spelling still works for one release, with a DeprecationWarning."""
    if old_value is None:
        return new_value
    if new_value is not None:
        raise ValueError(f"give {new}= only ({old}= is its old name), got both")
    warnings.warn(f"ReplayDataLoader({old}=...) is now {new}=...; the old name will be removed in the next release",
                  DeprecationWarning, stacklevel=3)
    return old_value


def _check_workers(workers: Any, kind: str, window: Any, rate_limiter: Any, min_size: int,
                   timeout: Any, batch_size: int) -> None:
    checks.integer("workers", workers, 0)
    if kind not in ("thread", "process"):
        raise ValueError(f"worker_kind must be 'thread' or 'process', got {kind!r}")
    checks.optional_integer("window", window, 1)
    if rate_limiter is not None:
        if not isinstance(rate_limiter, RateLimiter):
            raise TypeError(f"rate_limiter must be a RateLimiter, got {type(rate_limiter).__name__}")
        rate_limiter.check_progress(1, batch_size)  # the part known now; the produced batch size is checked on arrival
        if min_size:
            raise ValueError(f"min_size={min_size!r} with a rate_limiter: set the limiter's min_size instead")
    checks.number("timeout", timeout, 0, low_open=True)

"""One background pass, paced: producers feed the buffer through an `OrderedFeed` while the learner samples, and
one `RateLimiter` holds the two sides together. `ReplayDataLoader` (thread or process workers) and
`replayloader.ray.RayReplayLoader` (producer actors) run the same pass; only how a produced batch is staged,
added and sampled is theirs.

Counting: a user's rate limiter counts examples (inserted examples, sampled examples); without one, a
`credit_limiter` counts produced batches and yielded batches (``replay_ratio`` per produced batch, the same
count of batches as without workers), and what credit a pass leaves over carries into the next.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from .rate_limiter import LimiterConfigError, RateLimiter, RateLimitTimeout, credit_limiter
from .workers import OrderedFeed, WorkerError


class PacedPass:
    """The pacing of one pass: the limiter (the user's, or a credit limiter), the insert rule and the sampling loop.

    Args:
        rate_limiter: the user's `RateLimiter` (counts examples), or None for a credit limiter over batches.
        replay_ratio, timeout, credit, window: the credit limiter's settings (see `credit_limiter`); ``credit``
            is what the previous pass left.
        batch_size: examples per sampled batch.
        lock: held around every insert's buffer call together with its count, so a checkpoint taken under it
            never sees one without the other.
        meter: the loader's `new_meter` counts (inserted, sampled, learner and producer waits).
    """

    def __init__(self, rate_limiter: RateLimiter | None, *, replay_ratio: float, timeout: float, credit: float,
                 window: int, batch_size: int, lock: Any, meter: dict) -> None:
        self.per_example = rate_limiter is not None
        self.limiter = rate_limiter or credit_limiter(replay_ratio, timeout, credit, ahead=window)
        self.limiter.reopen()
        self.insert_wait0 = self.limiter.insert_wait  # a user's limiter keeps counting across passes
        self.window, self.batch_size, self.lock, self.meter = window, batch_size, lock, meter
        self.finished = False  # the producers ran out and every admitted batch was yielded

    @property
    def credit(self) -> float | None:
        """The credit of a credit limiter now (what the next pass starts from), None with a user's limiter."""
        return None if self.per_example else self.limiter.diff

    @property
    def producer_wait(self) -> float:
        """Seconds producers have waited for the limiter in this pass so far."""
        return self.limiter.insert_wait - self.insert_wait0

    def insert(self, n: int, add: Callable[[], bool]) -> None:
        """Admit a produced batch of ``n`` examples, then ``add()`` it under the lock and count it there. ``add``
        returns whether the insert earns credit (a loader's ``min_size`` not yet reached: False); a user's
        limiter counts every example."""
        if self.per_example:
            self.limiter.check_progress(n, self.batch_size)
        self.limiter.wait_insert(n if self.per_example else 1)
        with self.lock:
            earns = add()
            self.meter["inserted"] += n
            if self.per_example:
                self.limiter.record_insert(n)
            elif earns:
                self.limiter.record_insert(1)

    def run(self, pool: Any, items: Iterator[Any], consume: Callable[[int, Any], None], draw: Callable[[], Any], *,
            on_dispatch: Callable[[int], None] | None = None,
            before_sample: Callable[[], Any] | None = None) -> Iterator[Any]:
        """Feed ``items`` through ``pool`` to ``consume(index, produced)`` (which calls `insert`) in item order, and
        yield ``draw()`` whenever the limiter admits a sample, until the producers are done.

        ``before_sample`` runs before each wait for a sample (deferred feedback lands there). An error in a
        producer or in ``consume`` is raised here once the pass is shut down: as it is if it is a `WorkerError`
        (a dead producer) or a `LimiterConfigError` (a setting of the caller's), else as a `WorkerError` holding
        its traceback. A sample that waits past the limiter's timeout raises `RateLimitTimeout`, without waiting
        for a producer call still running."""
        limiter, meter = self.limiter, self.meter
        feed = OrderedFeed(pool, items, consume, self.window, on_finish=limiter.finish_inserts,
                           on_dispatch=on_dispatch, passthrough=(LimiterConfigError, WorkerError)).start()
        timed_out = False  # then a producer call still running is not waited for: timeout bounds the wait
        try:
            while True:
                if before_sample is not None:
                    before_sample()
                began = time.perf_counter()
                admitted = limiter.acquire_sample(self.batch_size if self.per_example else 1)
                meter["learner_wait"] += time.perf_counter() - began
                if not admitted:  # producers are done, or failed (batches added before a failure still count)
                    self.finished = True
                    break
                batch = draw()
                meter["sampled"] += self.batch_size
                yield batch
        except RateLimitTimeout:
            timed_out = True
            raise
        finally:
            feed.halt()
            limiter.close()  # wakes a feed blocked on the limiter
            feed.stop(wait_for_producers=not timed_out)
            meter["producer_wait"] += feed.producer_wait + self.producer_wait
        if feed.error is not None:
            self.finished = False
            raise feed.error

"""A samples-per-insert rate limiter with Reverb's semantics (`SampleToInsertRatio` + `MinSize`).

Producers and the learner run at their own speeds; the limiter keeps them in step. It counts inserted and
sampled *examples* and holds ``diff = inserts * samples_per_insert - samples`` inside
``[offset - error_buffer, offset + error_buffer]`` with ``offset = samples_per_insert * min_size``:

- a sample of k is admitted once ``inserts >= min_size`` and ``diff - k >= offset - error_buffer``;
- an insert of n is admitted while the inserts stay within ``min_size``, or when
  ``diff + n * samples_per_insert <= offset + error_buffer``.

The side that runs ahead blocks. A wait longer than ``timeout`` seconds raises `RateLimitTimeout` naming the
side and the counters, so a stalled pipeline is an error, never a silent hang. Both sides can always make
progress when ``2 * error_buffer >= n * samples_per_insert + k`` (n examples per insert, k per sample);
`check_progress` says so before the first wait.

Thread-safe (one condition variable). `acquire_insert` / `acquire_sample` count on admission (the caller makes
the buffer call next); a single inserter that must count an insert together with its buffer call, under the
buffer's lock, uses `wait_insert` then `record_insert` (so a snapshot never sees one without the other).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..state.checks import integer
from .. import _checks as checks


class RateLimitTimeout(TimeoutError):
    """A producer or the learner waited longer than the limiter's timeout."""


class LimiterClosed(RuntimeError):
    """The limiter was closed (loader shut down) while a caller waited."""


class LimiterConfigError(ValueError):
    """The limiter's settings would let inserts and samples of the given sizes block each other forever."""




class RateLimiter:
    """Keep sampled examples per inserted example near ``samples_per_insert``.

    Args:
        samples_per_insert: target examples sampled per example inserted (> 0).
        min_size: examples inserted before the first sample is admitted (>= 1).
        error_buffer: tolerance on ``inserts * samples_per_insert - samples`` around its offset (> 0).
        timeout: seconds either side may wait before `RateLimitTimeout` (> 0).
    """

    def __init__(self, samples_per_insert: float, *, min_size: int = 1, error_buffer: float = 100.0,
                 timeout: float = 60.0) -> None:
        self.samples_per_insert = checks.number("samples_per_insert", samples_per_insert, 0.0, low_open=True)
        self.min_size = checks.integer("min_size", min_size, 1, why="nothing can be sampled from an empty buffer")
        self.error_buffer = checks.number("error_buffer", error_buffer, 0.0, low_open=True)
        self.timeout = checks.number("timeout", timeout, 0.0, low_open=True)
        self.insert_timeout: float | None = self.timeout  # None: producers wait as long as the learner needs
        self.unit = ("example", "examples")  # what inserts and samples count (singular, plural), for messages
        offset = self.samples_per_insert * self.min_size
        self.min_diff = offset - self.error_buffer
        self.max_diff = offset + self.error_buffer
        self._cond = threading.Condition()
        self._closed = False
        self._inserts_done = False  # producers are exhausted: a refused sample will never be admitted
        self.inserts = 0
        self.samples = 0
        self.insert_wait = 0.0  # seconds producers waited
        self.sample_wait = 0.0  # seconds the learner waited
        self.diff_range = [np.inf, -np.inf]  # extremes of diff seen once min_size was reached

    # ------------------------------------------------------------------ rules
    @property
    def diff(self) -> float:
        return self.inserts * self.samples_per_insert - self.samples

    def can_insert(self, n: int) -> bool:
        return (self.inserts + n <= self.min_size
                or (self.inserts + n) * self.samples_per_insert - self.samples <= self.max_diff)

    def can_sample(self, k: int) -> bool:
        return self.inserts >= self.min_size and self.diff - k >= self.min_diff

    def check_progress(self, n: int, k: int) -> None:
        """Raise `LimiterConfigError` if inserts of n and samples of k could block each other forever."""
        need = n * self.samples_per_insert + k
        if 2 * self.error_buffer < need:
            raise LimiterConfigError(
                f"error_buffer={self.error_buffer:g} is too small for inserts of {n} and samples of {k} at "
                f"samples_per_insert={self.samples_per_insert:g}: both sides could block forever; use "
                f"error_buffer >= {need / 2:g}")

    # ------------------------------------------------------------------ waiting
    def acquire_insert(self, n: int) -> None:
        """Block until n inserted examples are admitted, then count them."""
        self._acquire("insert", n, lambda: self.can_insert(n))

    def wait_insert(self, n: int) -> None:
        """Block until an insert of n would be admitted, without counting it. For a single inserter that must
        count the insert together with the buffer call (`record_insert`), e.g. under the buffer's lock."""
        self._acquire("insert", n, lambda: self.can_insert(n), count=False)

    def record_insert(self, n: int) -> None:
        """Count n inserted examples that `wait_insert` admitted."""
        with self._cond:
            self.inserts += n
            self._record()
            self._cond.notify_all()

    def acquire_sample(self, k: int) -> bool:
        """Block until a sample of k is admitted and count it; False once producers are done and it never
        will be."""
        return self._acquire("sample", k, lambda: self.can_sample(k) or self._inserts_done)

    def _acquire(self, side: str, amount: int, ready, count: bool = True) -> bool:
        with self._cond:
            start = time.perf_counter()
            limit = self.timeout if side == "sample" else self.insert_timeout
            deadline = start + (np.inf if limit is None else limit)
            while True:
                if self._closed:
                    raise LimiterClosed("the rate limiter was closed (the loader shut down)")
                if ready():
                    break
                left = deadline - time.perf_counter()
                if left <= 0:
                    raise RateLimitTimeout(
                        f"{'a producer' if side == 'insert' else 'the learner'} waited {limit:g} s to "
                        f"{side} {amount} {self.unit[amount != 1]}: inserts={self.inserts:g}, "
                        f"samples={self.samples:g} ({self.unit[1]}), diff={self.diff:g} must stay in "
                        f"[{self.min_diff:g}, {self.max_diff:g}] (min_size={self.min_size}); the other side is "
                        "stalled or too slow (raise timeout)")
                self._cond.wait(min(left, 3600.0))
            waited = time.perf_counter() - start
            if side == "insert":
                self.insert_wait += waited
                self.inserts += amount if count else 0
            else:
                self.sample_wait += waited
                if not self.can_sample(amount):  # producers finished and the sample is refused: no more data
                    return False
                self.samples += amount
            self._record()
            self._cond.notify_all()
            return True

    def _record(self) -> None:
        if self.inserts >= self.min_size:
            diff = self.diff
            self.diff_range[0] = min(self.diff_range[0], diff)
            self.diff_range[1] = max(self.diff_range[1], diff)

    # ------------------------------------------------------------------ lifecycle
    def finish_inserts(self) -> None:
        """Producers are exhausted: a sample that is refused now returns False instead of waiting."""
        with self._cond:
            self._inserts_done = True
            self._cond.notify_all()

    def close(self) -> None:
        """Wake every waiter with `LimiterClosed` (used at shutdown)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def reopen(self) -> None:
        """Start a new pass: waiters block again and producers count as running."""
        with self._cond:
            self._closed = False
            self._inserts_done = False

    def stats(self) -> dict[str, float]:
        with self._cond:
            return {"inserts": self.inserts, "samples": self.samples,
                    "samples_per_insert": self.samples / self.inserts if self.inserts else 0.0,
                    "insert_wait_s": self.insert_wait, "sample_wait_s": self.sample_wait,
                    "diff_min": float(self.diff_range[0]), "diff_max": float(self.diff_range[1])}

    def state_dict(self) -> dict:
        with self._cond:
            return {"inserts": self.inserts, "samples": self.samples}

    def load_state_dict(self, state: Mapping) -> None:
        self.commit_state(self.checked_state(state))

    @staticmethod
    def checked_state(state: Any) -> tuple[int, int]:
        """The counts a `state_dict` holds, checked (raises `InvalidState` before anything changes)."""
        return (integer(state, "inserts", "rate limiter state", 0), integer(state, "samples", "rate limiter state", 0))

    def commit_state(self, counts: tuple[int, int]) -> None:
        with self._cond:
            self.inserts, self.samples = counts
            self.diff_range = [np.inf, -np.inf]
            self._record()


def credit_limiter(samples_per_insert: float, timeout: float, credit: float = 0.0,
                   ahead: int = 2) -> RateLimiter:
    """The loader's pacing without a user limiter, in produced and yielded batches: each insert adds
    ``samples_per_insert`` credit (the loader's ``replay_ratio``), a yielded batch takes one, and the learner
    waits (up to ``timeout``) for credit. Producers may run ``ahead`` produced batches beyond what the learner
    has taken, then wait for it without a time limit (a slow training step is not a stall). ``credit`` carries
    over what an earlier pass left."""
    limiter = RateLimiter(samples_per_insert, min_size=1, error_buffer=1.0, timeout=timeout)
    # no minimum of its own (credit only comes from adds); a sample needs a whole unit of credit
    limiter.min_size, limiter.min_diff = 0, -1e-9
    limiter.max_diff = ahead * samples_per_insert + 1.0  # > 1 - samples_per_insert: both sides never block at once
    limiter.insert_timeout = None
    limiter.unit = ("batch", "batches")
    limiter.samples = -credit
    return limiter

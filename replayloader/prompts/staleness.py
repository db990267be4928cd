"""Which records halve between two feedback calls of `PromptSampler` (``stale_after``), read from a calendar.

Why a calendar and not a min tree of each record's next halving: a record measured at step m halves at
m + s, m + 2s, ..., m + 30s (s = ``stale_after``; the 30th halving forgets it) whatever happens to it in between,
unless it is measured again or retired. So the records due in (since, now] are found from the steps they were
measured at: the calendar keeps each feedback call's prompts with their step, in step order, and a call reads
only the 30 ranges of steps that fall due (one binary search each). A tree costs a walk per record per halving,
30 per feedback group; the calendar costs a read.

The calendar is derived state: rebuilt from the records (`reset`) whenever the trees are, so checkpoints do
not hold it.
"""
from __future__ import annotations

import numpy as np

from ..kernels.prompts import MAX_HALVINGS, compact_calendar, due_between


class DecayCalendar:
    """Each fed prompt with the policy step it was measured at, in step order (entries go stale when the prompt
    is measured again or retired, and are dropped when the calendar fills)."""

    def __init__(self, stale_after: int) -> None:
        self.stale_after = stale_after
        self.prompts = np.empty(64, np.int64)
        self.steps = np.empty(64, np.int64)
        self.size = 0

    def reset(self, measured_at: np.ndarray, retired: np.ndarray, clock: int) -> None:
        """The entries of every record that can still halve after ``clock``."""
        live = np.flatnonzero((measured_at >= 0) & ~retired
                              & (measured_at + MAX_HALVINGS * self.stale_after > clock))
        order = live[np.argsort(measured_at[live], kind="stable")]
        self.size = 0
        self._make_room(len(order))
        self.prompts[:len(order)] = order
        self.steps[:len(order)] = measured_at[order]
        self.size = len(order)

    def due(self, since: int, now: int, measured_at: np.ndarray, retired: np.ndarray) -> np.ndarray:
        """The prompts whose records halve after step ``since`` and at or before ``now`` (repeats possible)."""
        if now <= since:
            return self.prompts[:0]
        return due_between(self.prompts, self.steps, self.size, since, now, self.stale_after, measured_at, retired)

    def add(self, prompts: np.ndarray, step: int, measured_at: np.ndarray, retired: np.ndarray) -> None:
        """Enter ``prompts``, measured at ``step`` (no earlier than any entry), making room first: entries that
        can no longer come due are dropped, and the arrays double only when most entries are live."""
        if self.size + len(prompts) > len(self.prompts):
            self.size = compact_calendar(self.prompts, self.steps, self.size, step, self.stale_after, measured_at,
                                         retired)
            self._make_room(max(len(prompts), self.size))
        self.prompts[self.size:self.size + len(prompts)] = prompts
        self.steps[self.size:self.size + len(prompts)] = step
        self.size += len(prompts)

    def _make_room(self, extra: int) -> None:
        """Grow the arrays (doubling) until ``extra`` more entries fit."""
        capacity = len(self.prompts)
        while self.size + extra > capacity:
            capacity *= 2
        if capacity > len(self.prompts):
            for name in ("prompts", "steps"):
                grown = np.empty(capacity, np.int64)
                grown[:self.size] = getattr(self, name)[:self.size]
                setattr(self, name, grown)

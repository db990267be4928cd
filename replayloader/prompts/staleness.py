"""Which records halve between two feedback calls of `PromptSampler` (``stale_after``), read from a calendar.

Why a calendar and not a min tree of each record's next halving: a record measured at step m halves at
m + s, m + 2s, ..., m + 30s (s = ``stale_after``; the 30th halving forgets it) whatever happens to it in between,
unless it is measured again or retired. So the records due in (since, now] are found from the steps they were
measured at: the calendar keeps each feedback call's prompts with their step, in step order, and a call reads
only the 30 ranges of steps that fall due. A tree costs a walk per record per halving; the calendar costs a
sequential read (`replayloader.kernels.calendar`).

The calendar is derived state: rebuilt from the records (`reset`) whenever the trees are, so checkpoints do
not hold it.
"""
from __future__ import annotations

import numpy as np

from ..kernels import calendar as kernels
from ..kernels.prompts import MAX_HALVINGS


class DecayCalendar:
    """Each fed prompt with the policy step it was measured at, what its leaves are computed from and where they
    are, in step order (`kernels.calendar`: an entry goes dead when its prompt is measured again or retired;
    dead and spent entries are dropped when the arrays fill)."""

    def __init__(self, stale_after: int, bucket_of: np.ndarray, position: np.ndarray) -> None:
        self.stale_after = stale_after
        self.bucket_of, self.position = bucket_of, position
        self.entry_of = np.full(len(bucket_of), -1, np.int64)  # each prompt's live entry (-1: none)
        self.size = self.distinct = 0
        self._allocate(64)

    def _allocate(self, capacity: int) -> None:
        """Arrays of ``capacity`` entries (and as many distinct steps) holding the current ones."""
        for name in kernels.COLUMNS:
            grown = np.empty(capacity, np.int64 if name not in ("groups", "signals") else np.float64)
            grown[:self.size] = getattr(self, name)[:self.size] if self.size else grown[:0]
            setattr(self, name, grown)
        index = np.empty((capacity, 2), np.int64)  # (step, position of its first entry)
        index[:self.distinct] = self.index[:self.distinct] if self.distinct else index[:0]
        self.index = index

    def arrays(self) -> tuple:
        """The entries as `kernels.prompts.refresh_fed` reads them, one array per field (`kernels.calendar`)."""
        return tuple(getattr(self, name) for name in kernels.COLUMNS)

    def reset(self, measured_at: np.ndarray, retired: np.ndarray, groups: np.ndarray, signal_sum: np.ndarray,
              clock: int) -> None:
        """The entries of every record that can still halve after ``clock``, in step order."""
        live = np.flatnonzero((measured_at >= 0) & ~retired
                              & (measured_at + MAX_HALVINGS * self.stale_after > clock))
        order = live[np.argsort(measured_at[live], kind="stable")]
        self.size = self.distinct = 0
        self.entry_of[:] = -1
        if len(order) > len(self.entries):
            self._allocate(2 * len(order))
        self.size, self.distinct = kernels.add(*self.arrays(), 0, self.index, 0, self.entry_of, order, 0,
                                               retired, self.bucket_of, self.position, groups, signal_sum)
        self.steps[:self.size] = measured_at[order]  # `add` stamps one step; each record has its own
        self.distinct = kernels.index_steps(self.steps, self.size, self.index)

    def due(self, since: int, now: int) -> np.ndarray:
        """The positions of the entries whose records halve after step ``since`` and at or before ``now``."""
        return kernels.due_between(self.entries, self.steps, self.size, self.index, self.distinct, since, now,
                                   self.stale_after)

    def add(self, prompts: np.ndarray, step: int, retired: np.ndarray, groups: np.ndarray, signal_sum: np.ndarray,
            *, since: int) -> None:
        """Enter ``prompts`` (distinct), measured at ``step`` (no earlier than any entry), making room first:
        entries that can no longer come due after step ``since`` (the last step whose halvings were read) are
        dropped, and the arrays double when most entries are live."""
        if self.size + len(prompts) > len(self.entries):
            self.size, self.distinct = kernels.compact(*self.arrays(), self.size, self.index, self.entry_of, since,
                                                       self.stale_after)
            capacity = len(self.entries)
            while self.size + max(len(prompts), self.size) > capacity:
                capacity *= 2
            if capacity > len(self.entries):
                self._allocate(capacity)
        self.size, self.distinct = kernels.add(*self.arrays(), self.size, self.index, self.distinct, self.entry_of,
                                               prompts, step, retired, self.bucket_of, self.position, groups,
                                               signal_sum)

"""The base of the library's DataLoader batch samplers: the records of the batches drawn, kept until the training
loop receives them (`RecordedBatchSampler`).

Why a queue at all: a DataLoader hands the loop collated examples, not the sampler's record of the batch (its
indices, importance weights, sources, epoch ...), and it draws ahead of the loop (prefetching, workers). It does
return batches in the order its batch sampler yielded them (``in_order=True``, its default), so the batch sampler
keeps the record of every index list it yields in a first-in-first-out queue, and the loop pops the one of the
batch it has just received with ``next_batch_info()``, once per batch.

Why it is part of the checkpoint: the batches drawn and not yet received are drawn, the sampler's generator is
past them. A checkpoint keeps their records (``pending``), and after loading them the next ``iter()`` yields
them first, then draws on, so a resumed run sees the batches the uninterrupted one would have seen.

One queue, two parts: ``_handed_out`` (yielded to the DataLoader, not received by the loop yet, oldest first) and
``_waiting`` (drawn, to be yielded first by the next ``iter()``: loaded from a checkpoint, or planned ahead). The
samplers built on it: `PrioritizedBatchSampler` (and `CandidateBatchSampler`, `PooledCandidateBatchSampler`)
and `MixtureBatchSampler`.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from torch.utils.data import Sampler

Record = TypeVar("Record")


class RecordedBatchSampler(Sampler[list[int]], Generic[Record]):
    """A DataLoader ``batch_sampler`` that keeps the record of each batch it yields until the loop pops it with
    `next_batch_info` (see the module doc). A subclass draws with `_next_drawn` and yields through `_hand_out`;
    `_info` turns a queued record into what the loop gets (e.g. this rank's slice of a global batch)."""

    def __init__(self) -> None:
        self._handed_out: deque[Record] = deque()  # yielded, not received by the loop yet
        self._waiting: deque[Record] = deque()  # drawn, yielded first by the next iter()

    def _restart(self, *, keep_handed: bool = False) -> None:
        """A new ``iter()``: what the previous iterator yielded and the loop never received is dropped (the
        DataLoader's prefetch of an iterator it let go), or, with ``keep_handed``, yielded again first."""
        if keep_handed:
            self._waiting.extendleft(reversed(self._handed_out))
        self._handed_out.clear()

    def _next_drawn(self, draw: Callable[[], Record]) -> Record:
        """The next record to yield: one drawn before (waiting), else a fresh ``draw()``."""
        return self._waiting.popleft() if self._waiting else draw()

    def _hand_out(self, record: Record) -> Record:
        """Queue ``record``: its batch is being yielded to the DataLoader."""
        self._handed_out.append(record)
        return record

    def _pop_received(self, what: str = "next_batch_info()") -> Record:
        """The record of the batch the loop has just received (the oldest handed out)."""
        if not self._handed_out:
            raise RuntimeError(f"no batch is waiting: {what} is called once per batch the DataLoader returned, "
                               f"after it returned it")
        return self._handed_out.popleft()

    def _info(self, record: Record) -> Any:
        """What `next_batch_info` returns for a queued record (the record itself, unless a subclass says)."""
        return record

    def next_batch_info(self) -> Any:
        """The record of the next batch the DataLoader returns, oldest first: call it once per batch received
        (what it has not popped is what a checkpoint replays)."""
        return self._info(self._pop_received())

    def _pending(self) -> list[Record]:
        """Every record drawn and not received by the loop, oldest first: what a checkpoint keeps."""
        return [*self._handed_out, *self._waiting]

    def _load_pending(self, records: Iterable[Record]) -> None:
        """After a checkpoint is loaded: its pending records are yielded first by the next ``iter()``."""
        self._handed_out.clear()
        self._waiting = deque(records)

"""DistributedPrioritizedSampler: one prioritized distribution shared by every rank of a torch.distributed job.

Optional module (torch is imported when a sampler is built or a state file is shared across ranks).

Why every rank holds the whole tree (replication) rather than 1/W of it: the sampler holds 69-80 bytes per
example (N = 10^8 and 10^7, `results/distributed_sampler/distributed_sampler.md`), so up to about 10^8 examples a copy per rank
fits in host memory, and replication needs no message per draw: each rank draws the same global batch from the
same tree with the same RNG, and only the feedback travels.

How the ranks stay bit-identical:

- Construction checks, on every rank, that all ranks built the same sampler (dataset length, options, seed,
  state): a mismatch raises the same ValueError on every rank instead of a silent drift or a hang.
- Each step every rank draws the *global* batch (``sampler.batch_size`` = B, divisible by the world size W)
  and keeps its share: positions rank, rank + W, rank + 2W, ... of the batch (strided, like `DistributedSampler`).
- `feedback` is a collective: each rank's feedback (positions in the global batch, indices, per-example values,
  the step and epoch the batch was drawn in) travels in one fixed-size int64 tensor per rank through one
  ``all_gather`` (a second, wider one only when a rank sends more than its share). Every rank then applies the
  same merged feedback in one fixed order: per global step (oldest first), in the order of the global batch, as
  one `PrioritizedSampler.feedback`, which is exactly what one process training on the whole batch would apply;
  feedback without a step (plain index arrays) follows, in rank order. So 2 ranks x B/2 reproduce 1 process
  x B (indices, probabilities, importance weights; tested over epochs including the warm-up).
- Each `feedback` call also compares every rank's draw count, RNG state and tree mass and raises on every rank if they
  differ (e.g. DataLoaders with different ``num_workers`` / ``prefetch_factor`` on different ranks).

Warm-up remainder: the last batch of a warm-up pass holds N mod B indices; when that is not a multiple of W,
it is padded by repeating its first indices (like `DistributedSampler` with ``drop_last=False``), so every rank
trains the same number of examples; a repeated index's feedback is dropped (its first copy's is applied).

Prefetching: a draw sees the feedback of every `feedback` call that all ranks completed before it. A DataLoader draws
``num_workers x prefetch_factor`` batches ahead (0 with ``num_workers=0``), the same on every rank with the same
settings: batch k then reflects the feedback of batches up to k - 1 - num_workers x prefetch_factor. With
``overlap=True`` an update's gather completes at the next draw, so the draws are the same.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _checks as checks
from .._arrays import to_numpy
from ..strategies.feedback import as_feedback_array, check_values
from ..sampler.prioritized import PrioritizedSampler, SampledBatch
from .group import ProcessGroup
from .state_files import state_digest
from .._moved import renamed

_HEADER = 11  # status, step, epoch, k, keymask, draws, 4 RNG words, tree-mass bits


# ----------------------------------------------------------------------------- one rank's share of a batch
def share_positions(length: int, rank: int, world_size: int) -> np.ndarray:
    """Positions of ``rank``'s share in a global batch of ``length``: rank, rank + W, ... A length that is not a
    multiple of W is padded by wrapping around to the batch's first positions, so every share has
    ceil(length / W) entries."""
    padded = math.ceil(length / world_size) * world_size
    return np.arange(rank, padded, world_size, dtype=np.int64) % length


@dataclass
class RankBatch(SampledBatch):
    """This rank's share of a global batch: `SampledBatch` fields for the share, plus ``positions`` (where its
    entries sit in the global batch) and ``whole`` (the global batch, e.g. to checkpoint it)."""

    positions: np.ndarray | None = None
    whole: SampledBatch | None = None


def check_dataset_size(sampler: PrioritizedSampler, dataset_size: int | None) -> None:
    """A sampler draws indices in [0, num_examples): the dataset it feeds must have exactly that many examples."""
    if dataset_size is not None and dataset_size != sampler.num_examples:
        raise ValueError(f"the sampler covers num_examples={sampler.num_examples} examples but the dataset has "
                         f"{dataset_size}")


def advance_to_epoch(sampler: Any, epoch: int) -> None:
    """``set_epoch`` as frameworks call it at each epoch start (like `DistributedSampler.set_epoch`).

    A prioritized sampler counts its epochs itself (its shuffles and draws follow from its own RNG), so at its own
    epoch this does nothing. A later ``epoch`` (a framework that ended an epoch early, e.g. Lightning's
    ``limit_train_batches``) skips the rest of the sampler's epochs by drawing and discarding their batches, which
    every rank does alike. An earlier one is an error: e.g. a resumed run whose sampler state was not restored.
    """
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < sampler.epoch:
        raise ValueError(f"set_epoch({epoch!r}): the sampler is in epoch {sampler.epoch} and cannot go back "
                         f"(restore its state_dict when resuming)")
    while sampler.epoch < epoch:
        sampler.next_batch()


def described(part: Any) -> str:
    """A part's class and its plain settings (numbers, strings), e.g. ``LinearSchedule(end=1.0, start=0.4, ...)``."""
    plain = {k: v for k, v in sorted(getattr(part, "__dict__", {}).items()) if isinstance(v, (bool, int, float, str))}
    return f"{type(part).__name__}({', '.join(f'{k}={v!r}' for k, v in plain.items())})"


def _fingerprint(sampler: PrioritizedSampler) -> dict:
    """What must be equal on every rank, by name (the state digest covers weights, position and RNG)."""
    beta = described(sampler.beta) if callable(sampler.beta) else sampler.beta
    return {"num_examples": sampler.num_examples, "batch_size": sampler.batch_size, "alpha": sampler.alpha,
            "beta": beta, "sampling": sampler.sampling, "uniform_fraction": sampler.uniform_fraction,
            "floor": sampler.floor, "warmup_epochs": sampler.warmup_epochs,
            "update": described(sampler.update_rule),
            "init": type(sampler.init).__name__, "seed": sampler.seed,
            "features": None if sampler.features is None else list(sampler.features.shape),
            "state": state_digest(sampler.state_dict())}


# ----------------------------------------------------------------------------- the sampler
class DistributedPrioritizedSampler:
    """A `PrioritizedSampler` shared by all ranks of a torch.distributed group: each draws the same global batch
    and keeps its share; `feedback` gathers every rank's feedback and applies it everywhere in one order.

    Build the same `PrioritizedSampler` on every rank (same length, options and seed), its ``batch_size`` the
    global batch, then wrap it (a collective: every rank must construct it). Iterate it, or wrap it in
    `PrioritizedBatchSampler` for a DataLoader, and call `feedback` once per batch on every rank (a collective).

    Args:
        sampler: this rank's `PrioritizedSampler`; its ``batch_size`` (the global batch) must be divisible by the
            world size.
        group: a torch.distributed process group (default: the default group).
        dataset_size: ``len(dataset)`` on this rank, checked (on every rank) to equal ``sampler.num_examples``.
        overlap: run each update's gather in the background, completed at the next draw, so its latency hides
            behind the backward pass when `feedback` comes right after the forward pass (the recipes do this).
            The draws are the same either way; only `sampler` itself lags one update until then (`settle`).
    """

    def __init__(self, sampler: PrioritizedSampler, *, group: Any = None, dataset_size: int | None = None,
                 overlap: bool = False) -> None:
        if not isinstance(sampler, PrioritizedSampler):
            raise TypeError(f"sampler must be a PrioritizedSampler, got {type(sampler).__name__}")
        self.world = ProcessGroup(group)
        self.sampler = sampler
        self.rank, self.world_size = self.world.rank, self.world.size
        self.world.require_same({"dataset_size": dataset_size, **_fingerprint(sampler)}, "PrioritizedSampler",
                                "build the same sampler on every rank (same dataset length, options and seed; "
                                "seed=None gives each rank its own)")
        check_dataset_size(sampler, dataset_size)
        if sampler.batch_size % self.world_size:
            raise ValueError(f"sampler.batch_size (the global batch) is {sampler.batch_size}, which is not divisible "
                             f"by the world size {self.world_size}; each rank trains batch_size / world_size "
                             f"examples a step")
        self.local_batch_size = sampler.batch_size // self.world_size
        # int64 words of one rank's gathered record (header, positions, indices, values): grows if one is longer
        self.gather_width = _HEADER + 3 * self.local_batch_size
        self.counters = {"feedback_gathers": 0, "gathered_bytes": 0}
        self.overlap = bool(overlap)
        self._in_flight: tuple[np.ndarray, Callable[[], np.ndarray]] | None = None

    # ------------------------------------------------------------------ drawing
    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def __len__(self) -> int:
        """Steps per epoch (global batches; each rank gets one share of each)."""
        return len(self.sampler)

    @property
    def num_examples(self) -> int:
        """N, the dataset size (the shared sampler's)."""
        return self.sampler.num_examples

    def set_epoch(self, epoch: int) -> None:
        """See `advance_to_epoch` (Lightning calls this on a DataLoader's ``batch_sampler.sampler``)."""
        advance_to_epoch(self, epoch)

    def share(self, whole: SampledBatch) -> RankBatch:
        """This rank's share of a global batch."""
        positions = share_positions(len(whole), self.rank, self.world_size)
        return RankBatch(indices=whole.indices[positions], probabilities=whole.probabilities[positions],
                         weights=whole.weights[positions], epoch=whole.epoch, step=whole.step, positions=positions,
                         whole=whole)

    def next_batch(self) -> RankBatch:
        """Draw the next global batch (identically on every rank) and return this rank's share."""
        self.settle()
        return self.share(self.sampler.next_batch())

    def __iter__(self) -> Iterator[RankBatch]:
        """This rank's shares of the remaining batches of the current epoch."""
        epoch = self.epoch
        while self.epoch == epoch:
            yield self.next_batch()

    def probabilities(self, indices: Any = None) -> np.ndarray:
        self.settle()
        return self.sampler.probabilities(indices)

    def stats(self) -> dict[str, float]:
        """The shared sampler's statistics (the same on every rank) plus this rank's gather counters."""
        self.settle()
        return {**self.sampler.stats(), **self.counters}

    # ------------------------------------------------------------------ feedback
    update = renamed("feedback")

    def feedback(self, batch: RankBatch | SampledBatch | Any | None, **feedback: Any) -> int | None:
        """Collective: every rank calls it (``batch=None`` joins with no feedback). Gathers all ranks' feedback and
        applies it on every rank in one order (see the module doc); returns how many weights changed in all.

        Feedback is checked on its own rank first; if any rank's is bad, every rank raises and nothing changes.
        With ``overlap=True`` the gather runs in the background and this returns None at once; the next draw
        (or any call that reads the state, or `settle`) waits for it and applies the feedback.
        """
        self.settle()
        record = self._encode(batch, feedback)
        self._in_flight = (record, self._start_gather(record))
        return self.settle() if not self.overlap or record[0] != 0 else None

    def settle(self) -> int:
        """Finish an update whose gather is in flight: wait for it and apply the merged feedback (returns how many
        weights changed; 0 with nothing in flight). Draws and state reads call it themselves."""
        if self._in_flight is None:
            return 0
        record, finish = self._in_flight
        self._in_flight = None
        records = self._finish_gather(record, finish)
        for rank, row in enumerate(records):
            if row[0] != 0 and rank != self.rank:
                raise ValueError(f"rank {rank} rejected its feedback (its own error says why); nothing changed")
        if record[0] != 0:
            raise self._rejected
        self.check_in_step(np.array([row[5:_HEADER] for row in records]))
        return self._apply(records)

    def _encode(self, batch: Any, feedback: Mapping[str, Any]) -> np.ndarray:
        header = np.zeros(_HEADER, np.int64)
        header[5:] = self.step_words()
        try:
            columns = self._check(batch, feedback, header)
        except (ValueError, TypeError) as exc:
            header[0], self._rejected = 1, exc
            return header
        return np.concatenate([header, *columns])

    def _check(self, batch: Any, feedback: Mapping[str, Any], header: np.ndarray) -> list[np.ndarray]:
        """This rank's feedback as int64 columns (positions, indices, one float64-bits column per keyword); fills
        the header's step, epoch, k and keyword mask. Raises like `PrioritizedSampler.feedback` on bad input."""
        header[1:3] = -1
        if batch is None:
            if feedback:
                raise ValueError(f"update(None) joins the gather without feedback, but got {sorted(feedback)}")
            return []
        indices = checks.index_array("indices", batch.indices if isinstance(batch, SampledBatch) else batch)
        bad = np.flatnonzero((indices < 0) | (indices >= self.sampler.num_examples))
        if len(bad):
            raise ValueError(f"indices must lie in [0, {self.sampler.num_examples}); indices[{bad[0]}] = "
                             f"{indices[bad[0]]}")
        never = np.flatnonzero(self.sampler.last_drawn_epoch[indices] < 0)
        if len(never):
            raise ValueError(f"indices[{never[0]}] = {indices[never[0]]} was never handed out by this sampler")
        k = len(indices)
        positions = np.full(k, -1, np.int64)
        if isinstance(batch, RankBatch) and batch.positions is not None:
            positions, header[1] = np.asarray(batch.positions, np.int64), batch.step
        if isinstance(batch, SampledBatch):
            header[2] = batch.epoch
        values = self._values(feedback, k)
        header[3] = k
        keywords = self._keywords()
        header[4] = sum(1 << keywords.index(name) for name in values)
        return [positions, indices, *(values[name].view(np.int64) for name in keywords if name in values)]

    def _keywords(self) -> tuple[str, ...]:
        """The value keywords the update declares, in its order: what a gathered row can carry (the same on every
        rank, whose samplers were checked identical at construction)."""
        return tuple(self.sampler.update_rule.value_keywords)

    def _values(self, feedback: Mapping[str, Any], k: int) -> dict[str, np.ndarray]:
        """Per-example float64 values by keyword; logits/targets/mask are reduced here by the update rule."""
        rule = self.sampler.update_rule
        value_keywords, array_keywords = self._keywords(), tuple(rule.array_keywords)
        checked: dict[str, np.ndarray] = {}
        for name, value in feedback.items():
            if name in value_keywords:
                checked[name] = as_feedback_array(name, value, k, "indices")
                check_values(name, checked[name], self.sampler.max_weight)
            elif name in array_keywords:
                checked[name] = to_numpy(value, name)
            else:
                raise TypeError(f"unknown feedback keyword {name!r} for {type(rule).__name__}; accepted: "
                                f"{[*value_keywords, *array_keywords] or 'none'}")
        if any(name in array_keywords for name in checked):  # reduced here, on its own rank, to one value each
            key = rule.feedback_key
            if key not in value_keywords:
                raise TypeError(f"{type(rule).__name__} reads {sorted(checked)}, which a distributed sampler "
                                f"cannot gather; pass per-example values ({', '.join(value_keywords)})")
            reduced = as_feedback_array(key, rule.values(checked), k, "indices")
            check_values(key, reduced, self.sampler.max_weight)
            return {key: reduced}
        return checked

    def _start_gather(self, record: np.ndarray) -> Callable[[], np.ndarray]:
        """One all-gather of fixed-width rows, started (`_finish_gather` completes it)."""
        row = np.zeros(self.gather_width + 1, np.int64)
        row[0] = len(record)
        row[1:1 + min(len(record), self.gather_width)] = record[:self.gather_width]
        return self.world.start_all_gather_rows(row)

    def _finish_gather(self, record: np.ndarray, finish: Callable[[], np.ndarray]) -> list[np.ndarray]:
        """Every rank's record; a second, wider gather only if some rank's record was longer than a row."""
        table = finish()
        lengths = table[:, 0].astype(int)
        gathered = table.nbytes
        if lengths.max() > self.gather_width:
            self.gather_width = int(lengths.max())
            row = np.zeros(self.gather_width + 1, np.int64)
            row[0], row[1:1 + len(record)] = len(record), record
            table = self.world.all_gather_rows(row)
            gathered += table.nbytes
        self.counters["feedback_gathers"] += 1
        self.counters["gathered_bytes"] += gathered
        return [table[rank, 1:1 + lengths[rank]] for rank in range(self.world_size)]

    def step_words(self) -> np.ndarray:
        """This rank's draw count, RNG state and tree mass as 6 int64 words: equal on ranks that are in step
        (gathered with each update, and with each score gather of `DistributedScoreThenSelect`)."""
        words = np.empty(6, np.int64)
        words[0] = self.sampler.step
        words[1:5] = self.sampler.rng_state.view(np.int64)
        words[5] = np.float64(self.sampler.tree.total).view(np.int64)
        return words

    def check_in_step(self, everyone: np.ndarray) -> None:
        """Raise (on every rank: all hold the same table) unless every rank's `step_words` (rows, rank order)
        agree."""
        states = [tuple(row) for row in everyone]
        if len(set(states)) > 1:
            draws = ", ".join(f"rank {r}: {int(s[0])}" for r, s in enumerate(states))
            raise RuntimeError(f"the ranks' samplers diverged before this update (batches drawn: {draws}; or "
                               f"their RNG or tree mass differ): every rank must draw the same batches and call "
                               f"update the same number of times (same DataLoader num_workers and prefetch_factor "
                               f"on every rank)")

    def _apply(self, records: list[np.ndarray]) -> int:
        by_step: dict[int, list[np.ndarray]] = {}
        plain = []
        for row in records:
            if row[3] > 0:
                (by_step.setdefault(int(row[1]), []) if row[1] >= 0 else plain).append(row)
        masks = {int(row[4]) for rows in (*by_step.values(), plain) for row in rows}
        if len(masks) > 1:
            raise ValueError("the ranks fed back different keywords in one update: "
                             + ", ".join(f"rank {r}: {self._names(int(row[4]))}" for r, row in enumerate(records)
                                         if row[3] > 0))
        changed = 0
        for step in sorted(by_step):
            positions, indices, values = self._columns(by_step[step])
            order = np.argsort(positions, kind="stable")
            ordered = positions[order]
            first = np.ones(len(ordered), bool)
            first[1:] = ordered[1:] != ordered[:-1]
            keep = order[first]  # a padded repeat: its first copy's value
            whole = SampledBatch(indices[keep], np.ones(len(keep)), np.ones(len(keep)), int(by_step[step][0][2]),
                                 step)
            changed += self.sampler.feedback(whole, **{name: v[keep] for name, v in values.items()})
        for row in plain:
            _, indices, values = self._columns([row])
            batch = indices if row[2] < 0 else SampledBatch(indices, np.ones(len(indices)), np.ones(len(indices)),
                                                             int(row[2]), -1)
            changed += self.sampler.feedback(batch, **values)
        return changed

    def _columns(self, rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        names = self._names(int(rows[0][4]))
        parts = [row[_HEADER:].reshape(2 + len(names), int(row[3])) for row in rows]
        table = np.concatenate(parts, axis=1)
        return table[0], table[1], {name: table[2 + i].view(np.float64) for i, name in enumerate(names)}

    def _names(self, mask: int) -> list[str]:
        return [name for i, name in enumerate(self._keywords()) if mask >> i & 1]

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        """The shared sampler's state: the same on every rank and independent of the world size."""
        self.settle()
        return self.sampler.state_dict()

    def load_state_dict(self, state: Mapping) -> None:
        """Collective: load ``state`` (e.g. from `load_shared_state`, also one written by another world size or by
        one process) on every rank; every rank raises if any rank cannot load it or the ranks now differ."""
        self.settle()
        self.world.agree(lambda: self.sampler.load_state_dict(state), "load_state_dict")
        digests = self.world.all_gather_objects(state_digest(self.sampler.state_dict()))
        if len(set(digests)) > 1:
            raise RuntimeError("the ranks loaded different sampler states; load the same state on every rank")

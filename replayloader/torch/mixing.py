"""The mixture (`replayloader.mixing`) in a torch DataLoader: a batch sampler (one process or DDP), K datasets as
one, K streams.

Optional module (torch is imported here only). It lived at ``replayloader.mixing.torch`` until 1.1; every torch
adapter now lives in ``replayloader.torch``, beside the sampler's and selection's (the old path still imports,
with a DeprecationWarning).

`MixtureBatchSampler` is a DataLoader ``batch_sampler``. The DataLoader iterates a batch sampler in the main
process, also with ``num_workers > 0``, so every draw, and every weight it reads, stays in one process; workers
only fetch the examples of the index lists they are sent, and ``pin_memory`` changes nothing. Feedback given
between batches reaches the draws after it, with one lag to know: with workers the DataLoader draws
``num_workers × prefetch_factor`` batches ahead of the one the loop receives (none with ``num_workers=0``), so
a batch's mixture reflects the feedback of the batches up to that many steps before it.

Several processes (``torch.distributed`` initialized): every rank holds the same `MixtureSampler` (same sources,
seed, rule and state; checked when the batch sampler is built), draws the same *global* batch and yields its
contiguous slice (`MixtureBatch.share`). `feedback` is a collective, once per step: a small all-gather of each
rank's status, count, step and generator state (ranks that drifted apart raise here), then one all-gather of
every rank's indices and losses, concatenated in rank order (the global batch's order when each rank feeds back
its slice), and the same `MixtureSampler.feedback` on every rank, so the weights stay bit-identical and W ranks ×
B/W reproduce one process × B. Bad feedback on any rank raises on every rank, and nothing changes.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any

import numpy as np
import torch
from torch.utils.data import ConcatDataset, Dataset, IterableDataset, default_collate, get_worker_info

from .. import _checks as checks
from .._moved import keyword_only
from ..distributed.group import current_group
from ..distributed.state_files import state_digest
from ..state.checks import array, check_header, field, integer, require
from ..mixing.sampler import STATE_VERSION, MixtureBatch, MixtureSampler, SourceMixer, check_losses, load_parts
from .records import RecordedBatchSampler

_HEADER = 7  # status, count, step, 4 RNG words


class MixtureBatchSampler(RecordedBatchSampler[MixtureBatch]):
    """Index lists drawn by a `MixtureSampler`, for ``DataLoader(dataset, batch_sampler=...)``; the loop pops
    each batch's `MixtureBatch` with `next_batch_info` (see `records.RecordedBatchSampler`).

    Each ``iter()`` yields the rest of the current pass of ``len()`` batches (all of them when it starts). Under
    DDP each yielded list is this rank's slice of the global batch.

    Args:
        mixture_sampler: the `MixtureSampler` (under DDP: built identically on every rank).
        rank: this process's slice; default: torch.distributed's rank when it is initialized, else 0. Given by
            hand without a process group (with ``world_size``), feedback is applied as given: gather the global
            batch's losses yourself and feed them on every rank.
        world_size: the number of slices; default: torch.distributed's world size when it is initialized, else 1.
        num_batches: batches per pass, what ``len()`` returns (default: ceil(examples / batch_size), one
            pass's worth of examples).
    """

    def __init__(self, mixture_sampler: MixtureSampler, *, rank: int | None = None, world_size: int | None = None,
                 num_batches: int | None = None) -> None:
        if not isinstance(mixture_sampler, MixtureSampler):
            raise TypeError(f"mixture_sampler must be a MixtureSampler, got {type(mixture_sampler).__name__}")
        super().__init__()  # the queue of global batches drawn, not yet received by the loop
        self.mixture = mixture_sampler
        self.world = current_group()
        if self.world is not None:
            for name, given, actual in (("rank", rank, self.world.rank), ("world_size", world_size, self.world.size)):
                if given is not None and given != actual:
                    raise ValueError(f"{name}={given} but torch.distributed says {actual}; leave it out under DDP")
            rank, world_size = self.world.rank, self.world.size
        self.world_size = checks.integer("world_size", 1 if world_size is None else world_size, 1)
        self.rank = checks.integer("rank", 0 if rank is None else rank, 0, self.world_size - 1)
        batch = mixture_sampler.batch_size
        self.num_batches = (math.ceil(mixture_sampler.num_examples / batch) if num_batches is None
                            else checks.integer("num_batches", num_batches, 1))
        if self.world is not None:  # every rank, before the divisibility check, so a mismatch raises everywhere
            self.world.require_same({**mixture_sampler._config(), "num_batches": self.num_batches,
                                     "state": state_digest(mixture_sampler.state_dict())}, "MixtureSampler",
                                    "build the same MixtureSampler on every rank (same sources, batch_size, seed, "
                                    "rule and state)")
        if batch % self.world_size:
            raise ValueError(f"batch_size (the global batch) is {batch}, which is not divisible by the world size "
                             f"{self.world_size}; each rank takes batch_size / world_size examples a step")
        self._position = 0  # batches yielded in the current pass (it stays at len() once the pass is drawn)
        self._epoch = 0  # the loop's epoch, as set_epoch gave it: tells a resume inside an epoch from one after it

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self) -> Iterator[list[int]]:
        self._restart()
        if self._position >= self.num_batches:
            self._position = 0
        while self._position < self.num_batches:
            whole = self._hand_out(self._next_drawn(self.mixture.next_batch))
            self._position += 1
            yield whole.share(self.rank, self.world_size).indices.tolist()

    def set_epoch(self, epoch: int) -> None:
        """What frameworks call at each epoch start. The stream follows from the sampler's own generator, not
        from epoch numbers, with one exception: after `load_state_dict`, the batches drawn before the checkpoint
        and not received are yielded first when the loop resumes the checkpoint's epoch, and dropped when it
        starts another one (the loop had ended that epoch early, so its next iterator drops them too)."""
        epoch = checks.integer("epoch", epoch, 0)
        if epoch != self._epoch and self._waiting:
            self._position += len(self._waiting)  # they were drawn in this pass: the pass goes on after them
            self._load_pending(())
        self._epoch = epoch

    def _info(self, whole: MixtureBatch) -> MixtureBatch:
        """This rank's slice of the global batch (`MixtureBatch.share`): what `next_batch_info` returns."""
        return whole.share(self.rank, self.world_size)

    # ------------------------------------------------------------------ feedback
    @keyword_only("loss", renamed={"indices": "batch", "losses": "loss"})
    def feedback(self, batch: Any, *, loss: Any) -> None:
        """`MixtureSampler.feedback` for this rank's examples (a `MixtureBatch` or its indices, and their losses
        ``loss``, numpy or torch). Under DDP a collective: every rank calls it once per step (see the module doc).
        1.0's ``feedback(indices, losses)`` still works for one release, with a DeprecationWarning."""
        if self.world is None:
            self.mixture.feedback(batch, loss=loss)
            return
        header = np.zeros(_HEADER, np.int64)
        header[2] = self.mixture.step
        header[3:] = self.mixture.mixer.rng_state.view(np.int64)
        try:
            idx, values = self.mixture.check_feedback(batch, loss)
            header[1] = len(idx)
        except (ValueError, TypeError) as exc:
            header[0], rejected, idx, values = 1, exc, np.zeros(0, np.int64), np.zeros(0)
        everyone = self.world.all_gather_rows(header)
        if header[0]:
            raise rejected
        failed = np.flatnonzero(everyone[:, 0])
        if len(failed):
            raise ValueError(f"rank {failed[0]} rejected its feedback (its own error says why); nothing changed")
        if len({tuple(row[2:]) for row in everyone}) > 1:
            raise RuntimeError(f"the ranks' mixture samplers diverged (batches drawn: {everyone[:, 2].tolist()}, or "
                               f"their generators differ): every rank must draw the same batches and call feedback "
                               f"the same number of times (same DataLoader settings on every rank)")
        all_indices, all_losses = self.world.all_gather_ragged(idx, values, everyone[:, 1])
        self.mixture.feedback(all_indices, loss=all_losses)

    def stats(self) -> dict[str, Any]:
        return self.mixture.stats()

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        """The sampler's state, the batches drawn but not yet received by the loop (global batches, so the state
        resumes on any world size) and the position in the pass."""
        pending = self._pending()
        return {"mixture": self.mixture.state_dict(), "position": self._position - len(self._handed_out),
                "epoch": self._epoch,
                "pending": [{"indices": b.indices.copy(), "sources": b.sources.copy(), "mixture": b.mixture.copy(),
                             "step": b.step} for b in pending]}

    def load_state_dict(self, state: Mapping) -> None:
        """All or nothing: the pending batches are checked before the sampler loads (which checks its own). Under
        DDP a collective: load the same state on every rank (e.g. from `load_shared_state`)."""
        where = "batch sampler state"
        pending = field(state, "pending", where)
        require(isinstance(pending, list), f"{where}['pending'] must be a list, got {type(pending).__name__}")
        m = self.mixture
        batches = []
        for j, batch in enumerate(pending):
            at = f"{where}['pending'][{j}]"
            indices = array(batch, "indices", at, (m.batch_size,), "iu", np.int64)
            require(bool(((indices >= 0) & (indices < m.num_examples)).all()),
                    f"{at}['indices'] must lie in [0, {m.num_examples})")
            sources = array(batch, "sources", at, (m.batch_size,), "iu", np.int64)
            require(np.array_equal(sources, m.source_of[indices]), f"{at}['sources'] must be the indices' sources")
            mixture_used = array(batch, "mixture", at, (m.num_sources,), "f", np.float64)
            batches.append(MixtureBatch(indices, sources, mixture_used, integer(batch, "step", at, 0)))
        position = integer(state, "position", where, 0, self.num_batches - len(batches))
        epoch = integer(state, "epoch", where, 0) if "epoch" in state else 0  # states before 1.1 lack it
        mixture = field(state, "mixture", where)
        if self.world is None:
            m.load_state_dict(mixture)
        else:
            self.world.agree(lambda: m.load_state_dict(mixture), "load_state_dict")
            if len(set(self.world.all_gather_objects(state_digest(m.state_dict())))) > 1:
                raise RuntimeError("the ranks loaded different mixture states; load the same state on every rank")
        self._load_pending(batches)
        self._position, self._epoch = position, epoch


def concat_sources(datasets: Sequence[Dataset], **options: Any) -> tuple[ConcatDataset, MixtureSampler]:
    """K map-style datasets as one: their `ConcatDataset` and a `MixtureSampler` over it with one source per
    dataset (sizes = their lengths). ``options``: the `MixtureSampler`'s (``batch_size``, ``rule``, ...)."""
    if not datasets:
        raise ValueError("datasets must hold at least one dataset")
    sizes = [len(d) for d in datasets]
    return ConcatDataset(datasets), MixtureSampler(sizes, **options)


class MixtureIterableDataset(IterableDataset):
    """K streams mixed batch by batch: each batch's per-source counts come from the rule, and the examples are
    the next ones of each source's iterator, read in order; a source at its end starts over (a new pass).

    Use it with ``DataLoader(dataset, batch_size=None, num_workers=0)`` (the dataset yields whole batches; the
    mixture lives in this process, where feedback reaches it, so workers are refused). Each item is
    ``(batch, sources)``: the collated examples and a LongTensor with each example's source. Feed back with
    `feedback(sources, losses)`. Iteration is endless: take as many batches as you train.

    A checkpoint (`state_dict`) holds how many examples of each source's current pass were read; on resume each
    source is opened again and that many are skipped, so sources must be re-iterable and deterministic (a list,
    a dataset, an object whose ``__iter__`` starts over; not a one-shot generator object).

    Args:
        sources: K re-iterable sources of examples.
        collate_fn: turns a list of examples into a batch (default `torch.utils.data.default_collate`).
        mixer: `SourceMixer` options: ``batch_size``, ``rule``, ``seed``, ``names``, ``log_path``, ``log_every``.
    """

    def __init__(self, sources: Sequence[Iterable], *, collate_fn: Callable[[list], Any] | None = None,
                 **mixer: Any) -> None:
        self.sources = list(sources)
        if not self.sources:
            raise ValueError("sources must hold at least one iterable")
        for k, source in enumerate(self.sources):
            if not isinstance(source, Iterable) or iter(source) is source:
                raise TypeError(f"sources[{k}] must be re-iterable (iter() starts it over: a list, a dataset, ...), "
                                f"got {type(source).__name__}")
        self.mixer = SourceMixer(len(self.sources), **mixer)
        self.collate_fn = default_collate if collate_fn is None else collate_fn
        k = len(self.sources)
        self.consumed = np.zeros(k, np.int64)  # examples read in the current pass, per source
        self.passes = np.zeros(k, np.int64)
        self._iterators: list[Iterator | None] = [None] * k

    def __iter__(self) -> Iterator[tuple[Any, torch.Tensor]]:
        if get_worker_info() is not None:
            raise RuntimeError("MixtureIterableDataset must be read in the training process (num_workers=0): in a "
                               "worker, feedback from the training loop would never reach its mixture")
        while True:
            yield self.next_batch()

    def next_batch(self) -> tuple[Any, torch.Tensor]:
        """The next batch and its examples' sources."""
        sources, _, _ = self.mixer.next_sources()
        examples = [self._next_example(int(k)) for k in sources]
        return self.collate_fn(examples), torch.from_numpy(sources)

    def _next_example(self, k: int) -> Any:
        if self._iterators[k] is None:
            self._iterators[k] = islice(iter(self.sources[k]), int(self.consumed[k]), None)
        try:
            example = next(self._iterators[k])
        except StopIteration:
            if self.consumed[k] == 0:
                raise ValueError(f"source {k} ({self.mixer.names[k]}) is empty") from None
            self.consumed[k], self.passes[k] = 0, self.passes[k] + 1
            self._iterators[k] = iter(self.sources[k])
            return self._next_example(k)
        self.consumed[k] += 1
        return example

    @keyword_only("loss", renamed={"losses": "loss"})
    def feedback(self, sources: Any, *, loss: Any) -> None:
        """Per-example training losses (``loss``) with each example's source (the ``sources`` tensor of its
        batch): the rule gets one step. Bad input raises a ValueError naming the argument, and nothing changes.
        1.0's ``feedback(sources, losses)`` still works for one release, with a DeprecationWarning."""
        src = checks.index_array("sources", sources)
        bad = np.flatnonzero((src < 0) | (src >= self.mixer.num_sources))
        if len(bad):
            raise ValueError(f"sources must lie in [0, {self.mixer.num_sources}); sources[{bad[0]}] = {src[bad[0]]}")
        self.mixer.feedback_sources(src, check_losses(loss, src.shape))

    def stats(self) -> dict[str, Any]:
        return {**self.mixer.stats(), "passes": self.passes.copy()}

    def state_dict(self) -> dict:
        return {"version": STATE_VERSION, "config": self.mixer.config(), **self.mixer.state_dict(),
                "consumed": self.consumed.copy(), "passes": self.passes.copy()}

    def load_state_dict(self, state: Mapping) -> None:
        """All or nothing; the next batch is the one that would have followed (sources are reopened and the
        examples of their current pass already read are skipped)."""
        where = check_header(state, STATE_VERSION, self.mixer.config(), "mixture stream")
        mixer = self.mixer.checked_state(state, where)
        k = self.mixer.num_sources
        consumed = array(state, "consumed", where, (k,), "iu", np.int64)
        passes = array(state, "passes", where, (k,), "iu", np.int64)
        require(not (consumed < 0).any() and not (passes < 0).any(), f"{where}['consumed'], ['passes'] must be >= 0")
        load_parts([self.mixer.rule], [field(state, "rule", where)], where)
        self.mixer.commit(mixer)
        self.consumed, self.passes = consumed, passes
        self._iterators = [None] * k

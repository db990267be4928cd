"""MixtureSampler: batches of a dataset made of K sources, in proportions a mixing rule learns from training loss.

Why a sampler and not a dataset wrapper: the mixture is a decision about *which indices* the next batch holds,
and everything the library already has for index samplers applies (DataLoader workers, DDP slices, exact
checkpoints). The examples stay where they are; the sampler knows only which source each index belongs to.

One batch (`next_batch`):

1. each of the ``batch_size`` slots picks a source from the rule's current weights (so the per-source counts are
   multinomial, and sources are interleaved in random order within the batch);
2. each source hands out as many of its examples as slots picked it: with ``within="uniform"`` the next ones of
   a per-source random permutation (without replacement; reshuffled when the source is exhausted), with
   ``within="prioritized"`` draws of a `PrioritizedSampler` over that source, so example-level and source-level
   importance compose.

Feedback (`feedback(batch, loss=...)`) maps each index to its source and gives the rule one step's per-source
mean loss and count; with ``within="prioritized"`` the losses also go to each source's `PrioritizedSampler`.
All arguments are checked before anything changes.

What a step costs: a few compiled passes over the batch (`kernels.mixing`: the slots' sources, the examples each
source hands out, the feedback's checks and per-source sums) and, with ``within="prioritized"``, one call each
way into the sources' `PrioritizedSampler`s together (`sampler.groups.SamplerGroup`), never one per example;
``python -m bench.hot_paths`` times it beside torch's ``RandomSampler``. Those passes make the very draws the
numpy forms made (tests/mixing/test_reference.py).

Every random number comes from the sampler's own generator (`kernels.rng`), whose four words are checkpointed, so
`state_dict` / `load_state_dict` resume the identical stream, also in the middle of a source's pass. The stream
does not depend on how many processes consume it: DDP ranks draw the same global batch and take their slice
(`MixtureBatch.share`).
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import _checks as checks
from .._moved import keyword_only, renamed_method
from .._arrays import to_numpy
from ..kernels.mixing import (BAD_LOSS, draw_sources, feedback_sums, order_by_source, place_draws, reshuffle,
                               take_uniform)
from ..kernels.rng import seed_state
from ..sampler.groups import SamplerGroup
from ..sampler.prioritized import PrioritizedSampler
from ..state.atomic import sha256_bytes
from ..state.checks import InvalidState, array, check_header, field, integer, require, rng_words
from .rules import MixingRule, ReportsEstimates

STATE_VERSION = 1
WITHIN = ("uniform", "prioritized")
# PrioritizedSampler options the mixture sets itself (one index per draw, its own seed, no importance weights)
_SET_BY_MIXTURE = ("num_examples", "batch_size", "seed", "beta")


@dataclass(frozen=True, eq=False)
class MixtureBatch:
    """One batch: dataset ``indices`` (int64), the ``sources`` they were drawn from (int64, same length), the
    ``mixture`` over the K sources they were drawn with (float64, sums to 1), and ``step``, the global batch
    number as in every batch record (the batches drawn before this one). Not ``weights``: in this library a
    record's ``weights`` are per-example importance weights, and a mixture batch has none (all examples count
    alike)."""

    indices: np.ndarray
    sources: np.ndarray
    mixture: np.ndarray
    step: int

    def __len__(self) -> int:
        return len(self.indices)

    def share(self, rank: int, world_size: int) -> MixtureBatch:
        """Rank ``rank``'s slice of this global batch: the contiguous block [rank·B/W, (rank+1)·B/W), so the W
        slices concatenated in rank order are the batch. B must be divisible by W."""
        w = checks.integer("world_size", world_size, 1)
        r = checks.integer("rank", rank, 0, w - 1)
        if len(self) % w:
            raise ValueError(f"a batch of {len(self)} cannot be split evenly over world_size={w}: make batch_size "
                             f"a multiple of the world size")
        size = len(self) // w
        part = slice(r * size, (r + 1) * size)
        return MixtureBatch(self.indices[part], self.sources[part], self.mixture, self.step)


def checked_weights(rule: Any, num_sources: int) -> np.ndarray:
    """The rule's weights, checked (a rule is user code): K finite numbers >= 0 summing to 1 (within 1e-6).
    (A NaN fails ``min >= 0``, an infinity fails the sum: two reductions say it all.)"""
    w = np.ascontiguousarray(rule.weights(), dtype=np.float64)
    if w.shape != (num_sources,) or not (w.min() >= 0 and abs(w.sum() - 1.0) <= 1e-6):
        raise ValueError(f"{type(rule).__name__}.weights() must return {num_sources} finite numbers >= 0 summing "
                         f"to 1, got {w.tolist()}")
    return w


def loss_array(losses: Any, shape: tuple) -> np.ndarray:
    """Per-example training losses (numpy or torch) as contiguous float64 of ``shape``; else a ValueError naming
    ``loss`` (the feedback keyword). Their values are checked by `check_losses` or, with the indices, in one
    pass by `MixtureSampler.feedback`."""
    values = to_numpy(losses, "loss")
    if values.shape != shape:
        raise ValueError(f"loss must have shape {shape} to match indices, got {values.shape}")
    if values.dtype.kind not in "fiu":
        raise ValueError(f"loss must be numbers, got dtype {values.dtype}")
    return np.ascontiguousarray(values, np.float64)


def refuse_loss(values: np.ndarray, j: int) -> None:
    """The error of a loss that is not finite or negative (``values[j]``)."""
    raise ValueError(f"loss must be finite and >= 0 (training losses); loss[{j}] = {float(values[j])!r}")


def check_losses(losses: Any, shape: tuple) -> np.ndarray:
    """Per-example training losses (numpy or torch) as float64 of ``shape``, every one finite and >= 0; else a
    ValueError naming ``loss`` (the feedback keyword). One rule whatever draws inside the sources: a training
    loss is never negative, and a negative one would turn into a negative reward (or priority) without a word."""
    values = loss_array(losses, shape)
    if values.size and not (values.min() >= 0 and np.isfinite(values.max())):  # NaN fails the first, inf the second
        refuse_loss(values, int(np.flatnonzero(~np.isfinite(values) | (values < 0))[0]))
    return values


class SourceMixer:
    """The part every mixture shares, index-based or streaming: the rule, the generator, the per-slot source
    draw, per-source feedback, counters, the weight log and their state. `MixtureSampler` and
    `MixtureIterableDataset` each add how a source hands out its examples.

    Args: see `MixtureSampler` (``num_sources`` = K, ``names``, ``log_path``, ``log_every``).
    """

    def __init__(self, num_sources: int, *, batch_size: int, rule: MixingRule, seed: int = 0,
                 names: Sequence[str] | None = None, log_path: str | os.PathLike | None = None,
                 log_every: int = 1) -> None:
        k = self.num_sources = checks.integer("num_sources", num_sources, 1)
        self.batch_size = checks.integer("batch_size", batch_size, 1)
        self.seed = checks.integer("seed", seed, 0)
        if not isinstance(rule, MixingRule):
            raise TypeError(f"rule must be a MixingRule (weights, feedback, bind, state_dict, load_state_dict), "
                            f"got {type(rule).__name__}")
        rule.bind(k)
        self.rule = rule
        # what the weights follow from, for stats and the log: chosen once here, never asked per step
        self._estimates = rule.estimates if isinstance(rule, ReportsEstimates) else dict
        self.names = [str(i) for i in range(k)] if names is None else [str(n) for n in names]
        if len(self.names) != k or len(set(self.names)) != k:
            raise ValueError(f"names must be {k} distinct names (one per source), got {list(names or [])}")
        self.log_path = None if log_path is None else Path(log_path)
        self.log_every = checks.integer("log_every", log_every, 1)
        self.rng_state = seed_state(self.seed)
        self.step = 0
        self.counts = {"drawn": np.zeros(k, np.int64), "fed_back": np.zeros(k, np.int64)}
        self.loss_sums = np.zeros(k)
        self.feedback_calls = 0

    def probabilities(self) -> np.ndarray:
        """The rule's current weights over the K sources (what the next batch is drawn from)."""
        return checked_weights(self.rule, self.num_sources)

    def next_sources(self) -> tuple[np.ndarray, np.ndarray, int]:
        """The source of each slot of the next batch, the weights they were drawn with, and the batch's step."""
        weights = self.probabilities()
        if self.log_path is not None and self.step % self.log_every == 0:
            record = {"step": self.step, "weights": dict(zip(self.names, weights.tolist()))}
            record.update({key: dict(zip(self.names, np.asarray(values, np.float64).tolist()))
                           for key, values in self.estimates().items()})
            line = json.dumps(record)
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "a") as f:
                f.write(line + "\n")
        sources = np.empty(self.batch_size, np.int64)
        draw_sources(self.rng_state, weights, sources, self.counts["drawn"])
        step = self.step
        self.step += 1
        return sources, weights, step

    def feedback_sources(self, sources: np.ndarray, values: np.ndarray) -> None:
        """One feedback step from checked per-example sources and losses (see `feedback_sums`)."""
        counts = np.bincount(sources, minlength=self.num_sources).astype(np.int64)
        sums = np.bincount(sources, weights=values, minlength=self.num_sources)
        self.feedback_sums(counts, sums, np.divide(sums, counts, out=np.zeros(self.num_sources), where=counts > 0))

    def feedback_sums(self, counts: np.ndarray, sums: np.ndarray, means: np.ndarray) -> None:
        """One feedback step from each source's count of examples, sum of their (checked) losses and mean loss
        (0.0 where the count is 0): the rule gets the means and counts first (it checks its own arguments
        before it changes), then the counters."""
        self.rule.feedback(means, counts)
        self.counts["fed_back"] += counts
        self.loss_sums += sums
        self.feedback_calls += 1

    def estimates(self) -> dict[str, np.ndarray]:
        """The rule's per-source estimates (`ReportsEstimates`; e.g. ODM's ``reward`` and ``exploration``), or
        nothing for a rule that offers none."""
        return {key: np.asarray(values, np.float64) for key, values in self._estimates().items()}

    def stats(self) -> dict[str, Any]:
        """The current weights, examples drawn and fed back per source, the mean feedback loss per source (NaN
        where none yet), the source names, the step, the number of feedback calls, and under ``estimates`` the
        rule's per-source estimates (empty for a rule without them)."""
        fed = self.counts["fed_back"]
        mean = np.divide(self.loss_sums, fed, out=np.full(self.num_sources, np.nan), where=fed > 0)
        return {"step": self.step, "feedback_calls": self.feedback_calls, "names": list(self.names),
                "weights": self.probabilities(), "drawn": self.counts["drawn"].copy(), "fed_back": fed.copy(),
                "mean_loss": mean, "estimates": self.estimates()}

    def config(self) -> dict:
        return {"num_sources": self.num_sources, "batch_size": self.batch_size, "seed": self.seed,
                "rule": type(self.rule).__name__}

    def state_dict(self) -> dict:
        return {"rng": self.rng_state.copy(), "step": self.step, "counts_drawn": self.counts["drawn"].copy(),
                "counts_fed_back": self.counts["fed_back"].copy(), "loss_sums": self.loss_sums.copy(),
                "feedback_calls": self.feedback_calls, "rule": self.rule.state_dict()}

    def checked_state(self, state: Mapping, where: str) -> dict:
        """The mixer's new values from ``state``, every one checked (the rule's state is checked by the rule when
        it loads, in `load_parts`); nothing changes."""
        k = self.num_sources
        counts = {name: array(state, f"counts_{name}", where, (k,), "iu", np.int64) for name in self.counts}
        require(all(not (c < 0).any() for c in counts.values()), f"{where}['counts_*'] must be >= 0")
        # feedback may name an example again (duplicates, or a batch fed back twice), so a source's feedback
        # entries can outnumber its draws; but only drawn examples take feedback
        require(not bool(((counts["fed_back"] > 0) & (counts["drawn"] == 0)).any()),
                f"{where}['counts_fed_back'] holds feedback for a source never drawn from, got "
                f"{counts['fed_back'].tolist()} fed back of {counts['drawn'].tolist()} drawn")
        loss_sums = array(state, "loss_sums", where, (k,), "fiu", np.float64)
        require(bool(np.isfinite(loss_sums).all()), f"{where}['loss_sums'] must be finite")
        return {"rng_state": rng_words(state, "rng", where), "step": integer(state, "step", where, 0),
                "counts": counts, "loss_sums": loss_sums,
                "feedback_calls": integer(state, "feedback_calls", where, 0)}

    def commit(self, values: Mapping[str, Any]) -> None:
        """Assign what `checked_state` returned (cannot fail)."""
        for name, value in values.items():
            setattr(self, name, value)


def load_parts(parts: Sequence[Any], states: Sequence[Any], where: str) -> None:
    """Load each part's state in order, all or nothing: a part that refuses its state (it changes nothing then)
    makes the parts loaded before it take their previous state back."""
    previous = [part.state_dict() for part in parts]
    loaded = 0
    try:
        for part, part_state in zip(parts, states):
            part.load_state_dict(part_state)
            loaded += 1
    except Exception as exc:
        for part, old in zip(parts[:loaded], previous[:loaded]):
            part.load_state_dict(old)
        if isinstance(exc, InvalidState):
            raise
        raise InvalidState(f"{where}: {type(parts[loaded]).__name__} refused its state: {exc}") from exc


class MixtureSampler:
    """Batches of global dataset indices over K sources, mixed by a `MixingRule` that learns from feedback.

    Args:
        sources: the K source sizes; source k's examples are the contiguous block of global indices after the
            first k sources (a `torch.utils.data.ConcatDataset` of the sources has this layout). For one dataset
            with a source label per example, use `from_labels`.
        batch_size: examples per batch (the global batch under DDP: a multiple of the world size).
        rule: the `MixingRule` (`FixedMixture`, `ODM`, `ExcessLoss`, or your own).
        seed: seed of the sampler's generator (every rank of a DDP job must use the same).
        within: how examples are drawn inside a source: "uniform" (a permutation per source, without
            replacement, reshuffled at its end) or "prioritized" (a `PrioritizedSampler` per source).
        prioritized: options of each source's `PrioritizedSampler` with ``within="prioritized"`` (``alpha``,
            ``update``, ``init``, ``uniform_fraction``, ``warmup_epochs``, ...; its update must read ``loss=``).
        names: K source names for `stats` and the log (default "0", "1", ...).
        log_path: a JSONL file to append one line ``{"step", "weights": {name: w}}`` to every ``log_every``
            draws (draw 0 included), the weights that draw used. Under DDP give it on one rank only.
        log_every: see ``log_path``.
    """

    def __init__(self, sources: Sequence[int] | np.ndarray, *, batch_size: int, rule: MixingRule, seed: int = 0,
                 within: str = "uniform", prioritized: Mapping[str, Any] | None = None,
                 names: Sequence[str] | None = None, log_path: str | os.PathLike | None = None,
                 log_every: int = 1) -> None:
        sizes = np.asarray(sources)
        if sizes.ndim != 1 or sizes.size == 0 or sizes.dtype.kind not in "iu":
            raise ValueError(f"sources must be a non-empty sequence of integer source sizes, got "
                             f"{np.asarray(sources)!r}")
        mixer = {"batch_size": batch_size, "rule": rule, "seed": seed, "names": names, "log_path": log_path,
                 "log_every": log_every}
        self._setup(sizes.astype(np.int64), np.arange(int(sizes.sum()), dtype=np.int64), within, prioritized, mixer)

    @classmethod
    def from_labels(cls, labels: Sequence[int] | np.ndarray, *, num_sources: int | None = None,
                    within: str = "uniform", prioritized: Mapping[str, Any] | None = None,
                    **mixer: Any) -> MixtureSampler:
        """One dataset whose example i belongs to source ``labels[i]`` (numpy or torch): source k's examples are
        the positions where the label is k. ``num_sources`` defaults to max(labels) + 1; a label outside
        [0, num_sources) or a source without examples is an error. The other options are the constructor's."""
        arr = checks.index_array("labels", labels)
        k = int(arr.max()) + 1 if num_sources is None else checks.integer("num_sources", num_sources, 1)
        bad = np.flatnonzero((arr < 0) | (arr >= k))
        if len(bad):
            raise ValueError(f"labels must lie in [0, {k}) (num_sources={k}); labels[{bad[0]}] = {arr[bad[0]]}")
        members = np.argsort(arr, kind="stable").astype(np.int64)  # source 0's positions, then source 1's, ...
        sampler = cls.__new__(cls)
        sampler._setup(np.bincount(arr, minlength=k).astype(np.int64), members, within, prioritized, mixer)
        return sampler

    def _setup(self, sizes: np.ndarray, members: np.ndarray, within: str, prioritized: Mapping[str, Any] | None,
               mixer: dict) -> None:
        empty = np.flatnonzero(sizes <= 0)
        if len(empty):
            raise ValueError(f"source {empty[0]} is empty (sizes: {sizes.tolist()}); every source needs at least "
                             f"one example")
        checks.one_of("within", within, WITHIN)
        if within == "uniform" and prioritized:
            raise ValueError("prioritized= options need within='prioritized'")
        k = len(sizes)
        self.mixer = SourceMixer(k, **mixer)
        self.sizes, self.num_sources, self.within = sizes, k, within
        self.num_examples = int(sizes.sum())
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.members = members  # global indices of source 0, then source 1, ... (source k's j-th: offsets[k] + j)
        self.source_of = np.empty(self.num_examples, np.int64)
        self.source_of[members] = np.repeat(np.arange(k), sizes)
        self.local_of = np.empty(self.num_examples, np.int64)  # an index's position inside its source
        self.local_of[members] = np.arange(self.num_examples) - np.repeat(self.offsets[:-1], sizes)
        self.prioritized_options = dict(prioritized or {})
        self.samplers = [self._source_sampler(j) for j in range(k)] if within == "prioritized" else []
        self.group = SamplerGroup(self.samplers) if self.samplers else None  # their draws and feedback, together
        self.order = np.zeros(self.num_examples, np.int64)  # per-source permutations (within="uniform")
        self.cursor = np.zeros(k, np.int64)  # examples handed out of the current permutation, per source
        self.passes = np.zeros(k, np.int64)  # permutations started, per source
        if within == "uniform":
            for j in range(k):
                self._reshuffle(j)
        self.drawn = np.zeros(self.num_examples, np.bool_)

    # the mixer's settings, read through the sampler
    batch_size = property(lambda self: self.mixer.batch_size)
    seed = property(lambda self: self.mixer.seed)
    rule = property(lambda self: self.mixer.rule)
    names = property(lambda self: self.mixer.names)
    step = property(lambda self: self.mixer.step, doc="batches drawn so far")

    def _source_sampler(self, k: int) -> PrioritizedSampler:
        options = self.prioritized_options
        taken = [name for name in _SET_BY_MIXTURE if name in options]
        if taken:
            raise ValueError(f"prioritized= must not set {taken}: the mixture draws one index at a time with a seed "
                             f"of its own, and a mixture batch has no importance weights")
        seed = int(np.random.SeedSequence([self.seed, k]).generate_state(1)[0])
        sampler = PrioritizedSampler(int(self.sizes[k]), 1, seed=seed, **options)
        if "loss" not in sampler.update_rule.value_keywords:
            raise ValueError(f"within='prioritized' feeds the training loss back as loss=, but the update "
                             f"{type(sampler.update_rule).__name__} reads {list(sampler.update_rule.value_keywords)}")
        return sampler

    def _reshuffle(self, k: int) -> None:
        reshuffle(self.mixer.rng_state, self.order, self.offsets[k], self.offsets[k + 1])
        self.cursor[k] = 0
        self.passes[k] += 1

    # ------------------------------------------------------------------ drawing
    def probabilities(self) -> np.ndarray:
        """The rule's current weights over the K sources (what the next batch is drawn from)."""
        return self.mixer.probabilities()

    def next_batch(self) -> MixtureBatch:
        """The next global batch (see the module doc)."""
        sources, weights, step = self.mixer.next_sources()
        indices = np.empty(len(sources), np.int64)
        if self.within == "uniform":
            # source by source (ascending), the next examples of its permutation to its slots in slot order
            take_uniform(self.mixer.rng_state, sources, self.order, self.offsets, self.cursor, self.passes,
                         self.members, self.drawn, indices)
        else:
            self._take_prioritized(sources, indices)
        return MixtureBatch(indices, sources, weights, step)

    draw = renamed_method("next_batch")  # 1.0's name, deprecated in 1.1

    def _take_prioritized(self, sources: np.ndarray, out: np.ndarray) -> None:
        """Each source's `PrioritizedSampler` draws as many indices as slots picked it (`SamplerGroup`: one
        compiled pass over the sources, ascending; each has its own generator), handed to its slots in slot
        order."""
        order, counts = np.empty(len(sources), np.int64), np.zeros(self.num_sources, np.int64)
        order_by_source(sources, counts, order)
        local = np.empty(len(sources), np.int64)
        self.group.draw_singles(counts, local)
        place_draws(sources, order, local, self.offsets, self.members, self.drawn, out)

    # ------------------------------------------------------------------ feedback
    def _checked(self, batch: Any, loss: Any) -> tuple[np.ndarray, ...]:
        """`feedback`'s checks, in one pass where it can: (indices, losses, and per source: count, loss sum,
        mean loss), or the error it would raise."""
        idx = checks.index_array("indices", batch.indices if isinstance(batch, MixtureBatch) else batch)
        try:
            values = loss_array(loss, idx.shape)
        except (ValueError, TypeError):
            self._check_indices(idx)  # an index error comes first
            raise
        k = self.num_sources
        counts, sums, means = np.zeros(k, np.int64), np.zeros(k), np.zeros(k)
        bad, why = feedback_sums(idx, values, self.drawn, self.source_of, counts, sums, means)
        if bad >= 0:
            if why == BAD_LOSS:
                refuse_loss(values, bad)
            self._check_indices(idx)
        return idx, values, counts, sums, means

    def _check_indices(self, idx: np.ndarray) -> None:
        """The errors of indices out of range or never drawn, if any."""
        bad = np.flatnonzero((idx < 0) | (idx >= self.num_examples))
        if len(bad):
            raise ValueError(f"indices must lie in [0, {self.num_examples}); indices[{bad[0]}] = {idx[bad[0]]}")
        never = np.flatnonzero(~self.drawn[idx])
        if len(never):
            raise ValueError(f"indices[{never[0]}] = {idx[never[0]]} was never drawn by this sampler")

    def check_feedback(self, batch: Any, loss: Any) -> tuple[np.ndarray, np.ndarray]:
        """`feedback`'s checks alone: (indices, losses) as int64 / float64 arrays, or the error it would raise."""
        return self._checked(batch, loss)[:2]

    @keyword_only("loss", renamed={"indices": "batch", "losses": "loss"})
    def feedback(self, batch: Any, *, loss: Any) -> None:
        """Per-example training losses (``loss``) for a `MixtureBatch` this sampler drew, or for indices it drew
        (numpy or torch, any device). 1.0's ``feedback(indices, losses)`` still works for one release, with a
        DeprecationWarning. The rule gets one step: per source, the mean loss and count;
        with ``within="prioritized"`` each source's `PrioritizedSampler` gets its examples' losses (``loss=``),
        all sources in one call (`SamplerGroup.feedback_losses`).

        Raises a ValueError naming the argument (shape mismatch, a non-finite or negative loss, an index out of
        range or never drawn), and then nothing has changed.
        """
        idx, values, counts, sums, means = self._checked(batch, loss)
        self.mixer.feedback_sums(counts, sums, means)  # the rule checks its arguments before it changes
        if self.samplers:  # checked above: in range, drawn (so handed out by their source), finite, >= 0
            order = np.empty(len(idx), np.int64)
            order_by_source(self.source_of[idx], np.zeros(self.num_sources, np.int64), order)
            # each source's examples, in the order given, to its sampler
            self.group.feedback_losses(counts, self.local_of[idx[order]], values[order])

    # ------------------------------------------------------------------ introspection, checkpoint
    def stats(self) -> dict[str, Any]:
        """See `SourceMixer.stats`: weights, per-source counts drawn and fed back, mean feedback loss."""
        return self.mixer.stats()

    def _config(self) -> dict:
        return {**self.mixer.config(), "sizes": self.sizes.tolist(),
                "members": sha256_bytes(self.members.tobytes())[:16], "within": self.within,
                "prioritized": sorted(self.prioritized_options)}

    def state_dict(self) -> dict:
        """Everything needed to continue the identical stream: generator, permutations and cursors (or each
        source's `PrioritizedSampler`), which indices were drawn, counters and the rule's state. Global: the
        same on every DDP rank and independent of the world size."""
        return {"version": STATE_VERSION, "config": self._config(), **self.mixer.state_dict(),
                "order": self.order.copy(), "cursor": self.cursor.copy(), "passes": self.passes.copy(),
                "drawn": self.drawn.copy(), "sources": [s.state_dict() for s in self.samplers]}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a `state_dict` of a sampler built the same way (sources, batch size, seed, within, rule);
        the next `next_batch` is the one that would have followed. All or nothing: every field is checked first
        (`InvalidState` names the bad one) and a refused state leaves the sampler as it was."""
        where = check_header(state, STATE_VERSION, self._config(), "mixture sampler")
        n, k = self.num_examples, self.num_sources
        mixer = self.mixer.checked_state(state, where)
        order = array(state, "order", where, (n,), "iu", np.int64)
        cursor = array(state, "cursor", where, (k,), "iu", np.int64)
        passes = array(state, "passes", where, (k,), "iu", np.int64)
        require(bool(((cursor >= 0) & (cursor <= self.sizes)).all()),
                f"{where}['cursor'] must lie in [0, size] per source, got {cursor.tolist()}")
        require(not (passes < 0).any(), f"{where}['passes'] must be >= 0")
        if self.within == "uniform":
            for j in range(k):
                segment = np.sort(order[self.offsets[j]:self.offsets[j + 1]])
                require(np.array_equal(segment, np.arange(self.sizes[j])),
                        f"{where}['order'] must hold a permutation of source {j}'s {self.sizes[j]} positions")
        drawn = array(state, "drawn", where, (n,), "b", np.bool_)
        sources = field(state, "sources", where)
        require(isinstance(sources, (list, tuple)) and len(sources) == len(self.samplers),
                f"{where}['sources'] must be a list of {len(self.samplers)} source sampler states")
        load_parts([self.rule, *self.samplers], [field(state, "rule", where), *sources], where)
        # Everything is checked and loaded: from here on nothing can fail.
        self.mixer.commit(mixer)
        self.order, self.cursor, self.passes, self.drawn = order, cursor, passes, drawn

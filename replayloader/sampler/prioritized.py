"""PrioritizedSampler: prioritized sampling over the N indices of a fixed dataset, driven by training feedback.

The paper's remark that replay "can also be treated as an importance sampling technique if we directly use it to
hold the training set", made concrete: the dataset stays where it is; only its indices live in a `SumTree`, with
P(i) = (1 - eps) * w_i^alpha / sum_j w_j^alpha + eps / N, and the weights come from the same strategy objects
as the buffer's (an `Initializer` for examples without feedback yet, a `WeightUpdate` for feedback). Nothing is
evicted: the set is fixed.

Why the warm-up is one shuffled pass (and not "max weight until first visit"): a pass visits every example
exactly once in N / batch_size steps, a bound that weighted sampling with replacement cannot give, and the
first prioritized epoch then starts from a measured weight for every example instead of a guess.

Epochs: an epoch is ``len(sampler)`` = ceil(N / batch_size) batches, in the warm-up pass and after it.
Feedback carries the epoch its batch was drawn in (pass the `SampledBatch` itself); feedback for an index that
was handed out again in a later epoch is *stale* (a fresher measurement of it is on its way): it is skipped and
counted, so a weight never goes back in time across an epoch. Plain index arrays are treated as fresh.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..kernels.rng import permutation, seed_state, uniforms
from ..strategies.feedback import check_values, read_feedback
from ..kernels.sampler import OUT_OF_RANGE, apply_feedback, prioritized_draws, resolve_feedback, write_floored
from ..state.checks import array, counters, field, finite_nonnegative, integer, require, rng_words, check_header
from ..strategies import Initializer, LossValue, MeanWeight, WeightUpdate
from ..sumtree import SAMPLINGS, SumTree
from .. import _checks as checks
from .. import schedules
from ..schedules import LinearSchedule, value_at  # noqa: F401 (LinearSchedule: re-exported from its 0.1 home)
from .._moved import renamed

STATE_VERSION = 1


@dataclass
class SampledBatch:
    """One batch of dataset indices, in the field order of every batch record (`Sample`): what was drawn, then
    ``probabilities`` and the importance ``weights`` (P_min / P_i)^beta (all 1 when beta is None or during the
    warm-up pass). ``epoch`` and ``step`` stamp when it was drawn: ``step`` is the global batch number, the
    batches this sampler drew before this one."""

    indices: np.ndarray
    probabilities: np.ndarray
    weights: np.ndarray
    epoch: int
    step: int

    def __len__(self) -> int:
        return len(self.indices)


class _View:
    """The `BufferView` an initializer reads. Every index is stored (size N) once any weight has been measured;
    before that the view is empty, so `MeanWeight` gives its default. The mean weight is over measured examples."""

    def __init__(self, sampler: PrioritizedSampler) -> None:
        self._s = sampler
        self.capacity = sampler.num_examples

    @property
    def size(self) -> int:
        return self.capacity if self._s.measured.any() else 0

    @property
    def weights(self) -> np.ndarray:
        return self._s.weights

    @property
    def visits(self) -> np.ndarray:
        return self._s.visits

    @property
    def features(self) -> np.ndarray | None:
        return self._s.features

    def mean_weight(self) -> float:
        measured = self._s.measured
        return float(self._s.weights[measured].mean()) if measured.any() else 0.0


class PrioritizedSampler:
    """Batches of dataset indices drawn by learned weight, P(i) ∝ w_i^alpha, with feedback through `feedback`.

    Args:
        num_examples: N, the dataset size.
        batch_size: indices per batch (draws are with replacement after the warm-up).
        alpha: prioritization exponent (0: uniform).
        beta: importance-weight exponent, a number or a schedule ``step -> beta`` (e.g. `LinearSchedule`);
            None: every importance weight is 1.
        update: turns feedback into weights (default `LossValue`: weight = the latest loss).
        init: weight of examples without feedback yet (default `MeanWeight`: the mean measured weight).
        sampling: "stratified" (one draw per equal segment of the mass) or "independent".
        uniform_fraction: eps, the share of draws taken uniformly (robustness to noisy feedback).
        floor: smallest weight (> 0), so that no example becomes unreachable.
        warmup_epochs: shuffled passes over all indices before prioritization (0: prioritize from the start).
        features: (N, d) rows for feature-based initializers (`LinUCB`, `LeastSquares`).
        seed: seed of the sampler's generator (its state is checkpointed).

    Feedback above ``max_weight`` (`SumTree.max_weight`: about 8.6e301 ** (1 / max(alpha, 1)) for a million
    examples) is refused, as its priority would overflow the tree.
    """

    def __init__(self, num_examples: int, batch_size: int, *, alpha: float = 1.0,
                 beta: float | Callable[[int], float] | None = None, update: WeightUpdate | None = None,
                 init: Initializer | None = None, sampling: str = "stratified", uniform_fraction: float = 0.0,
                 floor: float = 1e-6, warmup_epochs: int = 1, features: Any = None, seed: int | None = None) -> None:
        self.num_examples = checks.integer("num_examples", num_examples, 1)
        self.batch_size = checks.integer("batch_size", batch_size, 1)
        self.alpha = checks.number("alpha", alpha, 0.0)
        self.beta = schedules.check("beta", beta)
        self.sampling = checks.one_of("sampling", sampling, SAMPLINGS)
        self.uniform_fraction = checks.number("uniform_fraction", uniform_fraction, 0.0, 1.0)
        self.floor = checks.number("floor", floor, 0.0, low_open=True)
        self.warmup_epochs = checks.integer("warmup_epochs", warmup_epochs, 0)
        self.update_rule = LossValue() if update is None else update
        self.init = MeanWeight() if init is None else init
        for name, value, kind in (("update", self.update_rule, WeightUpdate), ("init", self.init, Initializer)):
            if not isinstance(value, kind):
                raise TypeError(f"{name} must be a {kind.__name__}, got {type(value).__name__}")
        self.features = None if features is None else np.asarray(features, np.float64)
        if self.features is not None and (self.features.ndim != 2 or len(self.features) != self.num_examples):
            raise ValueError(f"features must have shape ({self.num_examples}, d), got {self.features.shape}")
        if self.init.feature_based and self.features is None:
            raise ValueError(f"init {self.init.name!r} is feature based: pass features= of shape "
                             f"({self.num_examples}, d)")
        self.seed = seed
        self.tree = SumTree(self.num_examples, min_priority=True, min_key=False, raw_sum=False)
        self.max_weight = self.tree.max_weight(self.alpha)  # the largest weight feedback may set
        checks.number("floor", self.floor, 0.0, self.max_weight)
        self._view = _View(self)
        self.update_rule.bind(self.num_examples)
        self._seen = np.zeros(self.num_examples, np.bool_)  # scratch of `resolve_feedback`
        self._reset_state(seed_state(seed))

    def _reset_state(self, rng: np.ndarray) -> None:
        n = self.num_examples
        self.rng_state = rng
        self.weights = np.zeros(n)
        self.visits = np.zeros(n, np.int64)
        self.measured = np.zeros(n, bool)  # the weight came from feedback, not from the initializer
        self.last_drawn_epoch = np.full(n, -1, np.int64)
        self.epoch = 0
        self.position = 0  # batches drawn in the current epoch
        self.step = 0  # batches drawn in all
        self.order = np.empty(0, np.int64)  # the warm-up pass's permutation (empty outside the warm-up)
        self.counters = {"drawn": 0, "uniform_draws": 0, "updated": 0, "stale_feedback": 0}
        self._score_unmeasured()

    # ------------------------------------------------------------------ weights
    def _set_weights(self, indices: np.ndarray, weights: np.ndarray | float) -> None:
        # One weight each, even when the initializer gave one number for all, and w^alpha by the buffer's own
        # kernel: a restored tree, rebuilt from per-index weights, then holds the very same priorities.
        indices = np.ascontiguousarray(indices, np.int64).reshape(-1)
        if len(indices) and (indices.min() < 0 or indices.max() >= self.num_examples):  # an initializer's answer
            raise IndexError(f"weights set for indices outside [0, {self.num_examples}): {indices.min()} .. "
                             f"{indices.max()}")
        weights = np.ascontiguousarray(np.broadcast_to(np.asarray(weights, np.float64), indices.shape))
        write_floored(self.tree.nodes, self.tree.layout, self.weights, self.alpha, self.floor, indices, weights)

    def _score_unmeasured(self) -> None:
        """Examples without feedback get the initializer's current weight (e.g. the mean measured weight)."""
        unmeasured = np.flatnonzero(~self.measured)
        if len(unmeasured):
            features = None if self.features is None else self.features[unmeasured]
            self._set_weights(unmeasured, self.init.initial_weights(self._view, len(unmeasured), features))

    def probabilities(self, indices: Any = None) -> np.ndarray:
        """P(i) of the prioritized phase, mixed with the uniform share (all N, or the given indices)."""
        p = self.tree.get(np.arange(self.num_examples) if indices is None else indices)
        eps = self.uniform_fraction
        return (1.0 - eps) * p / self.tree.total + eps / self.num_examples

    def current_beta(self) -> float | None:
        return value_at("beta", self.beta, self.step)

    # ------------------------------------------------------------------ drawing
    def __len__(self) -> int:
        """Steps (batches) per epoch."""
        return math.ceil(self.num_examples / self.batch_size)

    @property
    def in_warmup(self) -> bool:
        return self.epoch < self.warmup_epochs

    def __iter__(self) -> Iterator[SampledBatch]:
        """The remaining batches of the current epoch (all of them when it has not started)."""
        while True:
            epoch = self.epoch
            yield self.next_batch()
            if self.epoch != epoch:
                return

    def next_batch(self) -> SampledBatch:
        """Draw the next batch; after the epoch's last batch the next epoch begins."""
        epoch, step = self.epoch, self.step
        if self.in_warmup:
            indices, probabilities, weights = self._warmup_batch()
        else:
            indices, probabilities, weights = self._prioritized_batch()
        self._count_drawn(indices, epoch, 1)
        return SampledBatch(indices, probabilities, weights, epoch, step)

    def _count_drawn(self, indices: np.ndarray, epoch: int, batches: int) -> None:
        """The bookkeeping of ``batches`` batches drawn in ``epoch`` (``indices``, all of them): each index
        marked drawn in it, then `_advance`."""
        self.last_drawn_epoch[indices] = epoch
        self._advance(len(indices), batches)

    def _advance(self, drawn: int, batches: int) -> None:
        """``batches`` batches of ``drawn`` indices in all were drawn (and marked); when they end the epoch, the
        next one begins: the warm-up order is dropped and unmeasured examples are rescored."""
        self.counters["drawn"] += drawn
        self.step += batches
        self.position += batches
        if self.position == len(self):
            self.position = 0
            self.epoch += 1
            self.order = np.empty(0, np.int64)
            self._score_unmeasured()

    def _single_draws(self, out: np.ndarray) -> None:
        """Fill ``out`` with the indices of the next ``len(out)`` batches of a sampler whose batch_size is 1, in
        one call: the same indices in the same order, and the same state after, as that many calls of
        `next_batch` (without their records: `MixtureSampler`, which keeps one such sampler per source and sets
        no beta, needs the indices only; tests/core/test_single_draws.py holds the two forms equal).

        Why it can take an epoch's draws together: inside an epoch nothing changes the weights (feedback comes
        between calls, and the epoch's end is where unmeasured examples are rescored), so the draws of one
        epoch are the warm-up order's next entries, or one descent of the tree for all of them."""
        if self.batch_size != 1:
            raise ValueError(f"single draws need a sampler with batch_size=1, this one has {self.batch_size}")
        count, done = len(out), 0
        while done < count:
            epoch, m = self.epoch, min(count - done, self.num_examples - self.position)  # draws left in the epoch
            if self.in_warmup:
                if self.position == 0:
                    self.order = self._warmup_order()
                part = self.order[self.position:self.position + m]
            else:
                # draw j of one index reads two uniforms, [is it uniform?, where], as a batch of one does (and
                # a batch of one is not stratified: its one segment is the whole mass)
                part = self._prioritized_indices(uniforms(self.rng_state, 2 * m), pairs=True, stratified=False)
            out[done:done + m] = part
            self._count_drawn(part, epoch, m)
            done += m

    def _warmup_order(self) -> np.ndarray:
        """The warm-up pass's permutation of the N indices (drawn at the pass's start)."""
        return permutation(self.rng_state, self.num_examples)

    def _warmup_batch(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.position == 0:
            self.order = self._warmup_order()
        start = self.position * self.batch_size
        indices = self.order[start: start + self.batch_size].copy()
        k = len(indices)
        return indices, np.full(k, 1.0 / self.num_examples), np.ones(k)

    def _prioritized_indices(self, u: np.ndarray, *, pairs: bool, stratified: bool) -> np.ndarray:
        """One index per pair of uniforms of ``u`` (see `kernels.sampler.prioritized_draws`): uniformly over the
        N indices with probability uniform_fraction, else from the tree (stratified over its draws or not)."""
        indices = np.empty(len(u) // 2, np.int64)
        n_uniform = prioritized_draws(u, pairs, self.tree.nodes, self.tree.n_leaves, self.uniform_fraction,
                                      self.num_examples, stratified, indices)
        if n_uniform < 0:
            raise ValueError("cannot sample: the total priority is 0")
        self.counters["uniform_draws"] += n_uniform
        return indices

    def _prioritized_batch(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        k = self.batch_size
        indices = self._prioritized_indices(uniforms(self.rng_state, 2 * k), pairs=False,
                                            stratified=self.sampling == "stratified")
        probabilities = self.probabilities(indices)
        beta = self.current_beta()
        if beta is None:
            weights = np.ones(k)
        else:
            p_min = (1.0 - self.uniform_fraction) * self.tree.min_priority() / self.tree.total \
                + self.uniform_fraction / self.num_examples
            weights = (p_min / probabilities) ** beta
        return indices, probabilities, weights

    # ------------------------------------------------------------------ feedback
    update = renamed("feedback")

    def feedback(self, batch: SampledBatch | Any, **feedback: Any) -> int:
        """Feed back per-example signals for a batch (a `SampledBatch`, or its indices): the keywords the update
        rule declares (``loss=`` for the default `LossValue`; ``logits=``/``targets=``/``mask=`` or
        ``grad_bound=`` for `GradBound`; ...). Returns how many weights changed.

        An index given twice counts once, with its last value. Stale feedback is skipped (see the module doc).
        Bad input raises a ValueError/TypeError naming the argument, and nothing changes.
        """
        epoch = batch.epoch if isinstance(batch, SampledBatch) else -1
        indices = self._check_indices(batch.indices if isinstance(batch, SampledBatch) else batch)
        values, source = read_feedback(self.update_rule, feedback, len(indices), "indices")
        if values is not None:
            check_values(source, values, self.max_weight)
        positions = np.empty(len(indices), np.int64)
        bad, why, kept, stale = resolve_feedback(indices, self.last_drawn_epoch, epoch, self._seen, positions)
        if bad >= 0:
            if why == OUT_OF_RANGE:
                raise ValueError(f"indices must lie in [0, {self.num_examples}); indices[{bad}] = {indices[bad]}")
            raise ValueError(f"indices[{bad}] = {indices[bad]} was never handed out by this sampler")
        # Everything is validated: from here on the sampler changes.
        self.counters["stale_feedback"] += stale
        if values is None or kept == 0:
            return 0
        positions = positions[:kept]
        distinct, values = indices[positions], values[positions]
        changed, new_weights = self.update_rule.compute(distinct, values)
        written = -1
        if (type(changed) is np.ndarray and changed.dtype == np.bool_ and changed.shape == distinct.shape
                and type(new_weights) is np.ndarray and new_weights.dtype == np.float64 and new_weights.ndim == 1):
            target = positions  # reused as the output: the positions are read no more
            written = apply_feedback(self.tree.nodes, self.tree.layout, self.weights, self.visits, self.measured,
                                     self.alpha, self.floor, distinct, changed, new_weights, target)
            target = target[:written]
        if written < 0:  # a user's update that answers in another form: the same steps, one at a time
            target = distinct[changed]
            self.visits[distinct] += 1
            if len(target):
                self.measured[target] = True
                self._set_weights(target, new_weights)
        if len(target) and self.init.observes:
            self.init.observe(self._view, target, self.weights[target])
        if self.init.refreshes:
            refreshed = self.init.refresh(self._view)
            if refreshed is not None:
                self._set_weights(*refreshed)
        self.counters["updated"] += len(target)
        return len(target)

    def _check_indices(self, indices: Any) -> np.ndarray:
        return checks.index_array("indices", indices)

    # ------------------------------------------------------------------ introspection, checkpoint
    def settle(self) -> int:
        """Feedback still in flight: none in one process (the DDP sampler's overlapped gather has some), so 0."""
        return 0

    def stats(self) -> dict[str, float]:
        """Counters and weight statistics (O(N); for logging)."""
        out: dict[str, float] = {"epoch": self.epoch, "position": self.position, "step": self.step, **self.counters}
        out.update(weight_min=float(self.weights.min()), weight_mean=float(self.weights.mean()),
                   weight_max=float(self.weights.max()), frac_never_visited=float((self.visits == 0).mean()))
        return out

    def _config(self) -> dict:
        return {"num_examples": self.num_examples, "batch_size": self.batch_size, "alpha": self.alpha,
                "sampling": self.sampling, "uniform_fraction": self.uniform_fraction, "floor": self.floor,
                "warmup_epochs": self.warmup_epochs, "update": self.update_rule.name, "init": self.init.name}

    def state_dict(self) -> dict:
        """A snapshot (copies) of everything needed to continue exactly: weights, position, RNG, strategy memory."""
        return {"version": STATE_VERSION, "config": self._config(), "weights": self.weights.copy(),
                "visits": self.visits.copy(), "measured": self.measured.copy(),
                "last_drawn_epoch": self.last_drawn_epoch.copy(), "epoch": self.epoch, "position": self.position,
                "step": self.step, "order": self.order.copy(), "rng": self.rng_state.copy(),
                "counters": dict(self.counters), "update": self.update_rule.state_dict(),
                "init": self.init.state_dict()}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a `state_dict` of a sampler with the same configuration; the next batch is the one that would
        have followed. All or nothing: every value is checked first (`state_checks.InvalidState` names the bad
        field) and a refused state leaves the sampler exactly as it was."""
        where = check_header(state, STATE_VERSION, self._config(), "sampler")
        n = self.num_examples
        weights = array(state, "weights", where, (n,), "fiu", np.float64)
        finite_nonnegative(weights, f"{where}['weights']")
        visits = array(state, "visits", where, (n,), "iu", np.int64)
        require(not (visits < 0).any(), f"{where}['visits'] must be >= 0")
        measured = array(state, "measured", where, (n,), "b", np.bool_)
        epoch = integer(state, "epoch", where, 0)
        position = integer(state, "position", where, 0, len(self) - 1)
        step = integer(state, "step", where, 0)
        last_drawn = array(state, "last_drawn_epoch", where, (n,), "iu", np.int64)
        require(bool(((last_drawn >= -1) & (last_drawn <= epoch)).all()),
                f"{where}['last_drawn_epoch'] must lie in [-1, epoch={epoch}]")
        order = array(state, "order", where, (-1,), "iu", np.int64)
        in_warmup_pass = epoch < self.warmup_epochs and position > 0
        require(len(order) == (n if in_warmup_pass else len(order)) and len(order) in (0, n)
                and (not len(order) or np.array_equal(np.sort(order), np.arange(n))),
                f"{where}['order'] must be a permutation of the {n} indices during a warm-up pass, else empty "
                f"(got {len(order)} entries at epoch {epoch}, position {position})")
        rng = rng_words(state, "rng", where)
        counts = counters(state, "counters", where, self.counters)
        update_state, init_state = field(state, "update", where), field(state, "init", where)
        previous_update = self.update_rule.state_dict()
        self.update_rule.load_state_dict(update_state)
        try:
            self.init.load_state_dict(init_state)
        except Exception:
            self.update_rule.load_state_dict(previous_update)
            raise
        # Everything is checked: from here on nothing can fail.
        # in place: a `SamplerGroup` holding these arrays keeps seeing this sampler's state
        for mine, loaded in ((self.rng_state, rng), (self.weights, weights), (self.visits, visits),
                             (self.measured, measured), (self.last_drawn_epoch, last_drawn)):
            mine[...] = loaded
        self.epoch, self.position, self.step = epoch, position, step
        self.order = order
        self.counters = counts
        self.tree.clear()
        self._set_weights(np.arange(n), self.weights.copy())

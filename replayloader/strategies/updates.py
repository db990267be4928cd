"""Weight updates: turn per-example feedback into new weights for the sampled examples.

Each update declares the feedback keywords it reads (`value_keywords`, by default just ``feedback_key``;
`array_keywords`), and the buffer and `PrioritizedSampler` accept exactly those (`replayloader.strategies.feedback`), so a
new signal needs nothing but an update that reads it. ``compute`` returns a boolean mask of
the slots whose weight changes and their new weights; every new weight is at least ``floor`` so feedback never
makes an example unreachable (a weight of exactly 0 can still be set on purpose with `SetWeight`). Each rule is
one Numba kernel beside its class, and `compute` is that kernel, so a user's own update written in numpy runs
the same way through `compute`.

Optional fast path (`fused_step`, see `strategies.fused`): a built-in update also offers its rule as one
compiled update step that resolves the ids, applies the rule and writes the weights in a single call. A
subclass that overrides `compute` loses the inherited step, so the buffer never bypasses a rule it was given.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numba import njit

from ..kernels.buffer import forget, resolve_ids, write_rule_result
from .. import _checks as checks
from .._arrays import to_numpy
from ..state.checks import array, finite_nonnegative, require
from .fused import FusedStep, drop_inherited_step, overrides


class WeightUpdate:
    """Base and generic value rule: the new weight is the feedback value, at least ``floor``."""

    name = "update"
    feedback_key: str | None = None  #: the keyword whose values `values` returns by default
    #: The keywords this update reads, declared per class: value keywords carry one finite value >= 0 per example
    #: (checked before `values` sees them; default: ``feedback_key`` alone), array keywords any per-example arrays
    #: that `values` reads and checks itself. A feedback call may carry these and no others.
    value_keywords: tuple[str, ...] = ()
    array_keywords: tuple[str, ...] = ()
    forgets = False  #: whether `on_add` is overridden, set for every subclass: the buffer skips the base's no-op

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        drop_inherited_step(cls, "compute", "fused_step")  # a subclass's own compute / on_add is never bypassed
        drop_inherited_step(cls, "on_add", "fused_on_add")
        cls.forgets = overrides(cls, WeightUpdate, "on_add")
        if "feedback_key" in cls.__dict__ and "value_keywords" not in cls.__dict__:
            cls.value_keywords = () if cls.feedback_key is None else (cls.feedback_key,)

    def __init__(self, floor: float = 1e-6) -> None:
        checks.number("floor", floor, 0)
        self.floor = float(floor)

    def bind(self, capacity: int) -> None:
        """Allocate per-slot memory (called once by the buffer)."""

    def values(self, feedback: Mapping[str, np.ndarray]) -> np.ndarray:
        if self.feedback_key not in feedback:
            raise TypeError(f"feedback() needs the keyword {self.feedback_key!r} for {type(self).__name__}, "
                            f"got {sorted(feedback) or 'none'}")
        return feedback[self.feedback_key]

    def on_add(self, slots: np.ndarray) -> None:
        """Forget per-slot memory of the examples these slots held before."""

    def fused_on_add(self) -> np.ndarray | None:
        """Optional: `on_add` as data for the buffer's add kernel, a float64 per-slot array that it clears at the
        refilled slots (`kernels.buffer.forget`) instead of calling `on_add`; None to have `on_add` called."""
        return None

    def compute(self, slots: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mask of the slots whose weight changes, their new weights) for distinct slots and their values."""
        return floored_values(values, self.floor)

    def fused_step(self) -> FusedStep | None:
        """Optional: ``(step, args)``, this part's `compute` as one compiled update step, or None (the buffer then
        calls `values` → `compute` between its own kernels, with the same result).

        The buffer calls ``step(nodes, layout, meta, weights, alpha, ids, values, limit, next_serial, epoch,
        *args)``, which must return what `kernels.buffer.resolve_ids` returns (``limit`` is the buffer's
        `max_weight`, passed on to it), but with the slots and new weights of the changed examples in place of the
        resolved slots and values, and must have written those weights (`write_rule_result`).
        """
        return floored_step, (self.floor,)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore `state_dict`; a subclass with state checks every value before assigning any (`state_checks`)."""


class SetWeight(WeightUpdate):
    """The caller supplies the weights themselves (``weight=``), e.g. priorities computed elsewhere.

    No floor by default: 0 is legal and means "never sample this example".
    """

    name = "weight"
    feedback_key = "weight"

    def __init__(self, floor: float = 0.0) -> None:
        super().__init__(floor)


class LossValue(WeightUpdate):
    """Plain PER: weight = the example's latest loss. The paper found it worse than loss difference."""

    name = "loss"
    feedback_key = "loss"


class GradNorm(WeightUpdate):
    """Weight = per-example gradient norm, computed by the caller (``grad_norm=``)."""

    name = "grad_norm"
    feedback_key = "grad_norm"


class GradBound(WeightUpdate):
    """Weight = Katharopoulos & Fleuret (2018) upper bound on the per-example gradient norm.

    Pass ``grad_bound=`` directly, or ``logits=``/``targets=`` (and optionally ``mask=``) of a sigmoid
    (binary, same shape as targets) or softmax (one more trailing dim than targets) output layer; the bound is
    then the norm of the loss gradient with respect to those logits.
    """

    name = "grad_bound"
    feedback_key = "grad_bound"
    array_keywords = ("logits", "targets", "mask")

    def values(self, feedback):
        if "grad_bound" in feedback:
            return feedback["grad_bound"]
        if "logits" in feedback and "targets" in feedback:
            logits, targets, mask = feedback["logits"], feedback["targets"], feedback.get("mask")
            if logits.ndim == targets.ndim:
                return grad_bound_sigmoid(logits, targets, mask)
            return grad_bound_softmax(logits, targets, mask)
        raise TypeError("feedback() needs grad_bound=, or logits= and targets=, for GradBound; "
                        f"got {sorted(feedback) or 'none'}")


class LossDifference(WeightUpdate):
    """Paper's loss_diff: remember each example's loss at every visit; from the 2nd visit on, the new weight is
    the change between the previous and the current loss.

    ``mode="abs"`` (default) uses |previous - current|: an example whose loss moves a lot, in either direction,
    is still being learned (or forgotten) and is worth replaying. ``mode="decrease"`` uses previous - current
    and treats an increase as no progress. Either way the weight is at least ``floor``: a loss that did not
    change gives the floor, never 0. The first visit only records the loss and keeps the initial weight.
    A slot sampled twice in one batch counts once (its last value), as for every update.
    """

    name = "loss_diff"
    feedback_key = "loss"

    def __init__(self, mode: str = "abs", floor: float = 1e-6) -> None:
        super().__init__(floor)
        if mode not in ("abs", "decrease"):
            raise ValueError(f"mode must be 'abs' or 'decrease', got {mode!r}")
        self.mode = mode
        self.last_loss = np.empty(0)

    def bind(self, capacity):
        self.last_loss = np.full(capacity, np.nan)

    def on_add(self, slots):
        forget(self.last_loss, slots)

    def fused_on_add(self):
        return self.last_loss

    def compute(self, slots, values):
        return loss_difference(self.last_loss, slots, values, self.floor, self.mode == "abs")

    def fused_step(self):
        return loss_difference_step, (self.last_loss, self.floor, self.mode == "abs")

    def state_dict(self):
        return {"last_loss": self.last_loss.copy(), "mode": self.mode}

    def load_state_dict(self, state):
        where = "loss_diff state"
        last_loss = array(state, "last_loss", where, self.last_loss.shape, "fiu", np.float64)
        finite_nonnegative(last_loss, f"{where}['last_loss']", allow_nan=True)  # NaN: no loss remembered yet
        mode = state.get("mode", self.mode) if isinstance(state, Mapping) else self.mode
        require(mode in ("abs", "decrease"), f"{where}['mode'] must be 'abs' or 'decrease', got {mode!r}")
        self.last_loss, self.mode = last_loss, mode


@njit(cache=True, nogil=True)
def loss_difference(last_loss, slots, losses, floor, absolute):
    """The loss-difference rule: remember each slot's loss; where one was remembered, the new weight is
    max(|previous - current|, floor) (``absolute``) or max(previous - current, floor).

    Returns (mask of the slots that had a previous loss, their new weights). Slots must be distinct.
    """
    n = slots.shape[0]
    seen = np.empty(n, np.bool_)
    weights = np.empty(n, np.float64)
    m = 0
    for j in range(n):
        s = slots[j]
        previous = last_loss[s]
        last_loss[s] = losses[j]
        seen[j] = not np.isnan(previous)
        if seen[j]:
            change = previous - losses[j]
            if absolute:
                change = abs(change)
            weights[m] = change if change > floor else floor
            m += 1
    return seen, weights[:m]


@njit(cache=True, nogil=True)
def floored_values(values, floor):
    """The value rule: every slot changes, to max(value, floor). Returns (mask of all True, new weights)."""
    n = values.shape[0]
    weights = np.empty(n, np.float64)
    for j in range(n):
        v = values[j]
        weights[j] = v if v > floor else floor  # as np.maximum(values, floor) for the values the buffer accepts
    return np.ones(n, np.bool_), weights


@njit(cache=True, nogil=True)
def floored_step(nodes, layout, meta, weights, alpha, ids, values, limit, next_serial, epoch, floor):
    """`WeightUpdate.fused_step`: resolve the ids, apply `floored_values`, write the weights, in one call."""
    status, bad, slots, slot_values, stale, first = resolve_ids(ids, values, limit, meta, next_serial, epoch, True)
    changed, new_weights = floored_values(slot_values, floor)
    target = write_rule_result(nodes, layout, weights, alpha, slots, changed, new_weights)
    return status, bad, target, new_weights, stale, first


@njit(cache=True, nogil=True)
def loss_difference_step(nodes, layout, meta, weights, alpha, ids, values, limit, next_serial, epoch, last_loss,
                         floor, absolute):
    """`LossDifference.fused_step`: resolve the ids, apply `loss_difference`, write the weights, in one call."""
    status, bad, slots, slot_values, stale, first = resolve_ids(ids, values, limit, meta, next_serial, epoch, True)
    changed, new_weights = loss_difference(last_loss, slots, slot_values, floor, absolute)
    target = write_rule_result(nodes, layout, weights, alpha, slots, changed, new_weights)
    return status, bad, target, new_weights, stale, first


def grad_bound_sigmoid(logits, targets, mask=None) -> np.ndarray:
    """Per-example norm of d(mean BCE over unmasked positions)/d(logits): ||sigmoid(z) - y|| / n_tokens."""
    z = to_numpy(logits, "logits").astype(np.float64)
    y = to_numpy(targets, "targets").astype(np.float64)
    if z.shape != y.shape:
        raise ValueError(f"logits shape {z.shape} must equal targets shape {y.shape} for a sigmoid head")
    m = np.ones_like(z) if mask is None else to_numpy(mask, "mask").astype(np.float64)
    g = (1.0 / (1.0 + np.exp(-z)) - y) * m
    axes = tuple(range(1, z.ndim))
    count = np.maximum(m.sum(axis=axes), 1.0) if axes else np.ones(len(z))
    return np.sqrt((g * g).sum(axis=axes)) / count if axes else np.abs(g)


def grad_bound_softmax(logits, targets, mask=None) -> np.ndarray:
    """Per-example norm of d(mean cross-entropy over unmasked positions)/d(logits): ||softmax(z) - onehot(y)||."""
    z = to_numpy(logits, "logits").astype(np.float64)
    y = to_numpy(targets, "targets").astype(np.int64)
    if z.shape[:-1] != y.shape:
        raise ValueError(f"logits shape {z.shape} must be targets shape {y.shape} plus a class dimension")
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    np.put_along_axis(p, y[..., None], np.take_along_axis(p, y[..., None], -1) - 1.0, -1)
    m = np.ones(y.shape) if mask is None else to_numpy(mask, "mask").astype(np.float64)
    sq = (p * p).sum(-1) * m
    axes = tuple(range(1, y.ndim))
    if not axes:
        return np.sqrt(sq)
    return np.sqrt(sq.sum(axis=axes)) / np.maximum(m.sum(axis=axes), 1.0)

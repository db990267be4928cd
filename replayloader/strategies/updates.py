"""Weight updates: turn per-example feedback into new weights for the sampled examples.

Each update names the feedback keyword it consumes (``feedback_key``). ``compute`` returns a boolean mask of
the slots whose weight changes and their new weights; every new weight is at least ``floor`` so feedback never
makes an example unreachable (a weight of exactly 0 can still be set on purpose with `SetWeight`). A rule that
needs a loop is one Numba kernel beside its class, and `compute` is that kernel: the buffer only ever calls
`compute`, so a user's own update written in numpy runs the same way.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numba import njit

from ..storage import to_numpy

#: Every feedback keyword the buffer understands; others are rejected as typos.
KNOWN_FEEDBACK = ("loss", "grad_norm", "grad_bound", "weight", "logits", "targets", "mask")


class WeightUpdate:
    name = "update"
    feedback_key: str | None = None

    def __init__(self, floor: float = 1e-6) -> None:
        if not (np.isfinite(floor) and floor >= 0):
            raise ValueError(f"floor must be a finite number >= 0, got {floor!r}")
        self.floor = float(floor)

    def bind(self, capacity: int) -> None:
        """Allocate per-slot memory (called once by the buffer)."""

    def values(self, feedback: Mapping[str, np.ndarray]) -> np.ndarray:
        if self.feedback_key not in feedback:
            raise TypeError(f"update() needs the keyword {self.feedback_key!r} for {type(self).__name__}, "
                            f"got {sorted(feedback) or 'none'}")
        return feedback[self.feedback_key]

    def on_add(self, slots: np.ndarray) -> None:
        """Forget per-slot memory of the examples these slots held before."""

    def compute(self, slots: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.ones(len(slots), bool), np.maximum(values, self.floor)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: Mapping) -> None:
        pass


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

    def values(self, feedback):
        if "grad_bound" in feedback:
            return feedback["grad_bound"]
        if "logits" in feedback and "targets" in feedback:
            logits, targets, mask = feedback["logits"], feedback["targets"], feedback.get("mask")
            if logits.ndim == targets.ndim:
                return grad_bound_sigmoid(logits, targets, mask)
            return grad_bound_softmax(logits, targets, mask)
        raise TypeError("update() needs grad_bound=, or logits= and targets=, for GradBound; "
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
        self.last_loss[slots] = np.nan

    def compute(self, slots, values):
        return loss_difference(self.last_loss, slots, values, self.floor, self.mode == "abs")

    def state_dict(self):
        return {"last_loss": self.last_loss.copy(), "mode": self.mode}

    def load_state_dict(self, state):
        self.last_loss = np.array(state["last_loss"], np.float64)
        self.mode = state.get("mode", self.mode)


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

"""Mixing rules: how the sampling weights over K sources follow from per-source training loss.

A rule is a small object (`MixingRule`): `weights()` is the distribution over sources the next batch is drawn
from, and `feedback(source_losses, source_counts)` takes one step's per-source mean training loss. The sampler
does the bookkeeping (which example belongs to which source, per-source means, DDP); a rule sees K numbers a
step and nothing else, so a new rule is a few lines of numpy and every rule is written once, here.

- `FixedMixture`: constant proportions (`natural`: by source size; `stratified`: uniform). The baselines.
- `ODM`: Online Data Mixing (Albalak, Pan, Raffel & Wang 2023), EXP3 with the training loss as reward.
- `ExcessLoss`: DoReMi-style multiplicative weights on the loss above a per-source reference loss.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .. import _checks as checks
from ..state.checks import array, check_header, integer, require

STATE_VERSION = 1
SUM_TOLERANCE = 1e-6  # proportions must sum to 1 within this


@runtime_checkable
class MixingRule(Protocol):
    """What `MixtureSampler` needs of a rule.

    ``num_sources`` is K (None until `bind` when the rule can learn it from the sampler, as `ODM` does).
    `weights` returns K finite non-negative numbers summing to 1; `feedback` gets, per source, the mean training
    loss of the examples fed back in one step (0.0 where ``source_counts`` is 0: that source was not seen).
    """

    num_sources: int | None

    def bind(self, num_sources: int) -> None: ...

    def weights(self) -> np.ndarray: ...

    def feedback(self, source_losses: np.ndarray, source_counts: np.ndarray) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: Mapping) -> None: ...


def _bind(rule: Any, num_sources: int) -> None:
    """The one check of `bind`: a rule built for K sources serves only a sampler of K sources."""
    checks.integer("num_sources", num_sources, 1)
    if rule.num_sources is not None and rule.num_sources != num_sources:
        raise ValueError(f"{type(rule).__name__} was built for {rule.num_sources} sources but the sampler has "
                         f"{num_sources}")
    rule.num_sources = int(num_sources)


def _bound(rule: Any) -> int:
    if rule.num_sources is None:
        raise RuntimeError(f"{type(rule).__name__} does not know its number of sources yet: give it to a "
                           f"MixtureSampler (or call bind(K))")
    return rule.num_sources


def proportions_vector(name: str, values: Any) -> np.ndarray:
    """``values`` as a 1-D float64 array of non-negative finite numbers summing to 1 (within `SUM_TOLERANCE`),
    renormalised to sum to 1 exactly; else a ValueError naming ``name``."""
    arr = np.asarray(values, dtype=np.float64) if not isinstance(values, np.ndarray) else values.astype(np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {arr.shape}")
    bad = np.flatnonzero(~np.isfinite(arr) | (arr < 0))
    if len(bad):
        raise ValueError(f"{name} must be finite and >= 0; {name}[{bad[0]}] = {float(arr[bad[0]])!r}")
    total = float(arr.sum())
    if abs(total - 1.0) > SUM_TOLERANCE:
        raise ValueError(f"{name} must sum to 1 (within {SUM_TOLERANCE}), got {total!r}")
    return arr / total


def losses_and_counts(rule: Any, source_losses: Any, source_counts: Any) -> tuple[np.ndarray, np.ndarray]:
    """The one check of a rule's `feedback` arguments: K finite losses and K counts >= 0, at least one > 0."""
    k = _bound(rule)
    losses = np.asarray(source_losses, dtype=np.float64)
    counts = np.asarray(source_counts)
    if losses.shape != (k,) or counts.shape != (k,):
        raise ValueError(f"source_losses and source_counts must have shape ({k},), got {losses.shape} and "
                         f"{counts.shape}")
    if counts.dtype.kind not in "iu" or (counts < 0).any() or not counts.any():
        raise ValueError(f"source_counts must be integers >= 0, at least one > 0, got {counts.tolist()}")
    checks.all_finite("source_losses", losses)
    return losses, counts.astype(np.int64)


# ----------------------------------------------------------------------------- fixed proportions
class FixedMixture:
    """Constant proportions: every batch is drawn from the same distribution over sources; feedback is ignored.

    Why it is here: it is the baseline every online rule must beat, and the stratified mixture is a strong one
    (several published mixing methods do not beat it). Use `natural` to sample as if the sources were one
    shuffled dataset, `stratified` for equal shares.

    Args:
        proportions: K finite numbers >= 0 that sum to 1 (within 1e-6).
    """

    def __init__(self, proportions: Sequence[float] | np.ndarray) -> None:
        self.proportions = proportions_vector("proportions", proportions)
        self.num_sources: int | None = len(self.proportions)

    @classmethod
    def natural(cls, sizes: Sequence[int] | np.ndarray) -> FixedMixture:
        """Proportional to the source sizes: the mixture of one shuffled pass over all examples."""
        arr = np.asarray(sizes)
        if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu" or (arr <= 0).any():
            raise ValueError(f"sizes must be a non-empty 1-D sequence of integers > 0, got {np.asarray(sizes)!r}")
        return cls(arr / arr.sum())

    @classmethod
    def stratified(cls, num_sources: int) -> FixedMixture:
        """Equal shares, 1/K each, whatever the sizes (small sources are repeated more often)."""
        k = checks.integer("num_sources", num_sources, 1)
        return cls(np.full(k, 1.0 / k))

    def bind(self, num_sources: int) -> None:
        _bind(self, num_sources)

    def weights(self) -> np.ndarray:
        return self.proportions.copy()

    def feedback(self, source_losses: np.ndarray, source_counts: np.ndarray) -> None:
        """Checked, then ignored: the proportions are fixed."""
        losses_and_counts(self, source_losses, source_counts)

    def _config(self) -> dict:
        return {"rule": "FixedMixture", "proportions": self.proportions.tolist()}

    def state_dict(self) -> dict:
        return {"version": STATE_VERSION, "config": self._config()}

    def load_state_dict(self, state: Mapping) -> None:
        check_header(state, STATE_VERSION, self._config(), "FixedMixture")


# ----------------------------------------------------------------------------- ODM (EXP3)
def exploration_rate(t: int, num_sources: int) -> float:
    """ε_t = min(1/K, sqrt(ln K / (K·t))) for t >= 1, and ε_0 = 1/K (ODM's decaying exploration)."""
    k = num_sources
    return 1.0 / k if t == 0 else min(1.0 / k, math.sqrt(math.log(k) / (k * t)))


class ODM:
    """Online Data Mixing: EXP3 over sources with the training loss as reward (Albalak et al. 2023).

    Each source is an arm of an adversarial bandit. A source whose examples still have a high training loss has
    more left to teach, so its loss is its reward; the feedback is free, because the training forward pass
    already computed it. After t feedback steps the weights are

        π_k = (1 − K·ε_{t+1}) · softmax(ε_t · R̂)_k + ε_{t+1}

    - ``R̂_k``: the smoothed importance-weighted reward estimate of source k (0 at the start);
    - ``ε_t = min(1/K, sqrt(ln K / (K·t)))``, ε_0 = 1/K: the exploration rate, decaying like 1/sqrt(t), so
      every source keeps probability >= ε and early weights stay near uniform;
    - ``softmax(ε · R̂)``: exploitation, a Gibbs distribution whose inverse temperature is the (previous)
      exploration rate: it flattens as ε decays unless the reward estimates grow, so with losses of a few nats
      the weights stay near uniform for many steps.

    On `feedback`, for each source k seen in the step (``count_k > 0``), with r_k its mean loss in that step
    and π_k the current weight:

        R̂_k ← α · R̂_k + (1 − α) · r_k / π_k

    The division by π_k is EXP3's importance weighting: a source drawn rarely gets a proportionally larger
    update when it is seen, so a rarely drawn source is not starved of credit. Sources not seen keep R̂_k.

    Deviation from the paper, stated: the paper draws one source per batch; here a batch mixes sources, and
    every source present in the step is updated with its own mean loss (``r_k``), with π_k its current weight.
    With prefetching (DataLoader workers, Accelerate) π_k is the weight at feedback time, which may be a few
    steps newer than the one the batch was drawn with.

    Args:
        num_sources: K; None (default) takes it from the `MixtureSampler` the rule is given to.
        smoothing: α in [0, 1), the weight of the old estimate in the moving average (default 0.9).
    """

    def __init__(self, num_sources: int | None = None, *, smoothing: float = 0.9) -> None:
        self.num_sources = checks.optional_integer("num_sources", num_sources, 1)
        self.smoothing = checks.number("smoothing", smoothing, 0.0, 1.0)
        if self.smoothing >= 1.0:
            raise ValueError(f"smoothing must be a finite number >= 0 and < 1, got {smoothing!r}")
        self.rewards = np.zeros(0)
        self.t = 0  # feedback steps taken
        if self.num_sources is not None:
            self.rewards = np.zeros(self.num_sources)

    def bind(self, num_sources: int) -> None:
        fresh = self.num_sources is None
        _bind(self, num_sources)
        if fresh:
            self.rewards = np.zeros(self.num_sources)

    def exploration(self) -> float:
        """ε of the next draw, ε_{t+1}."""
        return exploration_rate(self.t + 1, _bound(self))

    def weights(self) -> np.ndarray:
        k = _bound(self)
        eps, previous = exploration_rate(self.t + 1, k), exploration_rate(self.t, k)
        logits = previous * self.rewards
        gibbs = np.exp(logits - logits.max())
        gibbs /= gibbs.sum()
        return (1.0 - k * eps) * gibbs + eps

    def feedback(self, source_losses: np.ndarray, source_counts: np.ndarray) -> None:
        losses, counts = losses_and_counts(self, source_losses, source_counts)
        pi = self.weights()
        seen = counts > 0
        a = self.smoothing
        rewards = self.rewards.copy()
        rewards[seen] = a * rewards[seen] + (1.0 - a) * losses[seen] / pi[seen]
        self.rewards, self.t = rewards, self.t + 1

    def _config(self) -> dict:
        return {"rule": "ODM", "num_sources": _bound(self), "smoothing": self.smoothing}

    def state_dict(self) -> dict:
        return {"version": STATE_VERSION, "config": self._config(), "rewards": self.rewards.copy(), "t": self.t}

    def load_state_dict(self, state: Mapping) -> None:
        where = check_header(state, STATE_VERSION, self._config(), "ODM")
        rewards = array(state, "rewards", where, (_bound(self),), "f", np.float64)
        require(bool(np.isfinite(rewards).all()), f"{where}['rewards'] must be finite")
        t = integer(state, "t", where, 0)
        self.rewards, self.t = rewards, t


# ----------------------------------------------------------------------------- excess loss (DoReMi-style)
class ExcessLoss:
    """Multiplicative weights on excess loss, as DoReMi's domain reweighting (Xie et al. 2023), online.

    A source whose training loss is still above what a reference model reaches on it has learnable signal left;
    a source at or below its reference loss is either learned or irreducibly noisy, and gets no credit. The
    reference losses are yours (e.g. a small model trained on the natural mixture, evaluated per source).
    Per feedback step, with r_k the mean loss of source k in the step:

        λ_k = max(r_k − reference_k, 0)     (0 for a source not seen in the step)
        w'_k = w_k · exp(η · λ_k)
        w_k ← (1 − c) · w'_k / Σ_j w'_j + c / K

    - ``η`` (``step_size``): how fast weight moves toward high excess loss;
    - ``c`` (``smoothing``): the share mixed in from uniform, so no source's weight reaches 0.

    Differences from DoReMi, stated: DoReMi clips the excess loss per token before averaging and trains a
    separate proxy model whose *averaged* weights are then used for the real run; here the clip applies to the
    step's per-source mean and the current weights drive the same run's sampling.

    Args:
        reference_losses: K finite numbers, the reference loss of each source.
        step_size: η > 0 (default 1.0).
        smoothing: c in [0, 1] (default 1e-3).
        initial: starting weights (default uniform), K numbers >= 0 summing to 1.
    """

    def __init__(self, reference_losses: Sequence[float] | np.ndarray, *, step_size: float = 1.0,
                 smoothing: float = 1e-3, initial: Sequence[float] | np.ndarray | None = None) -> None:
        reference = np.asarray(reference_losses, dtype=np.float64)
        if reference.ndim != 1 or reference.size == 0:
            raise ValueError(f"reference_losses must be a non-empty 1-D sequence, got shape {reference.shape}")
        checks.all_finite("reference_losses", reference)
        self.reference = reference
        self.num_sources: int | None = len(reference)
        self.step_size = checks.number("step_size", step_size, 0.0, low_open=True)
        self.smoothing = checks.number("smoothing", smoothing, 0.0, 1.0)
        k = len(reference)
        self.initial = np.full(k, 1.0 / k) if initial is None else proportions_vector("initial", initial)
        if self.initial.shape != (k,):
            raise ValueError(f"initial must have {k} entries (one per reference loss), got {len(self.initial)}")
        self._weights = self.initial.copy()
        self.t = 0

    def bind(self, num_sources: int) -> None:
        _bind(self, num_sources)

    def weights(self) -> np.ndarray:
        return self._weights.copy()

    def excess(self, source_losses: np.ndarray, source_counts: np.ndarray) -> np.ndarray:
        """λ: the clipped excess loss per source (0 for sources not seen)."""
        losses, counts = losses_and_counts(self, source_losses, source_counts)
        return np.where(counts > 0, np.maximum(losses - self.reference, 0.0), 0.0)

    def feedback(self, source_losses: np.ndarray, source_counts: np.ndarray) -> None:
        excess = self.excess(source_losses, source_counts)
        with np.errstate(divide="ignore"):  # a weight of exactly 0 (initial, c = 0) stays 0
            log_w = np.log(self._weights) + self.step_size * excess
        log_w -= log_w.max()
        w = np.exp(log_w)
        k = len(w)
        self._weights = (1.0 - self.smoothing) * w / w.sum() + self.smoothing / k
        self.t += 1

    def _config(self) -> dict:
        return {"rule": "ExcessLoss", "reference_losses": self.reference.tolist(), "step_size": self.step_size,
                "smoothing": self.smoothing, "initial": self.initial.tolist()}

    def state_dict(self) -> dict:
        return {"version": STATE_VERSION, "config": self._config(), "weights": self._weights.copy(), "t": self.t}

    def load_state_dict(self, state: Mapping) -> None:
        where = check_header(state, STATE_VERSION, self._config(), "ExcessLoss")
        weights = array(state, "weights", where, (len(self.reference),), "f", np.float64)
        require(bool((np.isfinite(weights) & (weights >= 0)).all()) and abs(weights.sum() - 1.0) <= SUM_TOLERANCE,
                f"{where}['weights'] must be finite, >= 0 and sum to 1, got {weights.tolist()}")
        t = integer(state, "t", where, 0)
        self._weights, self.t = weights, t

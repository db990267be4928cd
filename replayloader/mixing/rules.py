"""Mixing rules: how the sampling weights over K sources follow from per-source training loss.

A rule is a small object (`MixingRule`): `weights()` is the distribution over sources the next batch is drawn
from, and `feedback(source_losses, source_counts)` takes one step's per-source mean training loss. The sampler
does the bookkeeping (which example belongs to which source, per-source means, DDP); a rule sees K numbers a
step and nothing else, so a new rule is a few lines of numpy and every rule is written once, here.

- `FixedMixture`: constant proportions (`natural`: by source size; `stratified`: uniform). The baselines.
- `ODM`: Online Data Mixing as its authors released it (Albalak, Pan, Raffel & Wang 2023): weights linear in
  a smoothed exp(loss), after a warm-up; `ODMExp3`: their EXP3 updater (a cumulative importance-weighted
  estimate in a softmax).
- `ExcessLoss`: DoReMi's multiplicative weights on the loss above a per-source reference loss.

A rule may also offer ``estimates()`` (per-source arrays, e.g. the reward estimate and the exploration term);
`MixtureSampler.stats` and its weight log show them.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .. import _checks as checks
from ..state.checks import InvalidState, array, check_header, integer, require

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


@runtime_checkable
class ReportsEstimates(Protocol):
    """A rule that shows what its weights follow from: per-source arrays by name (e.g. ``reward`` and
    ``exploration`` for `ODM`), shown by `MixtureSampler.stats` and written to its weight log."""

    def estimates(self) -> dict[str, np.ndarray]: ...


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
    if counts.dtype.kind not in "iu" or counts.min() < 0 or counts.max() == 0:
        raise ValueError(f"source_counts must be integers >= 0, at least one > 0, got {counts.tolist()}")
    if not np.isfinite(losses.sum()):  # once a step: one reduction; the entry is named only when one is bad
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


# ----------------------------------------------------------------------------- ODM, as its authors released it
ODM_STATE_VERSION = 2  # version 1 was replayloader 1.x's ODM, an EMA of loss/π in a softmax that could not move
ODM_WARMUP_STEPS = 2000  # the authors' 1B scripts: 2,000 warm-up steps of a 100,000-step run


def exploration_rate(t: int, num_sources: int) -> float:
    """ε_t = min(1/K, sqrt(ln K / (K·t))) for t >= 1, and ε_0 = 1/K: ODM's exploration, decaying like 1/sqrt(t)
    in the global step t (warm-up steps included, as in the authors' code)."""
    k = num_sources
    return 1.0 / k if t == 0 else min(1.0 / k, math.sqrt(math.log(k) / (k * t)))


class _OnlineMixing:
    """What both released ODM updaters share: K, the warm-up, the step count, the exploration rate, the
    current probabilities and the reward estimates, and their validated state. A subclass supplies `_update`,
    the one place its rule is written, and `_config`.

    The schedule is the authors' (`UpdateScheduler.requires_update` and `DynamicDataSamplingWeight.group_update`
    in ``megatron/data/data_sampling_utils.py``): feedback call t (1-based, the global step) updates the weights
    only when t > ``warmup_steps``; until then the weights stay ``initial`` and nothing is estimated.
    """

    _name = "ODM"

    def __init__(self, num_sources: int | None, *, warmup_steps: int,
                 initial: Sequence[float] | np.ndarray | None) -> None:
        self.num_sources = checks.optional_integer("num_sources", num_sources, 1)
        self.warmup_steps = checks.integer("warmup_steps", warmup_steps, 0)
        self.initial = None if initial is None else proportions_vector("initial", initial)
        if self.initial is not None and self.num_sources is not None and len(self.initial) != self.num_sources:
            raise ValueError(f"initial must have {self.num_sources} entries (one per source), got "
                             f"{len(self.initial)}")
        if self.initial is not None and self.num_sources is None:
            self.num_sources = len(self.initial)
        self.t = 0  # feedback calls so far: the global step of the authors' code
        self.rewards = np.zeros(0)
        self.probabilities = np.zeros(0)
        if self.num_sources is not None:
            self._reset()

    def _reset(self) -> None:
        k = self.num_sources
        self.rewards = np.zeros(k)
        self.probabilities = np.full(k, 1.0 / k) if self.initial is None else self.initial.copy()

    def bind(self, num_sources: int) -> None:
        fresh = self.num_sources is None
        _bind(self, num_sources)
        if fresh:
            self._reset()

    def weights(self) -> np.ndarray:
        _bound(self)
        return self.probabilities.copy()

    def exploration(self) -> float:
        """ε of the current weights: 1/K until the first update, then ε_t of the last update's step t."""
        k = _bound(self)
        return exploration_rate(self.t if self.t > self.warmup_steps else 0, k)

    def warming_up(self) -> bool:
        """True while the next feedback leaves the weights as they are (t < warmup_steps: feedback call t + 1 is
        the first update when t == warmup_steps)."""
        return self.t < self.warmup_steps

    def estimates(self) -> dict[str, np.ndarray]:
        """Per source: the reward estimate R̂ and the exploration term ε of the current weights, for `stats` and
        the weight log."""
        k = _bound(self)
        return {"reward": self.rewards.copy(), "exploration": np.full(k, self.exploration())}

    def feedback(self, source_losses: np.ndarray, source_counts: np.ndarray) -> None:
        losses, counts = losses_and_counts(self, source_losses, source_counts)
        t = self.t + 1
        if t > self.warmup_steps:
            rewards, probabilities = self._update(losses, counts, t)  # checks before anything changes
            self.rewards, self.probabilities = rewards, probabilities
        self.t = t

    def _update(self, losses: np.ndarray, counts: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _previous_exploration(self, t: int) -> float:
        """ε of the update before step t (1/K when step t is the first update), the authors' ``prev_eps``."""
        return exploration_rate(t - 1 if t - 1 > self.warmup_steps else 0, _bound(self))

    def _config(self) -> dict:
        return {"rule": type(self).__name__, "num_sources": _bound(self), "warmup_steps": self.warmup_steps,
                "initial": None if self.initial is None else self.initial.tolist()}

    def state_dict(self) -> dict:
        return {"version": ODM_STATE_VERSION, "config": self._config(), "rewards": self.rewards.copy(),
                "probabilities": self.probabilities.copy(), "t": self.t}

    def load_state_dict(self, state: Mapping) -> None:
        k = _bound(self)
        what = type(self).__name__
        if isinstance(state, Mapping) and state.get("version") == 1 and state.get("config", {}).get("rule") == "ODM":
            raise InvalidState(f"{what} state: this state was written by replayloader 1.x's ODM rule, which was "
                               f"replaced by the authors' released rule (the old one could not move its weights); "
                               f"start the rule afresh")
        where = check_header(state, ODM_STATE_VERSION, self._config(), what)
        rewards = array(state, "rewards", where, (k,), "f", np.float64)
        require(bool((np.isfinite(rewards)).all()), f"{where}['rewards'] must be finite")
        probabilities = array(state, "probabilities", where, (k,), "f", np.float64)
        require(bool((np.isfinite(probabilities) & (probabilities >= 0)).all())
                and abs(probabilities.sum() - 1.0) <= SUM_TOLERANCE,
                f"{where}['probabilities'] must be finite, >= 0 and sum to 1, got {probabilities.tolist()}")
        t = integer(state, "t", where, 0)
        self.rewards, self.probabilities, self.t = rewards, probabilities, t


class ODM(_OnlineMixing):
    """Online Data Mixing as its authors released it: the smoothed-mean rule (Albalak, Pan, Raffel & Wang 2023).

    Why: a source whose examples still have a high training loss has more left to teach, and that loss is free,
    since the training forward pass computed it. The authors' README names ``SmoothedMeanWeightUpdater``
    (``megatron/data/data_sampling_utils.py`` in alon-albalak/online-data-mixing) as the paper's rule; on mixed
    minibatches their training loop calls its ``group_update``, which this class implements. After the warm-up,
    at feedback step t, for every source k seen in the step with mean loss r_k:

        R̂_k ← α · R̂_k + (1 − α) · exp(r_k)          (sources not seen keep R̂_k)
        ε_t = min(1/K, sqrt(ln K / (K·t)))
        π_k = (1 − K·ε_t) · R̂_k / Σ_j R̂_j + ε_t      (then normalised to sum to 1)

    The weights are *linear* in the smoothed exponentiated loss, so a source whose loss stays 1 nat above the
    others gets e ≈ 2.7 times their share at once; ε_t keeps every source drawn. No importance weighting
    (``group_update`` does not divide by π): in a mixed batch almost every source is present every step, so
    there is no bandit feedback to correct for.

    Defaults are the authors' (``scripts/train_1B_ema_0.5smoothing.sh``: smoothing 0.5, warm-up 2,000 steps of
    100,000, an update every step). For a shorter run scale the warm-up (``warmup_steps=round(0.02 * steps)``
    keeps their proportion); ε_t counts warm-up steps, as theirs does. Their runs start from the natural mixture
    (the Pile's weights): pass ``initial=sizes / sizes.sum()`` for that; the default is uniform. R̂ starts at
    0, so a source not seen in the first update's step keeps only ε until it is seen.

    Deviation, stated: the authors' reward for a source is the sum of the mean losses of its micro-batches in
    the step (each micro-batch from one source; with 8 micro-batches over 22 sources that is usually one), here
    it is the mean loss of the source's examples in the step, since a batch here mixes sources per example.

    Args:
        num_sources: K; None (default) takes it from the `MixtureSampler` the rule is given to.
        smoothing: α in [0, 1), the weight of the old estimate (default 0.5).
        warmup_steps: feedback steps before the first update (default 2,000).
        initial: the weights until the first update (default uniform), K numbers >= 0 summing to 1.
    """

    def __init__(self, num_sources: int | None = None, *, smoothing: float = 0.5,
                 warmup_steps: int = ODM_WARMUP_STEPS, initial: Sequence[float] | np.ndarray | None = None) -> None:
        if not (isinstance(smoothing, (int, float, np.integer, np.floating)) and not isinstance(smoothing, bool)
                and 0.0 <= smoothing < 1.0):
            raise ValueError(f"smoothing must be a finite number >= 0 and < 1, got {smoothing!r}")
        self.smoothing = float(smoothing)
        super().__init__(num_sources, warmup_steps=warmup_steps, initial=initial)

    def _update(self, losses: np.ndarray, counts: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray]:
        k = len(losses)
        seen = counts > 0
        with np.errstate(over="ignore"):
            rewards_now = np.exp(losses[seen])
        if not np.isfinite(rewards_now).all():
            raise ValueError(f"source_losses must be below {math.log(np.finfo(np.float64).max):.0f} for ODM "
                             f"(its reward is exp(loss)), got {losses[seen].max()!r}")
        rewards = self.rewards.copy()
        a = self.smoothing
        rewards[seen] = a * rewards[seen] + (1.0 - a) * rewards_now
        eps = exploration_rate(t, k)
        weights = (1.0 - k * eps) * rewards / rewards.sum() + eps
        return rewards, weights / weights.sum()

    def _config(self) -> dict:
        return {**super()._config(), "smoothing": self.smoothing}


ODM_REWARD_SCALE = 0.1  # Exp3WeightUpdater divides the loss by 10 "so that cumulative reward doesn't explode"
CORRECTIONS = ("presence", "probability")


class ODMExp3(_OnlineMixing):
    """ODM's EXP3 updater as its authors released it (``Exp3WeightUpdater.group_update``,
    ``megatron/data/data_sampling_utils.py`` in alon-albalak/online-data-mixing).

    Why a second updater: EXP3 is the adversarial bandit the paper's analysis starts from; its *cumulative*
    importance-weighted estimate keeps growing, so the weights keep moving the longer a source's loss stays
    higher (the smoothed-mean rule, `ODM`, instead tracks the current losses). After the warm-up, at feedback
    step t, for every source k seen in the step with mean loss r_k:

        R̂_k ← R̂_k + (s · r_k) / q_k                   (s = 0.1, the authors' reward scale)
        ε_t = min(1/K, sqrt(ln K / (K·t)))
        π_k = (1 − K·ε_t) · exp(ε_{t−1} R̂_k) / Σ_j exp(ε_{t−1} R̂_j) + ε_t     (then normalised)

    where ε_{t−1} is the exploration rate of the previous update (1/K at the first).

    The mixed-batch correction, stated (``correction``): EXP3 divides by the probability that the arm's reward
    is observed. The authors divide by π_k (``"probability"``), right when one source is drawn per step. Here a
    batch of B examples draws its sources per example, so source k is observed with probability
    q_k = 1 − (1 − π_k)^B; the default ``"presence"`` divides by that, which keeps the estimate unbiased for
    mixed batches (B is the number of examples fed back in the step). ``"probability"`` reproduces the
    authors' division by π_k.

    Args:
        num_sources: K; None (default) takes it from the `MixtureSampler` the rule is given to.
        warmup_steps: feedback steps before the first update (default 2,000, the authors').
        initial: the weights until the first update (default uniform).
        correction: "presence" (default) or "probability", see above.
        reward_scale: s > 0, the factor on the loss (default 0.1, the authors').
    """

    def __init__(self, num_sources: int | None = None, *, warmup_steps: int = ODM_WARMUP_STEPS,
                 initial: Sequence[float] | np.ndarray | None = None, correction: str = "presence",
                 reward_scale: float = ODM_REWARD_SCALE) -> None:
        self.correction = checks.one_of("correction", correction, CORRECTIONS)
        self.reward_scale = checks.number("reward_scale", reward_scale, 0.0, low_open=True)
        super().__init__(num_sources, warmup_steps=warmup_steps, initial=initial)

    def observed(self, counts: np.ndarray) -> np.ndarray:
        """q_k: the probability that source k is observed in a step, by ``correction``."""
        pi = self.probabilities
        if self.correction == "probability":
            return pi.copy()
        return -np.expm1(int(counts.sum()) * np.log1p(-np.minimum(pi, 1.0 - 1e-16)))

    def _update(self, losses: np.ndarray, counts: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray]:
        k = len(losses)
        seen = counts > 0
        rewards = self.rewards.copy()
        rewards[seen] += self.reward_scale * losses[seen] / self.observed(counts)[seen]
        eps, previous = exploration_rate(t, k), self._previous_exploration(t)
        logits = previous * rewards
        gibbs = np.exp(logits - logits.max())  # the authors' exp(ε R̂) / Σ, shifted so it cannot overflow
        weights = (1.0 - k * eps) * gibbs / gibbs.sum() + eps
        return rewards, weights / weights.sum()

    def _config(self) -> dict:
        return {**super()._config(), "correction": self.correction, "reward_scale": self.reward_scale}


# ----------------------------------------------------------------------------- excess loss (DoReMi-style)
EXCESS_STATE_VERSION = 2  # version 1 scored an unseen source 0; DoReMi keeps its last score


class ExcessLoss:
    """Multiplicative weights on excess loss, as DoReMi's domain reweighting (Xie et al. 2023), online.

    Why: a source whose training loss is still above what a reference model reaches on it has learnable signal
    left; a source at or below its reference loss is either learned or irreducibly noisy, and gets no credit.
    The reference losses are yours (e.g. a small model trained on the natural mixture, evaluated per source).
    The update is the authors' ``DoReMiTrainer.update_domain_weights`` (``doremi/trainer.py`` in
    sangmichaelxie/doremi, optimizer ``doremiv1``). Per feedback step, with r_k the mean loss of source k:

        λ_k = max(r_k − reference_k, 0)     (a source not seen in the step keeps its last λ_k, 0 at first)
        log w'_k = log w_k + η · λ_k
        w_k ← (1 − c) · w'_k / Σ_j w'_j + c / K

    - ``η`` (``step_size``): how fast weight moves toward high excess loss (the authors' ``reweight_eta``, 1);
    - ``c`` (``smoothing``): the share mixed in from uniform, so no source's weight reaches 0 (their
      ``reweight_eps``; 1e-3 in their README's example, 1e-4 in their 280M script).

    Differences from DoReMi, stated: DoReMi clips the excess loss per token before averaging over a domain's
    tokens and trains a separate proxy model whose *averaged* weights are then used for the real run; here the
    clip applies to the step's per-source mean (the sampler feeds back one mean per source) and the current
    weights drive the same run's sampling.

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
        self.scores = np.zeros(k)  # λ of the last step each source was seen in
        self.t = 0

    def bind(self, num_sources: int) -> None:
        _bind(self, num_sources)

    def weights(self) -> np.ndarray:
        return self._weights.copy()

    def estimates(self) -> dict[str, np.ndarray]:
        """Per source: the excess loss λ the weights last moved by, for `stats` and the weight log."""
        return {"excess": self.scores.copy()}

    def excess(self, source_losses: np.ndarray, source_counts: np.ndarray) -> np.ndarray:
        """λ: the clipped excess loss per source; a source not seen keeps its last λ."""
        losses, counts = losses_and_counts(self, source_losses, source_counts)
        return np.where(counts > 0, np.maximum(losses - self.reference, 0.0), self.scores)

    def feedback(self, source_losses: np.ndarray, source_counts: np.ndarray) -> None:
        excess = self.excess(source_losses, source_counts)
        with np.errstate(divide="ignore"):  # a weight of exactly 0 (initial, c = 0) stays 0
            log_w = np.log(self._weights) + self.step_size * excess
        log_w -= log_w.max()
        w = np.exp(log_w)
        k = len(w)
        self._weights = (1.0 - self.smoothing) * w / w.sum() + self.smoothing / k
        self.scores = excess
        self.t += 1

    def _config(self) -> dict:
        return {"rule": "ExcessLoss", "reference_losses": self.reference.tolist(), "step_size": self.step_size,
                "smoothing": self.smoothing, "initial": self.initial.tolist()}

    def state_dict(self) -> dict:
        return {"version": EXCESS_STATE_VERSION, "config": self._config(), "weights": self._weights.copy(),
                "scores": self.scores.copy(), "t": self.t}

    def load_state_dict(self, state: Mapping) -> None:
        where = check_header(state, EXCESS_STATE_VERSION, self._config(), "ExcessLoss")
        k = len(self.reference)
        weights = array(state, "weights", where, (k,), "f", np.float64)
        require(bool((np.isfinite(weights) & (weights >= 0)).all()) and abs(weights.sum() - 1.0) <= SUM_TOLERANCE,
                f"{where}['weights'] must be finite, >= 0 and sum to 1, got {weights.tolist()}")
        scores = array(state, "scores", where, (k,), "f", np.float64)
        require(bool((np.isfinite(scores) & (scores >= 0)).all()), f"{where}['scores'] must be finite and >= 0")
        t = integer(state, "t", where, 0)
        self._weights, self.scores, self.t = weights, scores, t

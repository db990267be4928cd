"""Score-then-select: which rows of a freshly scored candidate batch to train on.

Online batch selection, SelectiveBackprop and RHO-LOSS share one shape: draw a candidate batch of n_B examples,
score every candidate with a no-grad forward pass, and train on a few of them. They differ in two places only,
so those are the two parts here, each rule written once:

- a `Score` turns the candidates' training losses into selection scores: `TrainingLoss` (the loss itself) or
  `ReducibleLoss` (training loss minus a per-example irreducible loss, RHO-LOSS);
- a `Rule` picks rows by score: `TopK` (the k highest), `Proportional` (k draws with P ∝ score^alpha, with
  importance weights) or `SelectiveBackprop` (each row kept with P = percentile^selectivity of its score among recent
  scores, Jiang et al. 2019, so the number kept varies).

A `Selector` joins one of each with a checkpointable generator. It validates everything before it changes
anything, so a rejected call leaves it exactly as it was. It sees numbers only (numpy, or torch tensors that are
detached and copied); where the candidates come from and how the chosen rows are fetched is the business of
`score_select` (a fixed dataset's sampler, or a replay buffer) and of the torch glue.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..kernels.rng import seed_state, uniforms
from .._arrays import to_numpy
from ..state.checks import counters as counter_fields, field, require, rng_words
from .. import _checks as checks
from .._moved import renamed, renamed_keywords

STATE_VERSION = 1


@dataclass
class Selection:
    """The rows chosen from one candidate batch.

    ``positions``: rows of the candidate batch to train on (into the n_B fetched examples; may repeat for
    `Proportional`). ``indices``: their dataset indices (None when the candidates came without indices).
    ``weights``: their importance weights (the rule's times the candidates' own; all 1 for the biased rules).
    ``scores``: every candidate's score, shape (n_B,). ``probabilities``: every candidate's chance, where the
    rule has one (`Proportional`: P per draw; `SelectiveBackprop`: P(keep)); else None.
    """

    positions: np.ndarray
    indices: np.ndarray | None
    weights: np.ndarray
    scores: np.ndarray
    probabilities: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.positions)


# ---------------------------------------------------------------------------------------------------- scores
class Score:
    """Candidates' training losses -> selection scores."""

    name = "score"

    def check_dataset(self, num_examples: int) -> None:
        """Raise if this score cannot serve a dataset of ``num_examples`` (called when bound to one)."""

    def check_indices(self, indices: np.ndarray | None) -> None:
        """Raise if the candidates' dataset indices (int64, or None) do not suit this score."""

    def __call__(self, losses: np.ndarray, indices: np.ndarray | None) -> np.ndarray:
        raise NotImplementedError


class TrainingLoss(Score):
    """score = training loss (online batch selection, SelectiveBackprop)."""

    name = "training_loss"

    def __call__(self, losses: np.ndarray, indices: np.ndarray | None) -> np.ndarray:
        return losses


class ReducibleLoss(Score):
    """score = training loss − irreducible loss of the example (RHO-LOSS, Mindermann et al. 2022).

    ``irreducible``: one finite loss per training example, indexed by dataset index (e.g. from
    `replayloader.selection.irreducible.irreducible_losses`: a small model trained on held-out data scores every training
    example). Mislabelled or unlearnable examples have a high irreducible loss too, so their reducible loss is
    low and they are not picked, although their training loss is high.
    """

    name = "reducible_loss"

    def __init__(self, irreducible: Any) -> None:
        arr = to_numpy(irreducible, "irreducible")
        if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "fiu":
            raise ValueError(f"irreducible must be a non-empty 1-D array of numbers, got dtype {arr.dtype} "
                             f"shape {arr.shape}")
        arr = np.array(arr, np.float64)
        checks.all_finite("irreducible", arr)
        arr.flags.writeable = False
        self.irreducible = arr

    def check_dataset(self, num_examples: int) -> None:
        if len(self.irreducible) != num_examples:
            raise ValueError(f"irreducible must have one loss per training example ({num_examples}), got "
                             f"{len(self.irreducible)}")

    def check_indices(self, indices: np.ndarray | None) -> None:
        if indices is None:
            raise ValueError("indices are needed: ReducibleLoss reads each candidate's dataset index")
        size = len(self.irreducible)
        out = np.flatnonzero((indices < 0) | (indices >= size))
        if len(out):
            raise ValueError(f"indices must lie in [0, {size}) of irreducible; indices[{out[0]}] = {indices[out[0]]}")

    def __call__(self, losses: np.ndarray, indices: np.ndarray | None) -> np.ndarray:
        return losses - self.irreducible[indices]


# ---------------------------------------------------------------------------------------------------- rules
class Rule:
    """Picks rows by score. ``k``: how many it picks (None: it decides per batch). A rule with memory
    (`SelectiveBackprop`'s history) computes its pick without changing, and returns the memory to commit."""

    name = "rule"
    k: int | None = None
    uses_rng = False

    def pick(self, scores: np.ndarray, rng: np.ndarray, k: int | None) -> tuple[np.ndarray, np.ndarray,
                                                                             np.ndarray | None, Any]:
        """-> (positions, importance weights of those positions, per-candidate probabilities or None,
        new memory or None). ``k``: how many to pick this time (``self.k``, or fewer for a short batch).
        ``rng`` (xoshiro256++ state) may be advanced: it is a scratch copy."""
        raise NotImplementedError

    def commit(self, memory: Any) -> None:
        """Adopt the memory `pick` returned (after the whole call succeeded)."""

    def config(self) -> dict:
        return {"name": self.name, "k": self.k}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: Mapping) -> None:
        pass


def top_k_positions(scores: np.ndarray, k: int) -> np.ndarray:
    """The k highest scores' positions, highest first; ties go to the lower position."""
    return np.argsort(-scores, kind="stable")[:k]


class TopK(Rule):
    """The k highest scores (online batch selection, Loshchilov & Hutter 2015; RHO-LOSS with `ReducibleLoss`).
    Biased by design: importance weights are 1."""

    name = "top_k"

    def __init__(self, k: int) -> None:
        self.k = checks.integer("k", k, 1)

    def pick(self, scores, rng, k):
        return top_k_positions(scores, k), np.ones(k), None, None


def proportional_probabilities(scores: np.ndarray, alpha: float) -> np.ndarray:
    """P_j = max(s_j, 0)^alpha / sum; uniform when every score is <= 0 (0^0 counts as 1: alpha 0 is uniform)."""
    mass = np.maximum(scores, 0.0) ** alpha
    total = mass.sum()
    return mass / total if total > 0 else np.full(len(scores), 1.0 / len(scores))


class Proportional(Rule):
    """k draws with replacement, P_j ∝ max(score_j, 0)^alpha, importance weights (P_min / P_j)^beta over the
    candidates of positive P (≤ 1, PER's normalisation): with beta = 1 the weighted mean of a per-example
    quantity over the chosen rows is, up to the factor n_B * P_min, an unbiased estimate of its candidate mean."""

    name = "proportional"
    uses_rng = True

    def __init__(self, k: int, *, alpha: float = 1.0, beta: float = 1.0) -> None:
        self.k = checks.integer("k", k, 1)
        self.alpha = checks.number("alpha", alpha, 0.0)
        self.beta = checks.number("beta", beta, 0.0)

    def config(self) -> dict:
        return {**super().config(), "alpha": self.alpha, "beta": self.beta}

    def pick(self, scores, rng, k):
        p = proportional_probabilities(scores, self.alpha)
        cdf = np.cumsum(p)
        positions = np.searchsorted(cdf, uniforms(rng, k) * cdf[-1], side="right")
        positions = np.minimum(positions, np.flatnonzero(p > 0)[-1])  # a rounding edge lands on mass, never past
        p_min = p[p > 0].min()
        return positions, (p_min / p[positions]) ** self.beta, p, None


def keep_probabilities(scores: np.ndarray, history: np.ndarray, selectivity: float, min_keep: float) -> np.ndarray:
    """SelectiveBackprop's rule: P(keep) = max(min_keep, percentile^selectivity), where a score's percentile is the
    share of ``history`` (recent scores, this batch's included) at or below it."""
    percentile = np.searchsorted(np.sort(history), scores, side="right") / len(history)
    return np.maximum(min_keep, percentile ** selectivity)


class SelectiveBackprop(Rule):
    """Keep each candidate with P = percentile^selectivity of its score among the last ``history`` scores (this
    batch's included), as in Jiang et al. 2019 (their β; here ``selectivity``, since this library's ``beta`` is
    always the importance exponent). The number kept varies (expected n_B / (selectivity + 1) while scores are
    stationary), never 0: the batch's highest score has percentile 1, so P(keep) = 1. Importance weights are 1.
    ``min_keep`` floors P(keep). 1.0's ``beta=`` still works for one release, with a DeprecationWarning."""

    name = "selective_backprop"
    uses_rng = True
    beta = renamed("selectivity", since="1.1")

    @renamed_keywords(beta="selectivity")
    def __init__(self, *, selectivity: float = 1.0, history: int = 1024, min_keep: float = 0.0) -> None:
        self.selectivity = checks.number("selectivity", selectivity, 0.0)
        self.history = checks.integer("history", history, 1)
        self.min_keep = checks.number("min_keep", min_keep, 0.0, 1.0)
        self.recent = np.empty(0, np.float64)  # oldest first, at most `history`

    def config(self) -> dict:
        return {**super().config(), "selectivity": self.selectivity, "history": self.history,
                "min_keep": self.min_keep}

    @staticmethod
    def _from_1_0(config: dict) -> dict:
        """A 1.0 checkpoint's config (``beta``, before the rename) in 1.1's words."""
        if config.get("name") == "selective_backprop" and "beta" in config and "selectivity" not in config:
            config = {("selectivity" if key == "beta" else key): value for key, value in config.items()}
        return config

    def pick(self, scores, rng, k):
        window = np.concatenate([self.recent, scores])[-self.history:]
        p = keep_probabilities(scores, window, self.selectivity, self.min_keep)
        positions = np.flatnonzero(uniforms(rng, len(scores)) < p)
        return positions, np.ones(len(positions)), p, window

    def commit(self, memory: np.ndarray) -> None:
        self.recent = memory

    def state_dict(self) -> dict:
        return {"recent": self.recent.copy()}

    def load_state_dict(self, state: Mapping) -> None:
        recent = np.array(field(state, "recent", "SelectiveBackprop state"), np.float64)
        require(recent.ndim == 1 and len(recent) <= self.history,
                f"checkpoint history must be 1-D with at most {self.history} scores, got shape {recent.shape}")
        self.recent = recent


# ---------------------------------------------------------------------------------------------------- selector
@runtime_checkable
class SelectorLike(Protocol):
    """What the parts that take a selector (`ScoreThenSelect`, `BufferScoreThenSelect`, the DataLoader's candidate
    sampler, `DistributedScoreThenSelect`) use of it: its ``rule`` (``rule.k`` is n_b) and ``score``, the candidate
    check, the choice on one batch or on per-rank slices, counters and a checkpoint. `Selector` and its wrappers
    (`ReusedPool`, `SelectionSwitch`) are the library's; a class of yours with these members is taken as well."""

    rule: Any
    score: Any

    def check_candidates(self, candidate_size: int, num_examples: int | None = None) -> None: ...

    def choose(self, losses: Any, indices: Any = None, candidate_weights: Any = None,
               before_commit: Any = None, short_batch: bool = False) -> Selection: ...

    def choose_split(self, losses: Sequence[Any], indices: Sequence[Any] | None = None,
                     candidate_weights: Sequence[Any] | None = None, before_commit: Any = None,
                     short_batch: bool = False) -> list[Selection]: ...

    def stats(self) -> dict[str, float]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: Mapping) -> None: ...


class Selector:
    """A `Rule` and a `Score` (default `TrainingLoss`) with their generator: ``choose`` picks the rows of one
    scored candidate batch.

    Args:
        rule: `TopK(k)`, `Proportional(k, alpha, beta)`, `SelectiveBackprop(selectivity=, history=)` or your own `Rule`.
        score: `TrainingLoss()` or `ReducibleLoss(irreducible)`.
        seed: seed of the generator of the randomized rules (its state is checkpointed).
    """

    def __init__(self, rule: Rule, score: Score | None = None, *, seed: int | None = None) -> None:
        if not isinstance(rule, Rule):
            raise TypeError(f"rule must be a Rule (TopK, Proportional, SelectiveBackprop), got {type(rule).__name__}")
        score = TrainingLoss() if score is None else score
        if not isinstance(score, Score):
            raise TypeError(f"score must be a Score (TrainingLoss, ReducibleLoss), got {type(score).__name__}")
        self.rule, self.score = rule, score
        self.rng_state = seed_state(seed)
        self.counters = {"batches": 0, "scored": 0, "selected": 0}

    def check_candidates(self, candidate_size: int, num_examples: int | None = None) -> None:
        """Raise if candidate batches of ``candidate_size`` (n_B) from a dataset of ``num_examples`` cannot be
        served: n_b = rule.k must not exceed n_B, and the score must fit the dataset."""
        if self.rule.k is not None and self.rule.k > candidate_size:
            raise ValueError(f"k (n_b) = {self.rule.k} exceeds the candidate batch size (n_B) = {candidate_size}")
        if num_examples is not None:
            self.score.check_dataset(num_examples)

    def choose(self, losses: Any, indices: Any = None, candidate_weights: Any = None,
               before_commit: Callable[[Selection], None] | None = None, short_batch: bool = False) -> Selection:
        """Pick rows of a candidate batch from its per-example training ``losses`` (numpy or torch, shape (n_B,)).

        ``indices``: the candidates' dataset indices (needed by `ReducibleLoss`); ``candidate_weights``: the
        candidates' own importance weights (from a prioritized draw), multiplied into the chosen rows'.
        ``before_commit(selection)`` runs after every check and before the selector changes (its state: the
        generator, a rule's memory, counters); if it raises, the selector is unchanged. ``short_batch``: the
        batch is the short last one of a pass, so fewer than k candidates pick them all (else k > n_B is an
        error). Bad input raises a ValueError naming the argument and the value, and changes nothing.
        """
        refresh = None if before_commit is None else (lambda selections: before_commit(selections[0]))
        return self.choose_split([losses], [indices], [candidate_weights], refresh, short_batch)[0]

    def choose_split(self, losses: Sequence[Any], indices: Sequence[Any] | None = None,
                     candidate_weights: Sequence[Any] | None = None,
                     before_commit: Callable[[list[Selection]], None] | None = None,
                     short_batch: bool = False) -> list[Selection]:
        """Pick rows of a candidate batch split into S slices (one per DDP rank): slice s chooses k / S of its own
        rows (top-k within the slice, not of the whole batch), the slices in order, each seeing the generator and
        the rule's memory (SelectiveBackprop's history) the previous slice left, as S `choose` calls of a rule
        with k / S would. A slice's positions index that slice.

        Why per slice: under DDP each rank fetched and scored only its slice, and every rank must train the same
        number of rows; a global top-k would need every rank to fetch and score all n_B, or unbalanced ranks.

        ``losses``, ``indices``, ``candidate_weights``: one entry per slice (as for `choose`; ``indices`` None or
        a list of None: no indices). ``before_commit(selections)`` as for `choose`. Every slice is checked before
        anything changes; a rejected call (k not divisible by S, a bad slice) leaves the selector as it was.
        Counters count the whole batch once.
        """
        checked = self._checked_slices(losses, indices, candidate_weights, short_batch)
        k = self.rule.k
        selections = self._pick(checked, None if k is None else k // len(checked), before_commit)
        self.counters["batches"] += 1
        self.counters["scored"] += sum(len(s.scores) for s in selections)
        self.counters["selected"] += sum(len(s) for s in selections)
        return selections

    def _checked_slices(self, losses: Sequence[Any], indices: Sequence[Any] | None,
                        candidate_weights: Sequence[Any] | None, short_batch: bool) -> list[tuple]:
        """Every slice checked and scored (nothing changes): [(scores, indices or None, weights or None), ...]."""
        count = len(losses)
        if count == 0:
            raise ValueError("losses must hold at least one slice, got none")
        k = self.rule.k
        if k is not None and k % count:
            raise ValueError(f"k (n_b) = {k} is not divisible by the {count} slices (ranks): each slice chooses "
                             f"k / {count} of its own candidates")
        indices = [None] * count if indices is None else list(indices)
        candidate_weights = [None] * count if candidate_weights is None else list(candidate_weights)
        for name, parts in (("indices", indices), ("candidate_weights", candidate_weights)):
            if len(parts) != count:
                raise ValueError(f"{name} must hold one entry per slice ({count}), got {len(parts)}")
        return [self._checked_slice(number, count, part, short_batch)
                for number, part in enumerate(zip(losses, indices, candidate_weights))]

    def _pick(self, checked: list[tuple], k: int | None,
              before_commit: Callable[[list[Selection]], None] | None) -> list[Selection]:
        """The rule over checked slices, ``k`` rows each (at most a slice's length; None: the rule decides), the
        slices in order; commits the generator and the rule's memory after ``before_commit`` (if that raises,
        nothing changed). Counters are the caller's."""
        count = len(checked)
        rng, before = self.rng_state.copy(), self.rule.state_dict()
        selections, memory = [], None
        try:
            for number, (scores, slice_indices, slice_weights) in enumerate(checked):
                if number:
                    self.rule.commit(memory)  # the next slice sees this one's scores, as the next call would
                picked, weights, probabilities, memory = self.rule.pick(
                    scores, rng, None if k is None else min(k, len(scores)))
                picked = np.asarray(picked, np.int64)
                if slice_weights is not None:
                    weights = weights * slice_weights[picked]
                selections.append(Selection(picked, None if slice_indices is None else slice_indices[picked],
                                            np.asarray(weights, float), scores, probabilities))
            if before_commit is not None:
                before_commit(selections)
        except BaseException:
            if count > 1:
                self.rule.load_state_dict(before)
            raise
        self.rng_state = rng
        self.rule.commit(memory)
        return selections

    def _checked_slice(self, number: int, slices: int, part: tuple, short_batch: bool):
        """`_checked` for one slice; with several, an error says which slice (rank) it is about."""
        try:
            return self._checked(*part, short_batch, slices)
        except ValueError as exc:
            if slices == 1:
                raise
            raise ValueError(f"slice {number} of {slices} (rank {number}): {exc}") from exc

    def _checked(self, losses: Any, indices: Any, candidate_weights: Any, short_batch: bool, slices: int):
        if indices is not None:
            indices = to_numpy(indices, "indices")
            if indices.ndim != 1 or indices.dtype.kind not in "iu":
                raise ValueError(f"indices must be a 1-D integer array (one per candidate), got dtype "
                                 f"{indices.dtype} shape {indices.shape}")
            indices = np.ascontiguousarray(indices, np.int64)
        arr = to_numpy(losses, "losses")
        if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "fiu":
            raise ValueError(f"losses must be a non-empty 1-D array of numbers (one per candidate), got dtype "
                             f"{arr.dtype} shape {arr.shape}")
        n = len(arr)
        if indices is not None and len(indices) != n:
            raise ValueError(f"losses must have shape ({len(indices)},), one per candidate, got {arr.shape}")
        if not short_batch:
            self.check_candidates(n * slices)  # k / slices of each slice's n
        arr = np.ascontiguousarray(arr, np.float64)
        checks.all_finite("losses", arr)
        self.score.check_indices(indices)
        if candidate_weights is not None:
            candidate_weights = np.asarray(to_numpy(candidate_weights, "candidate_weights"), np.float64)
            if candidate_weights.shape != (n,):
                raise ValueError(f"candidate_weights must have shape ({n},) to match losses, got "
                                 f"{candidate_weights.shape}")
        return np.asarray(self.score(arr, indices), np.float64), indices, candidate_weights

    def stats(self) -> dict[str, float]:
        """Counters: candidate batches, candidates scored (forward rows), rows selected (backward rows), and the
        cost of selection in forward rows: ``forward_rows_per_trained_row`` = scored / selected, the scoring
        forward rows each trained row paid for (n_B / n_b for one step per pool; n_B / (m n_b) with `ReusedPool`),
        on top of the trained row's own forward + backward (docs/selection.md, "Cost model")."""
        c = self.counters
        return {**c, "selected_fraction": c["selected"] / c["scored"] if c["scored"] else 0.0,
                "forward_rows_per_trained_row": c["scored"] / c["selected"] if c["selected"] else 0.0}

    def state_dict(self) -> dict:
        return {"version": STATE_VERSION, "rule": self.rule.config(), "score": self.score.name,
                "rng": self.rng_state.copy(), "memory": self.rule.state_dict(), "counters": dict(self.counters)}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a `state_dict` of a selector with the same rule and score; the next choice is the one that
        would have followed."""
        where = "selector state"  # every check through the shared state checks: InvalidState, nothing changed
        require(isinstance(state, Mapping), f"{where} must be a mapping, got {type(state).__name__}")
        require(state.get("version") == STATE_VERSION,
                f"state version {state.get('version')!r} is not supported (expected {STATE_VERSION})")
        rule, score = field(state, "rule", where), field(state, "score", where)
        if isinstance(rule, Mapping):
            rule = SelectiveBackprop._from_1_0(dict(rule))
        require(isinstance(rule, Mapping) and dict(rule) == self.rule.config() and score == self.score.name,
                f"checkpoint has rule {dict(rule) if isinstance(rule, Mapping) else rule!r} and score {score!r} but "
                f"this selector has rule {self.rule.config()} and score {self.score.name!r}")
        rng = rng_words(state, "rng", where)
        counters = counter_fields(state, "counters", where, self.counters)
        self.rule.load_state_dict(field(state, "memory", where))  # checks before it changes; the last step that can fail
        self.rng_state = rng.copy()
        self.counters = counters

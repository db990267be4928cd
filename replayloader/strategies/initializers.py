"""Initial weights for newly added examples.

An initializer sees the buffer through a small read-only view (`BufferView`) and, when it is feature based,
the feature rows of the new examples. Feature-based initializers also learn from feedback (`observe`). The
buffer calls `initial_weights` on every add, and `observe` / `refresh` after feedback when a class overrides them
(the flags `observes` / `refreshes`, derived for every subclass); the defaults do nothing.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from .. import _checks as checks
from .._arrays import to_numpy
from ..state.checks import InvalidState, array, field_names, number, require
from .fused import overrides

Featurizer = Callable[[Mapping[str, Any]], np.ndarray]


class BufferView(Protocol):
    """What strategies may read from the buffer."""

    capacity: int
    size: int
    weights: np.ndarray  # raw weights per slot (0 for empty slots)
    visits: np.ndarray  # times each slot's feedback was applied
    features: np.ndarray | None  # (capacity, d) feature rows, only for feature-based initializers

    def mean_weight(self) -> float: ...


class TokenIdFeatures:
    """The paper's features: an example's token-id sequence read as a numeric vector.

    ``field`` names the batch field; by default "input_ids" when present, else the first field.
    """

    def __init__(self, field: str | None = None) -> None:
        self.field = field

    def __call__(self, batch: Mapping[str, Any]) -> np.ndarray:
        name = self.field or ("input_ids" if "input_ids" in batch else next(iter(batch)))
        if name not in batch:
            raise KeyError(f"feature field {name!r} is not in the batch (fields: {sorted(batch)})")
        x = to_numpy(batch[name], f"batch[{name!r}]")
        return x.reshape(len(x), -1).astype(np.float64)


class Initializer:
    """Base: a constant-free initializer that needs no features and learns nothing."""

    name = "initializer"
    feature_based = False
    #: Set for every subclass: `observes` / `refreshes` whether those hooks are overridden (callers skip the base's
    #: no-ops); `constant` whether `initial_weights` is the base's (callers may ask `constant_weight` directly).
    observes = False
    refreshes = False
    constant = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.observes = overrides(cls, Initializer, "observe")
        cls.refreshes = overrides(cls, Initializer, "refresh")
        cls.constant = not overrides(cls, Initializer, "initial_weights")

    def initial_weights(self, view: BufferView, n: int, features: np.ndarray | None) -> np.ndarray | float:
        """Weights of n new examples: an array of n, or one number that every new example gets (the buffer then
        builds no array). The default is `constant_weight`; override one of the two."""
        weight = self.constant_weight(view)
        if weight is None:
            raise NotImplementedError(f"{type(self).__name__} must define initial_weights or constant_weight")
        return weight

    def constant_weight(self, view: BufferView) -> float | None:
        """The one weight every example of the next add gets, for initializers that work that way."""
        return None

    def observe(self, view: BufferView, slots: np.ndarray, weights: np.ndarray) -> None:
        """Learn from the new weights that feedback gave to `slots` (default: nothing)."""

    def refresh(self, view: BufferView) -> tuple[np.ndarray, np.ndarray] | None:
        """Optionally re-score examples that were never sampled: (slots, weights) or None."""
        return None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore `state_dict`; a subclass with state checks every value before assigning any (`state_checks`)."""


class MeanWeight(Initializer):
    """Paper default: a new example gets the current mean weight (``default`` while the buffer is empty)."""

    name = "mean"

    def __init__(self, default: float = 1.0) -> None:
        checks.number("default", default, 0, low_open=True)
        self.default = float(default)

    def constant_weight(self, view):
        return view.mean_weight() if view.size else self.default


class MaxWeight(Initializer):
    """PER convention: a new example gets the largest weight assigned so far, so it is soon replayed.

    The raw weight is stored; alpha is applied once, by the buffer (applying it twice is a known peer bug).
    """

    name = "max"

    def __init__(self, default: float = 1.0) -> None:
        checks.number("default", default, 0, low_open=True)
        self.max_seen = float(default)

    def constant_weight(self, view):
        return self.max_seen

    def observe(self, view, slots, weights):
        if len(weights):
            self.max_seen = max(self.max_seen, float(weights.max()))

    def state_dict(self):
        return {"max_seen": self.max_seen}

    def load_state_dict(self, state):
        self.max_seen = number(state, "max_seen", "max initializer state", 0.0)


class LeastSquares(Initializer):
    """Paper's LSR: fit theta* = argmin sum_i (theta^T x_i - r_i)^2 over the buffer, new weight = theta*^T x.

    Refit on every add from the live examples through the normal equations (O(N d^2) with BLAS, much cheaper
    than an SVD-based lstsq), with a ridge of 1e-10 of the mean diagonal so rank-deficient features still
    solve; a singular system falls back to minimum-norm lstsq. Predictions below ``floor`` are raised to it,
    because a weight must be >= 0 and 0 would make the example unreachable.
    """

    name = "lsr"
    feature_based = True

    def __init__(self, features: Featurizer | str | None = None, intercept: bool = False,
                 floor: float = 1e-6, default: float = 1.0) -> None:
        self.featurize = TokenIdFeatures(features) if features is None or isinstance(features, str) else features
        self.intercept = intercept
        self.floor = float(floor)
        self.default = float(default)
        self.theta: np.ndarray | None = None

    def _design(self, x: np.ndarray) -> np.ndarray:
        return np.hstack([x, np.ones((len(x), 1))]) if self.intercept else x

    def initial_weights(self, view, n, features):
        if view.size == 0:
            return np.full(n, self.default)
        x = self._design(view.features[: view.size])
        r = view.weights[: view.size]
        gram = x.T @ x
        ridge = 1e-10 * max(float(np.trace(gram)) / len(gram), 1e-300)
        try:
            self.theta = np.linalg.solve(gram + ridge * np.eye(len(gram)), x.T @ r)
        except np.linalg.LinAlgError:
            self.theta = np.linalg.lstsq(x, r, rcond=None)[0]
        return np.maximum(self._design(features) @ self.theta, self.floor)

    def state_dict(self):
        return {} if self.theta is None else {"theta": self.theta.copy()}

    def load_state_dict(self, state):
        theta = None
        if "theta" in field_names(state, "lsr state"):
            theta = array(state, "theta", "lsr state", (-1,), "fiu", np.float64)
            require(bool(np.isfinite(theta).all()), "lsr state['theta'] must be finite")
        self.theta = theta


class LinUCB(Initializer):
    """LinUCB (Chu et al. 2011, Algorithm 1) with examples as arms: weight = theta^T x + c sqrt(x^T A^-1 x).

    A = I + sum x x^T and b = sum r x over every feedback received (reward r = the weight the update strategy
    assigned). After each feedback the weights of examples never sampled are re-scored, so initial weights keep
    improving until the example is first sampled; from then on the update strategy owns its weight.
    """

    name = "linucb"
    feature_based = True

    def __init__(self, features: Featurizer | str | None = None, exploration: float = 1.0,
                 floor: float = 1e-6) -> None:
        checks.number("exploration", exploration, 0)
        self.featurize = TokenIdFeatures(features) if features is None or isinstance(features, str) else features
        self.exploration = float(exploration)
        self.floor = float(floor)
        self.A: np.ndarray | None = None
        self.b: np.ndarray | None = None
        self._a_inv: np.ndarray | None = None  # cached between feedbacks: A only changes in observe()

    def _ensure(self, d: int) -> None:
        if self.A is None:
            self.A, self.b = np.eye(d), np.zeros(d)
        if self._a_inv is None:
            self._a_inv = np.linalg.inv(self.A)

    def scores(self, x: np.ndarray) -> np.ndarray:
        self._ensure(x.shape[1])
        theta = self._a_inv @ self.b
        width = np.sqrt(np.maximum(((x @ self._a_inv) * x).sum(axis=1), 0.0))
        return np.maximum(x @ theta + self.exploration * width, self.floor)

    def initial_weights(self, view, n, features):
        return self.scores(features)

    def observe(self, view, slots, weights):
        x = view.features[slots]
        self._ensure(x.shape[1])
        self.A += x.T @ x
        self.b += x.T @ weights
        self._a_inv = None

    def refresh(self, view):
        unsampled = np.flatnonzero(view.visits[: view.size] == 0)
        if len(unsampled) == 0:
            return None
        return unsampled, self.scores(view.features[unsampled])

    def state_dict(self):
        return {} if self.A is None else {"A": self.A.copy(), "b": self.b.copy()}

    def load_state_dict(self, state):
        where = "linucb state"
        keys = field_names(state, where)
        require(("A" in keys) == ("b" in keys), f"{where} must hold both 'A' and 'b' or neither, got {sorted(keys)}")
        a = b = None
        if "A" in keys:
            b = array(state, "b", where, (-1,), "fiu", np.float64)
            a = array(state, "A", where, (len(b), len(b)), "fiu", np.float64)
            require(bool(np.isfinite(a).all() and np.isfinite(b).all()), f"{where}: 'A' and 'b' must be finite")
            try:  # A = I + sum x x^T is symmetric positive definite; anything else was not saved by this class
                np.linalg.cholesky(a)
            except np.linalg.LinAlgError:
                raise InvalidState(f"{where}['A'] is not symmetric positive definite") from None
        self.A, self.b, self._a_inv = a, b, None

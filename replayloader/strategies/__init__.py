"""Pluggable weighting: an initializer (weight of new examples) + an update (weight from feedback) + an eviction.

`Strategy()` is the paper's default: MeanWeight + LossDifference + EvictLowest. `NoReplay()` hands back
exactly what was just added, through the same buffer API, for baselines. `by_name` maps the TMR variant names.
`ReducibleLossUpdate` + `ReducibleLossPrior` (reducible.py): RHO-LOSS's stale reducible loss as a
`PrioritizedSampler` weight. feedback.py: the one check of a feedback call (the keywords its update declares).
"""
from __future__ import annotations

from collections.abc import Mapping

from .._moved import renamed_method
from ..state.checks import field
from .evictions import FIFO, Eviction, EvictLowest, TreeReadView
from .initializers import BufferView, Initializer, LeastSquares, LinUCB, MaxWeight, MeanWeight, TokenIdFeatures
from .reducible import ReducibleLossPrior, ReducibleLossUpdate
from .updates import (
    GradBound,
    GradNorm,
    LossDifference,
    LossValue,
    SetWeight,
    WeightUpdate,
    grad_bound_sigmoid,
    grad_bound_softmax,
)


class Strategy:
    """An initializer, a weight update and an eviction, used together by one buffer."""

    no_replay = False

    def __init__(self, init: Initializer | None = None, update: WeightUpdate | None = None,
                 evict: Eviction | None = None) -> None:
        self.init = MeanWeight() if init is None else init
        self.update = LossDifference() if update is None else update
        self.evict = EvictLowest() if evict is None else evict
        for arg, value, kind in (("init", self.init, Initializer), ("update", self.update, WeightUpdate),
                                 ("evict", self.evict, Eviction)):
            if not isinstance(value, kind):
                raise TypeError(f"{arg} must be a {kind.__name__}, got {type(value).__name__}")

    def config(self) -> dict:
        """What a buffer's configuration records of its strategy: the parts' names (``config()``, as everywhere
        in the library; 1.0's ``describe()`` warns for one release)."""
        return {"init": self.init.name, "update": self.update.name, "evict": self.evict.name,
                "no_replay": self.no_replay}

    describe = renamed_method("config")

    def bind(self, capacity: int) -> None:
        """Size the parts' per-slot memory for a buffer of ``capacity`` (called once by the buffer)."""
        self.update.bind(capacity)
        self.evict.bind(capacity)

    def _parts(self) -> dict:
        return {"init": self.init, "update": self.update, "evict": self.evict}

    def state_dict(self) -> dict:
        return {name: part.state_dict() for name, part in self._parts().items()}

    def load_state_dict(self, state: Mapping) -> None:
        """All three parts or none: if one part refuses its state, the parts already loaded get their previous
        state back (a user's part may not check its input; the built-in ones check everything first)."""
        parts = self._parts()
        for name in parts:
            field(state, name, "strategy state")
        previous = {name: part.state_dict() for name, part in parts.items()}
        loaded = []
        try:
            for name, part in parts.items():
                loaded.append(name)
                part.load_state_dict(state[name])
        except Exception:
            for name in loaded:
                parts[name].load_state_dict(previous[name])
            raise

    def __repr__(self) -> str:
        d = self.config()
        return f"{type(self).__name__}(init={d['init']}, update={d['update']}, evict={d['evict']})"


class NoFeedback(WeightUpdate):
    """Reads nothing, and accepts every signal a built-in update reads, so a baseline run makes the same
    feedback call as the replay run it is compared with."""

    name = "none"
    value_keywords = tuple(dict.fromkeys(key for part in (LossValue, GradNorm, GradBound, SetWeight)
                                         for key in part.value_keywords))
    array_keywords = GradBound.array_keywords

    def values(self, feedback):
        return None


class NoReplay(Strategy):
    """Baseline mode: `sample(k)` returns the first k examples of the latest add, in order; feedback is
    accepted (and validated) but changes nothing."""

    no_replay = True

    def __init__(self) -> None:
        super().__init__(MeanWeight(), NoFeedback(), FIFO())


_VARIANTS = {
    "none": NoReplay,
    "loss_diff": lambda: Strategy(MeanWeight(), LossDifference(), EvictLowest()),
    "grad_norm": lambda: Strategy(MeanWeight(), GradNorm(), EvictLowest()),
    "grad_bound": lambda: Strategy(MeanWeight(), GradBound(), EvictLowest()),
    "loss": lambda: Strategy(MeanWeight(), LossValue(), EvictLowest()),
    "lsr": lambda: Strategy(LeastSquares(), LossDifference(), EvictLowest()),
    "linucb": lambda: Strategy(LinUCB(), LossDifference(), EvictLowest()),
    "per": lambda: Strategy(MaxWeight(), SetWeight(), FIFO()),
}


def by_name(name: str) -> Strategy:
    """The strategy of a named variant: none, loss_diff, grad_norm, grad_bound, loss, lsr, linucb, per."""
    if name not in _VARIANTS:
        raise ValueError(f"unknown strategy name {name!r}; choose one of {sorted(_VARIANTS)}")
    return _VARIANTS[name]()


__all__ = ["Strategy", "NoReplay", "by_name", "Initializer", "MeanWeight", "MaxWeight", "LeastSquares", "LinUCB",
           "TokenIdFeatures", "BufferView", "WeightUpdate", "LossDifference", "GradNorm", "GradBound", "LossValue",
           "SetWeight", "Eviction", "EvictLowest", "FIFO", "TreeReadView", "grad_bound_sigmoid",
           "grad_bound_softmax", "strategy_names", "ReducibleLossUpdate", "ReducibleLossPrior"]


def strategy_names() -> list[str]:
    return sorted(_VARIANTS)

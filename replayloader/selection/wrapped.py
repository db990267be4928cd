"""`WrappedSelector`: a `Selector` that adds a policy around another one (`ReusedPool`, `SelectionSwitch`).

Why a wrapper is itself a `Selector`: every place that takes a selector (`ScoreThenSelect`,
`CandidateBatchSampler` in a DataLoader loop, `SelectingTrainer`, `DistributedScoreThenSelect` under DDP) checks
``isinstance(selector, Selector)`` and calls ``choose`` / ``choose_split``, ``check_candidates``, ``state_dict``.
A wrapper passes those checks and overrides what it changes, so it reaches every one of them without a new code
path there. Its rule, score, generator and counters are the wrapped selector's own (read and written through),
so ``selector.stats()`` keeps counting, and one generator drives both.

A wrapper's checkpoint nests the wrapped selector's state (``{"version", "selector", <its part>}``), so a plain
`Selector` refuses a wrapper's state and a wrapper refuses a plain one (`InvalidState`), instead of silently
dropping a pool or a switch window.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..state.checks import field, require
from .rules import Rule, Score, Selector

STATE_VERSION = 1


class WrappedSelector(Selector):
    """Base of the selector wrappers: rule, score, generator and counters are ``selector``'s.

    Subclasses set ``part`` (the name of their state entry) and implement `_part_state` / `_checked_part`
    (check a saved part and return what `_load_part` assigns; raise `InvalidState`, change nothing) and
    `_load_part`.
    """

    part = "wrapper"

    def __init__(self, selector: Selector) -> None:
        if not isinstance(selector, Selector):
            raise TypeError(f"selector must be a Selector, got {type(selector).__name__}")
        if isinstance(selector, WrappedSelector):
            raise TypeError(f"selector must be a plain Selector, got a {type(selector).__name__}: wrappers do not "
                            f"nest (a ReusedPool inside a SelectionSwitch, or the reverse, is not supported)")
        self.selector = selector

    # the wrapped selector's parts, read and written through
    @property
    def rule(self) -> Rule:  # type: ignore[override]
        return self.selector.rule

    @property
    def score(self) -> Score:  # type: ignore[override]
        return self.selector.score

    @property
    def rng_state(self) -> np.ndarray:  # type: ignore[override]
        return self.selector.rng_state

    @rng_state.setter
    def rng_state(self, value: np.ndarray) -> None:
        self.selector.rng_state = value

    @property
    def counters(self) -> dict:  # type: ignore[override]
        return self.selector.counters

    @counters.setter
    def counters(self, value: dict) -> None:
        self.selector.counters = value

    # checkpoint
    def _part_state(self) -> dict:
        raise NotImplementedError

    def _checked_part(self, state: Any, where: str) -> Any:
        raise NotImplementedError

    def _load_part(self, checked: Any) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {"version": STATE_VERSION, "selector": self.selector.state_dict(), self.part: self._part_state()}

    def load_state_dict(self, state: Mapping) -> None:
        """All or nothing: this wrapper's part is checked first, then the wrapped selector loads (it checks its
        own), then the part is assigned. A refused state raises `InvalidState` and changes nothing."""
        where = f"{type(self).__name__} state"
        require(isinstance(state, Mapping), f"{where} must be a mapping, got {type(state).__name__}")
        require(state.get("version") == STATE_VERSION,
                f"{where}: version {state.get('version')!r} is not supported (expected {STATE_VERSION}); a plain "
                f"Selector's state does not load into a {type(self).__name__}")
        checked = self._checked_part(field(state, self.part, where), f"{where}[{self.part!r}]")
        self.selector.load_state_dict(field(state, "selector", where))
        self._load_part(checked)

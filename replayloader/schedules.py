"""Values that change with the training step, such as β of the importance weights (PER anneals it to 1).

`ReplayBuffer` and `PrioritizedSampler` take β as a number or a schedule ``step -> value`` and evaluate it in one
place (`value_at`); a schedule is part of their configuration (`describe`), so a checkpoint resumes only into
the same schedule, and the step it is evaluated at is a checkpointed counter, so it resumes exactly.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import _checks as checks

Schedule = Callable[[int], float]


class LinearSchedule:
    """value(step): linear from ``start`` to ``end`` over ``steps`` steps, then constant (PER's β annealing).

    Example:
        >>> from replayloader import LinearSchedule
        >>> beta = LinearSchedule(0.4, 1.0, steps=100)
        >>> beta(0), beta(50), beta(1000)
        (0.4, 0.7, 1.0)
    """

    def __init__(self, start: float, end: float, steps: int) -> None:
        checks.number("start", start, 0)
        checks.number("end", end, 0)
        checks.integer("steps", steps, 1)
        self.start, self.end, self.steps = float(start), float(end), int(steps)

    def __call__(self, step: int) -> float:
        return round(self.start + (self.end - self.start) * min(step / self.steps, 1.0), 15)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LinearSchedule) and self.config() == other.config()

    def __hash__(self) -> int:
        return hash(tuple(self.config()["linear"]))

    def __repr__(self) -> str:
        return f"LinearSchedule({self.start}, {self.end}, steps={self.steps})"

    def config(self) -> dict:
        return {"linear": [self.start, self.end, self.steps]}


def check(name: str, value: Any) -> float | Schedule | None:
    """None, a finite number >= 0 (as a float), or a schedule (any callable of the step)."""
    if value is None or callable(value):
        return value
    return checks.number(name, value, 0)


def value_at(name: str, value: float | Schedule | None, step: float, high: float = float("inf")) -> float | None:
    """``value`` at ``step``: itself, or the schedule's value there (checked: finite, >= 0 and <= ``high``).

    Every importance exponent β of the library is evaluated here, whatever its clock (`ReplayBuffer`: sample
    calls; `PrioritizedSampler`: batches drawn; the SB3 buffers: training progress in [0, 1], ``high=1``);
    ``tests/core/test_vocabulary.py`` checks that every public ``beta`` does."""
    if not callable(value):
        return value
    return checks.number(f"{name}({step})", value(step), 0, high)


def describe(value: float | Schedule | None) -> Any:
    """What a configuration records of ``value``: the number, a schedule's parameters, or a callable's name."""
    if value is None or not callable(value):
        return value
    if isinstance(value, LinearSchedule):
        return value.config()
    return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', type(value).__qualname__)}"

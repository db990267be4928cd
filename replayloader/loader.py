"""ReplayDataLoader: producer -> buffer -> prioritized mini-batches, as a plain iterable.

Each step calls the producer once (optionally on the next item of a source iterable), adds what it produced,
and yields ``replay_ratio`` sampled batches (a fractional ratio accumulates: 0.5 yields every other step).
Whatever the producer returns beside the examples (a loss that still needs a backward pass, say) rides along
on the batches of that step as ``aux``.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .buffer import ReplayBuffer, Sample


@dataclass
class ReplayBatch(Sample):
    """A `Sample` plus the producer's side output and which examples were produced this very step."""

    aux: Any = None
    fresh: np.ndarray | None = None  # bool (k,): True where the example came from this step's producer call
    step: int = 0


class ReplayDataLoader:
    """Wrap a producer callable in a replay buffer and iterate over sampled mini-batches.

    Args:
        producer: ``producer(item)`` (with a source) or ``producer()`` (without) returning a mapping of
            examples, or a tuple ``(examples, aux)``.
        buffer: the `ReplayBuffer` to fill and sample from.
        batch_size: examples per yielded batch.
        replay_ratio: sampled batches per produced batch (> 0; may be fractional).
        source: optional iterable feeding the producer (e.g. a torch DataLoader); iteration ends with it.
        steps: optional number of producer calls per pass (needed when there is no source).
        min_size: produce without yielding until the buffer holds this many examples.
    """

    def __init__(self, producer: Callable[..., Any], buffer: ReplayBuffer, batch_size: int,
                 replay_ratio: float = 1, source: Iterable | None = None, steps: int | None = None,
                 min_size: int = 0) -> None:
        if not callable(producer):
            raise TypeError(f"producer must be callable, got {type(producer).__name__}")
        if not isinstance(buffer, ReplayBuffer):
            raise TypeError(f"buffer must be a ReplayBuffer, got {type(buffer).__name__}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if not (isinstance(replay_ratio, (int, float)) and np.isfinite(replay_ratio) and replay_ratio > 0):
            raise ValueError(f"replay_ratio must be a finite number > 0, got {replay_ratio!r}")
        if steps is not None and (not isinstance(steps, (int, np.integer)) or steps < 0):
            raise ValueError(f"steps must be None or an integer >= 0, got {steps!r}")
        if source is None and steps is None:
            raise ValueError("give a source iterable or a number of steps, or the loader would never end")
        if not 0 <= min_size <= buffer.capacity:
            raise ValueError(f"min_size must lie in [0, {buffer.capacity}], got {min_size!r}")
        self.producer = producer
        self.buffer = buffer
        self.batch_size = int(batch_size)
        self.replay_ratio = float(replay_ratio)
        self.source = source
        self.steps = steps
        self.min_size = min_size
        self.step = 0  # producer calls in the current pass
        self.consumed = 0  # source items consumed in the current pass
        self._credit = 0.0
        self._skip = 0  # source items to fast-forward over after load_state_dict
        self._resuming = False  # the next pass continues a restored position instead of starting afresh

    def __len__(self) -> int:
        """Number of producer calls per pass (batches per pass when replay_ratio == 1)."""
        if self.steps is not None:
            return self.steps
        return len(self.source)  # type: ignore[arg-type]

    def _items(self) -> Iterator[Any]:
        if self.source is None:
            while self.steps is None or self.step < self.steps:
                yield None
            return
        iterator = iter(self.source)
        if self._skip and not hasattr(self.source, "load_state_dict"):
            for _ in range(self._skip):  # a plain iterable cannot seek: replay it up to the saved position
                next(iterator)
        self._skip = 0
        for item in iterator:
            if self.steps is not None and self.step >= self.steps:
                return
            self.consumed += 1
            yield item

    def __iter__(self) -> Iterator[ReplayBatch]:
        """One pass. Like a torch DataLoader, a new iter() starts a new pass, unless a state was just loaded."""
        if not self._resuming:
            self.step, self.consumed, self._skip = 0, 0, 0
        self._resuming = False
        for item in self._items():
            produced = self.producer() if self.source is None else self.producer(item)
            examples, aux = produced if isinstance(produced, tuple) else (produced, None)
            if not isinstance(examples, Mapping):
                raise TypeError("producer must return a mapping of examples or a tuple (examples, aux), got "
                                f"{type(produced).__name__}")
            self.buffer.add(examples)
            fresh_slots = self.buffer.last_add_slots
            self.step += 1
            if len(self.buffer) < self.min_size:
                continue
            self._credit += self.replay_ratio
            while self._credit >= 1.0 - 1e-12:
                self._credit -= 1.0
                sample = self.buffer.sample(self.batch_size)
                fresh = np.isin(sample.ids % self.buffer.capacity, fresh_slots)
                yield ReplayBatch(sample.data, sample.ids, sample.probabilities, sample.weights, sample.ages,
                                  aux=aux, fresh=fresh, step=self.step)
        self.step = 0
        self.consumed = 0

    def feedback(self, batch: Sample, **signals: Any) -> int:
        """Route per-example signals (loss=, grad_norm=, ...) for a yielded batch to the buffer's strategy."""
        return self.buffer.update(batch.ids, **signals)

    def state_dict(self) -> dict:
        state = {"step": self.step, "consumed": self.consumed, "credit": self._credit,
                 "buffer": self.buffer.state_dict()}
        if self.source is not None and hasattr(self.source, "state_dict"):
            state["source"] = self.source.state_dict()
        return state

    def load_state_dict(self, state: Mapping) -> None:
        """Restore the buffer and the position; a source without state_dict is fast-forwarded on next iter."""
        self.buffer.load_state_dict(state["buffer"])
        self.step = int(state["step"])
        self.consumed = int(state["consumed"])
        self._credit = float(state["credit"])
        if "source" in state and hasattr(self.source, "load_state_dict"):
            self.source.load_state_dict(state["source"])
        else:
            self._skip = self.consumed
        self._resuming = True

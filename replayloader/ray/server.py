"""BufferServer: what a buffer actor runs. One `ReplayBuffer`, called with whole batches, raising its own errors.

Plain Python with no Ray import (`remote.RemoteBuffer` runs it as an actor, and tests can call it directly).
A Ray actor runs one call at a time, so the buffer needs no lock and every call, a checkpoint included, sees a
consistent buffer. Arrays that reach the actor through Ray's object store are read-only views of shared memory;
`ReplayBuffer.add` copies them into its own storage, which is the one copy an insert costs on the buffer's side.

Inserts paced by a rate limiter take two calls (`stage`, then `commit`): staging moves the produced batch
from the producer's node to this actor and checks it (the learner learns its size without seeing the data);
the commit, made once the learner's `RateLimiter` admits the insert, adds it. A batch staged but not committed is
not part of the buffer or of its checkpoints, like an insert that Reverb's rate limiter still holds back.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from ..buffer.replay_buffer import ReplayBuffer, Sample
from ..strategies.feedback import as_feedback_array, check_values


class Mass(NamedTuple):
    """What a sharded learner needs of a shard to sample the union as one buffer: its number of examples,
    total priority Σ w^α, smallest positive priority (nan when the buffer keeps no importance weights) and the
    serial its next example gets (every id it issued lies below ``next_serial * capacity``)."""

    size: int
    total: float
    min_priority: float
    next_serial: int


class BufferServer:
    """A `ReplayBuffer` built from ``ReplayBuffer(*args, **kwargs)``, served call by call.

    A constructor error is kept and raised by `ready` (an actor whose constructor raises dies, and its error
    would reach the client only as a generic `ActorDiedError`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.error: Exception | None = None
        try:
            self.buffer = ReplayBuffer(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - re-raised by ready(), the client's first call
            self.error = exc
        self.staged: dict[int, tuple[Mapping[str, Any], np.ndarray | None]] = {}

    def ready(self) -> dict[str, Any]:
        """The buffer's configuration, or the constructor's error."""
        if self.error is not None:
            raise self.error
        buffer = self.buffer
        update = buffer.strategy.update
        return {"capacity": buffer.capacity, "alpha": buffer.alpha, "beta": buffer.beta,
                "max_weight": buffer.max_weight,
                "value_keywords": tuple(update.value_keywords), "array_keywords": tuple(update.array_keywords)}

    # ------------------------------------------------------------------ inserts
    def add(self, batch: Any, weight: Any = None) -> np.ndarray:
        """`ReplayBuffer.add`; ``weight=`` gives each example its initial weight (Ape-X: priorities computed by
        the actor). ``batch`` may also be a producer's ``(batch, weight)`` pair."""
        batch, weights, _ = self._checked(batch, weight)
        return self._add(batch, weights)

    def stage(self, token: int, produced: Any) -> int:
        """Check a produced batch (a mapping, or ``(mapping, weight)``) and keep it under ``token`` until
        `commit`; returns its number of examples."""
        batch, weights, n = self._checked(produced)
        self.staged[token] = (batch, weights)
        return n

    def commit(self, token: int) -> np.ndarray:
        """Add the batch staged under ``token``; returns its ids."""
        batch, weights = self.staged.pop(token)
        return self._add(batch, weights)

    def drop_staged(self) -> None:
        self.staged.clear()

    def _checked(self, batch: Any, weight: Any = None) -> tuple[Mapping[str, Any], np.ndarray | None, int]:
        """The batch, its initial weights and its number of examples, validated before anything changes."""
        if isinstance(batch, tuple):
            if len(batch) != 2 or weight is not None:
                raise ValueError("a produced tuple must be (batch, weight), with no separate weight= argument")
            batch, weight = batch
        if not isinstance(batch, Mapping):
            raise TypeError(f"batch must be a mapping of field name -> array (or a (batch, weight) pair), "
                            f"got {type(batch).__name__}")
        n = self.buffer.storage.check_batch(batch)
        if weight is None:
            return batch, None, n
        update = self.buffer.strategy.update
        if update.feedback_key != "weight":
            raise ValueError(f"initial weight= needs a strategy whose update reads weight= (SetWeight, e.g. "
                             f"by_name('per')); this buffer's update {update.name!r} reads "
                             f"{update.feedback_key!r}")
        weight = as_feedback_array("weight", weight, n, against="the batch")
        check_values("weight", weight, self.buffer.max_weight)
        return batch, weight, n

    def _add(self, batch: Mapping[str, Any], weights: np.ndarray | None) -> np.ndarray:
        ids = self.buffer.add(batch)
        if weights is not None:  # one actor call: nobody samples the examples before their weights are set
            self.buffer.feedback(ids, weight=weights)
        return ids

    # ------------------------------------------------------------------ learner
    def sample(self, k: int, *, with_mass: bool = False) -> Sample | tuple[Sample, Mass]:
        """`ReplayBuffer.sample`; with ``with_mass`` also the `Mass` the draw used."""
        sample = self.buffer.sample(k)
        return (sample, self.mass()) if with_mass else sample

    def feedback(self, ids: Any, **feedback: Any) -> int:
        return self.buffer.feedback(ids, **feedback)

    def mass(self) -> Mass:
        buffer = self.buffer
        tree = buffer.tree
        min_priority = tree.min_priority() if buffer.beta is not None else float("nan")
        return Mass(buffer.size, tree.total, min_priority, buffer.next_serial)

    # ------------------------------------------------------------------ introspection and checkpoints
    def size(self) -> int:
        return len(self.buffer)

    def stats(self) -> dict[str, float]:
        return self.buffer.stats()

    def state_dict(self) -> dict:
        return self.buffer.state_dict()

    def load_state_dict(self, state: Mapping) -> None:
        self.staged.clear()
        self.buffer.load_state_dict(state)

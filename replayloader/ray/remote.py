"""RemoteBuffer: a `ReplayBuffer` served by a Ray actor, called like the in-process buffer from any node.

Every call sends whole batches (one actor call per add / sample / update). What is copied: Ray stores an argument
or a result of more than about 100 KB in its shared-memory object store, once, and a reader on the same node gets a
read-only numpy view of it without a copy (smaller ones travel inside the call message). The actor then copies an
added batch into the buffer's storage; a sample is gathered into new arrays by the buffer (as in process) and
reaches the learner through the object store, read-only (copy it before writing into it). Between nodes,
Ray moves each object once over the network.

Errors are the buffer's own: `call` re-raises the exception the actor raised (same type and message, with Ray's
remote traceback as its cause), so ``except ValueError`` works the same on both sides.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import ray

from ..buffer import Sample
from .server import BufferServer, Mass


def call(refs: Any) -> Any:
    """`ray.get`, raising the actor's original exception rather than Ray's wrapper."""
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as err:
        cause = err.cause
        if isinstance(cause, Exception) and not isinstance(cause, ray.exceptions.RayError):
            raise cause from err
        raise


class RemoteBuffer:
    """A `ReplayBuffer(*args, **kwargs)` in a new Ray actor (``actor_options``: Ray's options for it, e.g.
    ``{"num_cpus": 1, "resources": {...}}`` to place it on a node). Same calls as the buffer; ``restart`` makes a
    fresh actor from a checkpoint after the old one died or was killed. Picklable: hand it to producer actors
    so that they add their batches themselves."""

    def __init__(self, *args: Any, actor_options: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs
        self.actor_options = dict(actor_options or {})
        self.handle = self._start()

    def _start(self) -> Any:
        actor = ray.remote(BufferServer).options(**self.actor_options).remote(*self.args, **self.kwargs)
        try:
            config = call(actor.ready.remote())
        except Exception:
            ray.kill(actor)
            raise
        self.capacity, self.alpha, self.beta = config["capacity"], config["alpha"], config["beta"]
        self.value_keywords, self.array_keywords = config["value_keywords"], config["array_keywords"]  # feedback
        return actor

    def restart(self, state: Mapping | None = None) -> None:
        """Replace the actor by a new one (the old one is killed if it still runs), loaded from ``state``."""
        self.kill()
        self.handle = self._start()
        if state is not None:
            self.load_state_dict(state)

    def kill(self) -> None:
        ray.kill(self.handle)

    def add(self, batch: Any, weight: Any = None) -> np.ndarray:
        """Add a batch (a mapping of arrays, or an ObjectRef of one); ``weight=`` sets each example's initial
        weight (needs a strategy whose update reads ``weight=``, such as ``by_name("per")``)."""
        return call(self.handle.add.remote(batch, weight))

    def stage(self, token: int, produced: Any) -> int:
        """Move a produced batch (an ObjectRef) to the actor and check it; returns its number of examples."""
        return call(self.handle.stage.remote(token, produced))

    def commit(self, token: int) -> np.ndarray:
        """Add the batch staged under ``token``; returns its ids."""
        return call(self.handle.commit.remote(token))

    def drop_staged(self) -> None:
        call(self.handle.drop_staged.remote())

    def sample(self, k: int) -> Sample:
        return call(self.handle.sample.remote(k))

    def update(self, ids: Any, **feedback: Any) -> int:
        return call(self.handle.update.remote(ids, **feedback))

    def mass(self) -> Mass:
        return call(self.handle.mass.remote())

    def __len__(self) -> int:
        return call(self.handle.size.remote())

    def stats(self) -> dict[str, float]:
        return call(self.handle.stats.remote())

    def state_dict(self) -> dict:
        return call(self.handle.state_dict.remote())

    def load_state_dict(self, state: Mapping) -> None:
        call(self.handle.load_state_dict.remote(state))

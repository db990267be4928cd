"""RemoteBuffer: a `ReplayBuffer` served by a Ray actor, called like the in-process buffer from any node.

Every call sends whole batches (one actor call per add / sample / update). What is copied: Ray stores an argument
or a result of more than about 100 KB in its shared-memory object store, once, and a reader on the same node gets a
read-only numpy view of it without a copy (smaller ones travel inside the call message). The actor then copies an
added batch into the buffer's storage; a sample is gathered into new arrays by the buffer (as in process) and
reaches the learner through the object store, read-only (copy it before writing into it). Between nodes,
Ray moves each object once over the network.

Errors are the buffer's own: `call` re-raises the exception the actor raised (same type and message, with Ray's
remote traceback as its cause), so ``except ValueError`` works the same on both sides. A buffer actor that died
(its process or node lost, or killed) raises `BufferActorDied`, naming the actor and the recovery, instead of
Ray's raw ``ActorDiedError``.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import ray

from ..buffer.replay_buffer import Sample
from ..loader.workers import WorkerError
from .server import BufferServer, Mass
from .._moved import renamed


class BufferActorDied(WorkerError):
    """A buffer actor died, and what it held went with it. Recover with ``buffer.restart(state)`` (a new actor
    loaded from your last ``state_dict()``), or ``buffer.restart()`` and then ``loader.load_state_dict(...)``
    with the loader's last checkpoint, which restores every shard and the position."""


def call(refs: Any, actors: Mapping[str, str] | None = None) -> Any:
    """`ray.get`, raising the actor's original exception rather than Ray's wrapper, and `BufferActorDied` when
    the actor is gone. ``actors`` maps a Ray actor id (hex) to the name the message gives it."""
    try:
        return ray.get(refs)
    except ray.exceptions.RayActorError as err:  # ActorDiedError, ActorUnavailableError
        raise BufferActorDied(death_message(err, actors or {})) from err
    except ray.exceptions.RayTaskError as err:
        cause = err.cause
        if isinstance(cause, Exception) and not isinstance(cause, ray.exceptions.RayError):
            raise cause from err
        raise


def death_message(err: Exception, actors: Mapping[str, str]) -> str:
    actor_id = getattr(err, "actor_id", None)
    name = actors.get(actor_id, "a buffer actor") if actor_id else "a buffer actor"
    reason = str(getattr(err, "error_msg", "") or err).strip().splitlines()[0]
    return (f"{name} (Ray actor {actor_id or 'unknown'}) died, and its contents with it ({reason}). Recover with "
            f"buffer.restart(state) from your last buffer.state_dict(), or buffer.restart() and then "
            f"loader.load_state_dict(checkpoint) with the loader's last state_dict(): nothing in that checkpoint "
            f"is lost")


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
        self.max_weight = config["max_weight"]  # the largest weight its feedback may set
        self.value_keywords, self.array_keywords = config["value_keywords"], config["array_keywords"]  # feedback
        return actor

    @property
    def names(self) -> dict[str, str]:
        """This actor's id and the name errors give it."""
        actor_id = self.handle._actor_id.hex()  # Ray's ActorDiedError names the actor by this id
        return {actor_id: f"the RemoteBuffer actor {actor_id[:12]}"}

    def _call(self, ref: Any) -> Any:
        return call(ref, self.names)

    def restart(self, state: Mapping | None = None) -> None:
        """Replace the actor by a new one (the old one is killed if it still runs), loaded from ``state``."""
        self.kill()
        self.handle = self._start()
        if state is not None:
            self.load_state_dict(state)

    def kill(self, *, timeout: float = 60.0) -> None:
        """Kill the actor and return once a call to it fails as a dead actor's does.

        Why wait: `ray.kill` returns before every path to the actor knows it is gone, so a call made at once could
        still reach the dying process and succeed (a test saw it on a loaded machine). After this returns, the next
        call raises `BufferActorDied`, every time. Raises `WorkerError` if the actor still answers after
        ``timeout`` seconds.
        """
        ray.kill(self.handle)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                ray.get(self.handle.mass.remote(), timeout=1.0)
            except ray.exceptions.RayActorError:
                return
            except ray.exceptions.GetTimeoutError:
                continue
            time.sleep(0.01)
        raise WorkerError(f"{next(iter(self.names.values()))} still answers {timeout} s after ray.kill")

    def add(self, batch: Any, weight: Any = None) -> np.ndarray:
        """Add a batch (a mapping of arrays, or an ObjectRef of one); ``weight=`` sets each example's initial
        weight (needs a strategy whose update reads ``weight=``, such as ``by_name("per")``)."""
        return self._call(self.handle.add.remote(batch, weight))

    def stage(self, token: int, produced: Any) -> int:
        """Move a produced batch (an ObjectRef) to the actor and check it; returns its number of examples."""
        return self._call(self.handle.stage.remote(token, produced))

    def commit(self, token: int) -> np.ndarray:
        """Add the batch staged under ``token``; returns its ids."""
        return self._call(self.handle.commit.remote(token))

    def drop_staged(self) -> None:
        self._call(self.handle.drop_staged.remote())

    def sample(self, k: int) -> Sample:
        return self._call(self.handle.sample.remote(k))

    update = renamed("feedback")

    def feedback(self, ids: Any, **feedback: Any) -> int:
        return self._call(self.handle.feedback.remote(ids, **feedback))

    def mass(self) -> Mass:
        return self._call(self.handle.mass.remote())

    def __len__(self) -> int:
        return self._call(self.handle.size.remote())

    def stats(self) -> dict[str, float]:
        return self._call(self.handle.stats.remote())

    def state_dict(self) -> dict:
        return self._call(self.handle.state_dict.remote())

    def load_state_dict(self, state: Mapping) -> None:
        self._call(self.handle.load_state_dict.remote(state))

"""ShardedBuffer: several buffer actors sampled as one prioritized buffer.

A draw lands in shard s with probability M_s / M, where M_s = Σ w^α over the shard (its tree's total) and M the sum
over shards, and then on example i of that shard with probability w_i^α / M_s: overall w_i^α / M, exactly what one
buffer holding every example would give. A sample asks each shard for its mass (one parallel round trip), splits
the k draws over the shards (stratified: k equal segments of the shards' masses laid end to end, one uniform draw
in each, as the buffer does inside a tree; or independently), then samples each shard (a second parallel round
trip) and reports the union's probabilities and importance weights. Sampling is uniform over the stored examples
when every weight is 0, as in one buffer.

Ids name their shard: ``global_id = local_id * n_shards + shard``. Inserts go to the shards in turn.

An update is checked here before any shard sees it (keywords, shapes, values, ids below what each shard issued,
as far as this client knows), so a rejected update changes no shard. Only an id refused by its shard for a
reason this client cannot see (its slot never held that serial) can leave the other shards updated.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..buffer.replay_buffer import Sample
from ..strategies.feedback import as_feedback_array, check_values
from .._arrays import is_torch_tensor, to_numpy
from .remote import RemoteBuffer, call
from .server import Mass
from .. import _checks as checks
from ..sumtree import SAMPLINGS
from ..state.checks import InvalidState, field, integer, require
from .._moved import renamed


class ShardedBuffer:
    """One prioritized buffer over ``shards`` (`RemoteBuffer`s of equal ``alpha`` and ``beta``).

    Args:
        shards: the buffer actors.
        seed: seed of the generator that splits draws over shards (its state is checkpointed).
        sampling: "stratified" (default) or "independent", as for `ReplayBuffer`.
    """

    def __init__(self, shards: Sequence[RemoteBuffer], seed: int | None = None,
                 sampling: str = "stratified") -> None:
        shards = list(shards)
        if not shards or not all(isinstance(s, RemoteBuffer) for s in shards):
            raise TypeError(f"shards must be a non-empty sequence of RemoteBuffer, got {shards!r}")
        configs = {(s.alpha, s.beta, s.value_keywords, s.array_keywords) for s in shards}
        if len(configs) != 1:
            raise ValueError(f"shards must share alpha, beta and the feedback their strategy reads to sample as one "
                             f"buffer, got {sorted(configs)}")
        checks.one_of("sampling", sampling, SAMPLINGS)
        self.shards = shards
        self.alpha, self.beta = shards[0].alpha, shards[0].beta
        if callable(self.beta):
            raise ValueError(f"the shards' beta is a schedule ({self.beta!r}); a ShardedBuffer weighs the union with "
                             "one fixed beta: give every shard a number")
        self.capacity = sum(s.capacity for s in shards)
        self.max_weight = min(s.max_weight for s in shards)  # checked here, so that no shard refuses its part
        self.sampling = sampling
        self.rng = np.random.default_rng(seed)
        self.next_shard = 0  # where the next add goes
        self.staged: dict[int, int] = {}  # token -> shard of a staged batch
        self.next_serial = [0] * len(shards)  # per shard, the highest next_serial seen: ids below it were issued

    # ------------------------------------------------------------------ inserts
    def add(self, batch: Any, weight: Any = None, shard: int | None = None) -> np.ndarray:
        """Add a batch to ``shard`` (default: the shards in turn); returns global ids."""
        s = self.next_shard if shard is None else shard
        if not 0 <= s < len(self.shards):
            raise ValueError(f"shard must lie in [0, {len(self.shards)}), got {shard!r}")
        ids = self.shards[s].add(batch, weight)
        self.next_shard = (s + 1) % len(self.shards)
        return self.global_ids(ids, s)

    def stage(self, token: int, produced: Any) -> int:
        """Stage a produced batch at the shard whose turn it is (see `RemoteBuffer.stage`)."""
        n = self.shards[self.next_shard].stage(token, produced)
        self.staged[token] = self.next_shard
        return n

    def commit(self, token: int) -> np.ndarray:
        s = self.staged.pop(token)
        ids = self.shards[s].commit(token)
        self.next_shard = (s + 1) % len(self.shards)
        return self.global_ids(ids, s)

    def drop_staged(self) -> None:
        call([s.handle.drop_staged.remote() for s in self.shards], self.names)
        self.staged.clear()

    def global_ids(self, local_ids: np.ndarray, shard: int) -> np.ndarray:
        return np.asarray(local_ids, np.int64) * len(self.shards) + shard

    # ------------------------------------------------------------------ sample
    def masses(self) -> list[Mass]:
        masses = call([s.handle.mass.remote() for s in self.shards], self.names)
        self._saw(masses)
        return masses

    def sample(self, k: int) -> Sample:
        """k draws with replacement from the union, with the union's probabilities and importance weights."""
        checks.integer("k", k, 1)
        masses = self.masses()
        counts = self.split(int(k), masses)
        chosen = np.flatnonzero(counts)
        results = call([self.shards[s].handle.sample.remote(int(counts[s]), with_mass=True) for s in chosen], self.names)
        for s, (_, mass) in zip(chosen, results):
            masses[s] = mass  # the mass each shard drew with
        self._saw(masses)
        return self._union([(int(s), sample) for s, (sample, _) in zip(chosen, results)], masses)

    def split(self, k: int, masses: Sequence[Mass]) -> np.ndarray:
        """How many of k draws each shard takes, in proportion to its mass (its size when no weight is > 0)."""
        shares = np.array([m.total for m in masses], np.float64)
        if not shares.sum() > 0:
            shares = np.array([m.size for m in masses], np.float64)
            if not shares.sum() > 0:
                raise ValueError("cannot sample from an empty buffer; add examples first")
        if self.sampling == "independent":
            return self.rng.multinomial(k, shares / shares.sum())
        ends = np.cumsum(shares)
        targets = (np.arange(k) + self.rng.random(k)) / k * ends[-1]
        which = np.minimum(np.searchsorted(ends, targets, side="right"), np.flatnonzero(shares)[-1])
        return np.bincount(which, minlength=len(shares))

    def _union(self, parts: list[tuple[int, Sample]], masses: Sequence[Mass]) -> Sample:
        totals = np.array([m.total for m in masses], np.float64)
        by_mass = totals.sum() > 0
        scale = totals / totals.sum() if by_mass else np.array([m.size for m in masses], np.float64) / sum(
            m.size for m in masses)
        probabilities = np.concatenate([sample.probabilities * scale[s] for s, sample in parts])
        weights = np.ones(len(probabilities))
        if self.beta is not None:
            if by_mass:
                p_min = min(m.min_priority for m in masses if m.total > 0) / totals.sum()
            else:
                p_min = 1.0 / sum(m.size for m in masses)
            weights = (p_min / probabilities) ** self.beta
        ids = np.concatenate([self.global_ids(sample.ids, s) for s, sample in parts])
        ages = np.concatenate([sample.ages for _, sample in parts])
        data = {name: _concatenate([sample.data[name] for _, sample in parts]) for name in parts[0][1].data}
        return Sample(data, ids, probabilities, weights, ages)

    # ------------------------------------------------------------------ update
    update = renamed("feedback")

    def feedback(self, ids: Any, **feedback: Any) -> int:
        """Route each example's feedback to its shard; returns how many weights changed. The whole call is
        checked first (see the module docstring)."""
        ids = checks.index_array("ids", ids)
        k, n = len(ids), len(self.shards)
        checked = {}
        first = self.shards[0]
        for name, value in feedback.items():
            if name not in first.value_keywords + first.array_keywords:
                raise TypeError(f"unknown feedback keyword {name!r}; accepted: "
                                f"{[*first.value_keywords, *first.array_keywords] or 'none'}")
            if name in first.array_keywords:
                checked[name] = to_numpy(value, name)
                if checked[name].shape[:1] != (k,):
                    raise ValueError(f"{name} must have {k} rows to match ids, got shape {checked[name].shape}")
            else:
                checked[name] = as_feedback_array(name, value, k)
                check_values(name, checked[name], self.max_weight)
        shard, local = ids % n, ids // n
        self._check_issued(ids, shard, local)
        chosen = [s for s in range(n) if (shard == s).any()]
        refs = [self.shards[s].handle.feedback.remote(local[shard == s], **{name: value[shard == s]
                                                                           for name, value in checked.items()})
                for s in chosen]
        return int(sum(call(refs, self.names)))

    def _check_issued(self, ids: np.ndarray, shard: np.ndarray, local: np.ndarray) -> None:
        """Refuse ids that no shard issued yet (asking the shards again before refusing an id beyond what this
        client has seen), so that no shard applies its part of an update another would refuse."""
        for attempt in range(2):
            limits = np.array([serial * s.capacity for serial, s in zip(self.next_serial, self.shards)], np.int64)
            bad = np.flatnonzero((ids < 0) | (local >= limits[shard]))
            if not bad.size:
                return
            if attempt == 0:
                self.masses()
        raise ValueError(f"ids[{bad[0]}] = {ids[bad[0]]} was never issued by this buffer")

    def _saw(self, masses: Sequence[Mass]) -> None:
        self.next_serial = [max(a, m.next_serial) for a, m in zip(self.next_serial, masses)]

    # ------------------------------------------------------------------ introspection and checkpoints
    def __len__(self) -> int:
        return sum(m.size for m in self.masses())

    def stats(self) -> list[dict[str, float]]:
        """Each shard's `ReplayBuffer.stats()`."""
        return call([s.handle.stats.remote() for s in self.shards], self.names)

    def state_dict(self) -> dict:
        """Every shard's state (one parallel round trip), plus where the next add goes and the split's RNG."""
        states = call([s.handle.state_dict.remote() for s in self.shards], self.names)
        return {"shards": {str(i): state for i, state in enumerate(states)}, "next_shard": self.next_shard,
                "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: Mapping) -> None:
        """Every shard from the checkpoint, all or nothing on this side: the whole state is checked through the
        shared state checks (`InvalidState`) before any shard is sent its part, and each shard checks its own
        part before it changes."""
        where = "sharded buffer state"
        require(isinstance(state, Mapping), f"{where} must be a mapping, got {type(state).__name__}")
        shards = field(state, "shards", where)
        require(isinstance(shards, Mapping) and sorted(shards) == [str(i) for i in range(len(self.shards))],
                f"checkpoint has shards {sorted(shards) if isinstance(shards, Mapping) else shards!r} but this "
                f"buffer has {len(self.shards)} (keys '0'..'{len(self.shards) - 1}')")
        next_shard = integer(state, "next_shard", where, 0, len(self.shards) - 1)
        rng = field(state, "rng", where)
        probe = np.random.default_rng()
        try:
            probe.bit_generator.state = rng
        except (TypeError, ValueError, KeyError) as err:
            raise InvalidState(f"{where}['rng'] is not a numpy generator state: {err}") from None
        call([s.handle.load_state_dict.remote(shards[str(i)]) for i, s in enumerate(self.shards)], self.names)
        self.next_shard = next_shard
        self.rng.bit_generator.state = rng
        self.next_serial = [0] * len(self.shards)
        self.masses()

    @property
    def names(self) -> dict[str, str]:
        """Each shard's actor id and the name errors give it ("shard i of the ShardedBuffer")."""
        return {actor_id: f"shard {i} of the ShardedBuffer (its RemoteBuffer actor {actor_id[:12]})"
                for i, shard in enumerate(self.shards) for actor_id in shard.names}

    def restart(self, state: Mapping) -> None:
        """Replace every shard's actor by a new one and load the checkpoint ``state`` (after a shard died)."""
        for shard in self.shards:
            shard.restart()
        self.load_state_dict(state)


def _concatenate(parts: list[Any]) -> Any:
    if is_torch_tensor(parts[0]):
        import torch

        return torch.cat(parts)
    return np.concatenate(parts)

"""Stale reducible loss in the sum tree: RHO-LOSS's score as a `PrioritizedSampler` weight, at no scoring cost.

Score-then-select pays a scoring forward over n_B candidates every step. The weights of a `PrioritizedSampler`
can carry the same signal for free: each trained row's training loss comes out of the training forward anyway,
so feeding it back sets that row's weight to its reducible loss, max(loss - irreducible[index], 0) + floor
(`ReducibleLossUpdate`). The weight is stale (measured when the row was last trained, before its update), which
is the price of scoring nothing; `replayloader.selection.stale.stale_rows` names the rows whose weight is oldest,
so a loop can re-score a slice of them now and then (a no-grad forward over that slice) and feed them back.

Unseen rows (no feedback yet) start at `ReducibleLossPrior`: max(initial_loss - irreducible[index], 0) + floor,
the reducible loss each row would have under a model that has not learnt anything (``initial_loss``, e.g. ln C
for a fresh C-class classifier). That is what RHO-LOSS scores at step 0 (every candidate's training loss is about
the same, so it picks the lowest irreducible losses first), so drawing by the prior from the first step gives
RHO's early choice: rows whose label the irreducible-loss model finds implausible (high irreducible loss) sit
at the floor and are rarely drawn, the others are drawn by how learnable they look.

Why not a shuffled warm-up pass first (the sampler's default ``warmup_epochs=1``): a warm-up pass visits every row
once in random order, so for a whole epoch the draw *is* uniform; the audit of issue 28 found that with it the
stale tree equals uniform until after every accuracy target (one epoch of SST-2 at n_b = 32 is ~2,100 steps).
Why not the tree's largest weight (PER's convention, `MaxWeight`): every unseen row would then outweigh every
seen one, so the first pass is again a uniform pass over unseen rows, mislabelled rows included. The prior keeps
every row drawable (weight >= floor > 0) without making unseen rows a uniform pass. Use
``warmup_epochs=0`` (`replayloader.selection.stale.stale_reducible_sampler` builds the whole sampler).

For a `PrioritizedSampler` (its slots are dataset indices) and the DDP `DistributedPrioritizedSampler` (it gathers
``loss=`` and applies one merged feedback per step on every rank). In a `ReplayBuffer` the slots are buffer
slots, not dataset indices, so the irreducible losses would be read at the wrong rows: do not use it there.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from numba import njit

from .. import _checks as checks
from .._arrays import to_numpy
from ..state.checks import array, integer, require
from .initializers import BufferView, Initializer
from .updates import WeightUpdate


def checked_irreducible(irreducible: Any, name: str = "irreducible") -> np.ndarray:
    """One finite loss per row as a read-only float64 array (a ValueError naming ``name`` otherwise)."""
    arr = to_numpy(irreducible, name)
    if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "fiu":
        raise ValueError(f"{name} must be a non-empty 1-D array of numbers, got dtype {arr.dtype} shape {arr.shape}")
    arr = np.array(arr, np.float64)
    checks.all_finite(name, arr)
    arr.flags.writeable = False
    return arr


@njit(cache=True, nogil=True)
def reducible_weights(irreducible, slots, losses, floor):
    """The stale-reducible-loss rule: weight = max(loss - irreducible[slot], 0) + floor for every slot.
    Returns (mask of all True, new weights)."""
    n = slots.shape[0]
    weights = np.empty(n, np.float64)
    for j in range(n):
        reducible = losses[j] - irreducible[slots[j]]
        weights[j] = (reducible if reducible > 0.0 else 0.0) + floor
    return np.ones(n, np.bool_), weights


class ReducibleLossUpdate(WeightUpdate):
    """weight = max(training loss - irreducible[index], 0) + floor, fed with ``loss=`` (the per-example training
    loss of the rows just trained on, from the training forward: no extra scoring).

    Args:
        irreducible: one irreducible loss per dataset index (e.g. `fit_irreducible(...).losses`).
        floor: added to every weight (> 0): a row with nothing left to learn (or a mislabelled one) keeps a
            chance of floor / (mean weight) relative to the average row, so none becomes unreachable.
        seed: breaks ties in `stalest` (rows fed back equally long ago come in a fixed random order, not by
            index, which would favour the start of a sorted dataset).

    It remembers when each row was last fed back (``last_fed``: the number of feedback calls before it, -1 for
    never), for `stalest`. Its state is the same on every DDP rank and for every world size (one merged feedback
    per global step).
    """

    name = "reducible_loss"
    feedback_key = "loss"

    def __init__(self, irreducible: Any, *, floor: float = 0.01, seed: int = 0) -> None:
        super().__init__(checks.number("floor", floor, 0.0, low_open=True))
        self.seed = checks.integer("seed", seed, 0)
        self.irreducible = checked_irreducible(irreducible)
        self.irreducible_digest = hashlib.sha256(self.irreducible.tobytes()).hexdigest()[:16]  # DDP fingerprint
        self.last_fed = np.full(len(self.irreducible), -1, np.int64)
        self.calls = 0
        self._tiebreak = np.empty(0, np.int64)

    def bind(self, capacity: int) -> None:
        if capacity != len(self.irreducible):
            raise ValueError(f"irreducible must have one loss per dataset index ({capacity}), got "
                             f"{len(self.irreducible)}")
        self.last_fed = np.full(capacity, -1, np.int64)
        self._tiebreak = np.argsort(np.random.default_rng(self.seed).permutation(capacity))  # rank of each row

    def compute(self, slots: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        changed, weights = reducible_weights(self.irreducible, slots, values, self.floor)
        self.last_fed[slots] = self.calls
        self.calls += 1
        return changed, weights

    def stalest(self, count: int, *, among: Any = None) -> np.ndarray:
        """The ``count`` rows whose weight is oldest: never fed back first, then by the feedback call that last set
        it; ties in a fixed random order (``seed``). ``among``: a boolean mask of the rows that may be named (e.g.
        those the sampler has handed out, the only ones it takes feedback for); fewer rows if fewer qualify."""
        count = checks.integer("count", count, 1)
        n = len(self.irreducible)
        if len(self._tiebreak) != n:
            self._tiebreak = np.argsort(np.random.default_rng(self.seed).permutation(n))
        rows = np.arange(n)
        if among is not None:
            mask = np.asarray(to_numpy(among, "among"))
            if mask.shape != (n,) or mask.dtype != np.bool_:
                raise ValueError(f"among must be a boolean mask of shape ({n},), got dtype {mask.dtype} shape "
                                 f"{mask.shape}")
            rows = np.flatnonzero(mask)
        order = np.lexsort((self._tiebreak[rows], self.last_fed[rows]))
        return rows[order[:count]]

    def state_dict(self) -> dict:
        return {"last_fed": self.last_fed.copy(), "calls": self.calls, "irreducible_digest": self.irreducible_digest}

    def load_state_dict(self, state: Mapping) -> None:
        where = "reducible_loss state"
        calls = integer(state, "calls", where, 0)
        last_fed = array(state, "last_fed", where, self.last_fed.shape, "iu", np.int64)
        require(bool(((last_fed >= -1) & (last_fed < calls)).all()),
                f"{where}['last_fed'] must lie in [-1, calls={calls})")
        saved = state.get("irreducible_digest", self.irreducible_digest)
        require(saved == self.irreducible_digest,
                f"{where}: the checkpoint was made with other irreducible losses (digest {saved!r}, this update "
                f"has {self.irreducible_digest!r})")
        self.last_fed, self.calls = last_fed, calls


class ReducibleLossPrior(Initializer):
    """Unseen rows' weight: max(initial_loss - irreducible[index], 0) + floor, RHO-LOSS's score under a model that
    has learnt nothing (see the module doc for why this and not a warm-up pass or the largest weight).

    Feature based: the sampler passes each unseen row's features, which must be one column, its irreducible loss
    (``PrioritizedSampler(..., features=irreducible[:, None])``; `stale_reducible_sampler` does it).

    Args:
        initial_loss: the main model's per-example loss before training (ln C for a fresh C-class classifier, or
            the mean loss of a few rows at step 0).
        floor: as `ReducibleLossUpdate`'s (use the same).
    """

    name = "reducible_prior"
    feature_based = True
    featurize = None  # a sampler's features are given once, for every index; a buffer would call this per add

    def __init__(self, *, initial_loss: float, floor: float = 0.01) -> None:
        self.initial_loss = checks.number("initial_loss", initial_loss)
        self.floor = checks.number("floor", floor, 0.0, low_open=True)

    def initial_weights(self, view: BufferView, n: int, features: np.ndarray | None) -> np.ndarray:
        if features is None or features.ndim != 2 or features.shape != (n, 1):
            raise ValueError(f"ReducibleLossPrior reads one feature per row, its irreducible loss: pass "
                             f"features=irreducible[:, None] to the sampler (got "
                             f"{None if features is None else features.shape})")
        return np.maximum(self.initial_loss - features[:, 0], 0.0) + self.floor

"""Which slots to overwrite when the buffer is full.

An eviction sees the buffer's sum tree through a `TreeReadView`: it may read keys and priorities and select
the lowest keys, but it cannot write the tree, which the buffer alone keeps consistent with its slots. `choose`
only reads: the buffer may still refuse the add after it (a storage write that fails), so any state an eviction
keeps moves on in `commit`, once the new examples are in. A built-in eviction also offers its rule
fused with the buffer's slot placement (`fused_place`, see `strategies.fused`); a subclass that overrides
`choose` loses the inherited one.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numba import njit

from ..kernels.buffer import place
from ..kernels.tree import select_lowest
from ..sumtree import SumTree
from ..state.checks import integer
from .fused import FusedStep, drop_inherited_step, overrides


class TreeReadView:
    """What an eviction may read of the buffer's `SumTree`: its size, the node arrays as read-only views, and
    the queries that change nothing (`get`, `get_keys`, `lowest`, `argmin`, totals and minima). Writing an array
    raises numpy's read-only error; a `SumTree` writer (`set`, `pop_min`, ...) raises an AttributeError that says
    why it is not there."""

    __slots__ = ("_tree", "capacity", "n_leaves", "dtype", "layout", "nodes", "sums", "minp", "keys", "raw")
    _ARRAYS = ("layout", "nodes", "sums", "minp", "keys", "raw")

    def __init__(self, tree: SumTree) -> None:
        self._tree = tree
        self.capacity, self.n_leaves, self.dtype = tree.capacity, tree.n_leaves, tree.dtype
        for name in self._ARRAYS:  # views of the tree's arrays: they follow its writes, refuse their own
            array = getattr(tree, name).view()
            array.flags.writeable = False
            setattr(self, name, array)

    @property
    def total(self) -> float:
        return self._tree.total

    def raw_total(self) -> float:
        return self._tree.raw_total()

    def min_priority(self) -> float:
        return self._tree.min_priority()

    def min_key(self) -> float:
        return self._tree.min_key()

    def get(self, slots: np.ndarray) -> np.ndarray:
        return self._tree.get(slots)

    def get_keys(self, slots: np.ndarray) -> np.ndarray:
        return self._tree.get_keys(slots)

    def argmin(self) -> int:
        return self._tree.argmin()

    def lowest(self, k: int) -> np.ndarray:
        return self._tree.lowest(k)

    def __getattr__(self, name: str) -> Any:
        if hasattr(SumTree, name):
            raise AttributeError(f"SumTree.{name} is not available to an eviction: it sees the buffer's tree "
                                 "read-only (choose() returns the slots to overwrite; the buffer writes them)")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class Eviction:
    name = "eviction"
    uses_min_key = False  # True: the buffer's tree keeps a min index over the weights for this eviction

    commits = False  #: whether `commit` is overridden, set for every subclass: the buffer skips the base's no-op

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        drop_inherited_step(cls, "choose", "fused_place")  # a subclass's own choose is never bypassed
        cls.commits = overrides(cls, Eviction, "commit")

    def choose(self, tree: TreeReadView, k: int) -> np.ndarray:
        """Return k distinct occupied slots to overwrite (int64); must not change any state."""
        raise NotImplementedError

    def fused_place(self) -> FusedStep | None:
        """Optional: ``(step, args)``, `choose` and the buffer's slot placement as one compiled call, or None (the
        buffer then calls `choose`, checks the victims and places the slots itself, with the same result).

        The buffer calls ``step(nodes, layout, capacity, size, n, *args)`` for an add of n examples, which must
        choose ``max(0, n - (capacity - size))`` victims as `choose` would and return
        ``kernels.buffer.place(capacity, size, n, victims)``. The victims are not checked: a step must give
        distinct stored slots by construction.
        """
        return None

    def commit(self, tree: TreeReadView, slots: np.ndarray) -> None:
        """The buffer overwrote `slots` (the ones `choose` gave)."""

    def bind(self, capacity: int) -> None:
        """Learn the buffer's capacity (called once by the buffer), so a loaded state can be checked against it."""
        self.capacity = capacity

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore `state_dict`; a subclass with state checks every value before assigning any (`state_checks`)."""


class EvictLowest(Eviction):
    """Paper default: overwrite the examples of lowest current weight (ties: lowest slot).

    Ranks on live weights through the tree's min index, in O(k log(N/k)) (`kernels.minselect`); the k victims
    of one add are chosen among the examples present before that add, so a batch never overwrites its own
    examples.
    """

    name = "lowest"
    uses_min_key = True

    def choose(self, tree, k):
        return tree.lowest(k)

    def fused_place(self):
        return place_lowest, ()


class FIFO(Eviction):
    """Overwrite the oldest examples (a ring over the slots, which fill in order)."""

    name = "fifo"

    def __init__(self) -> None:
        self.next_slot = 0

    def choose(self, tree, k):
        return ring_slots(self.next_slot, tree.capacity, k)

    def fused_place(self):
        return place_fifo, (self.next_slot,)

    def commit(self, tree, slots):
        self.next_slot = int((self.next_slot + len(slots)) % tree.capacity)

    def state_dict(self):
        return {"next_slot": self.next_slot}

    def load_state_dict(self, state):
        high = getattr(self, "capacity", None)
        self.next_slot = integer(state, "next_slot", "fifo state", 0, None if high is None else high - 1)


@njit(cache=True, nogil=True)
def ring_slots(next_slot, capacity, k):
    """The FIFO rule: the k slots from `next_slot` on, wrapping around at `capacity` (k <= capacity)."""
    out = np.empty(k, np.int64)
    slot = next_slot % capacity
    for j in range(k):
        out[j] = slot
        slot = slot + 1 if slot + 1 < capacity else 0
    return out


@njit(cache=True, nogil=True)
def place_lowest(nodes, layout, capacity, size, n):
    """`EvictLowest.fused_place`: the lowest-weight victims, placed, in one call."""
    return place(capacity, size, n, select_lowest(nodes, layout, max(0, n - (capacity - size))))


@njit(cache=True, nogil=True)
def place_fifo(nodes, layout, capacity, size, n, next_slot):
    """`FIFO.fused_place`: the oldest slots as victims, placed, in one call."""
    return place(capacity, size, n, ring_slots(next_slot, capacity, max(0, n - (capacity - size))))

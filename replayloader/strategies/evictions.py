"""Which slots to overwrite when the buffer is full.

`choose` only reads: the buffer may still refuse the add after it (a storage write that fails), so any state
an eviction keeps moves on in `commit`, once the new examples are in.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..kernels.tree import select_lowest
from ..sumtree import SumTree


class Eviction:
    name = "eviction"
    uses_min_key = False  # True: the buffer's tree keeps a min index over the weights for this eviction

    def choose(self, tree: SumTree, k: int) -> np.ndarray:
        """Return k distinct occupied slots to overwrite (int64); must not change any state."""
        raise NotImplementedError

    def commit(self, tree: SumTree, slots: np.ndarray) -> None:
        """The buffer overwrote `slots` (the ones `choose` gave)."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: Mapping) -> None:
        pass


class EvictLowest(Eviction):
    """Paper default: overwrite the examples of lowest current weight (ties: lowest slot).

    Ranks on live weights through the tree's min index, in O(k log(N/k)) (`kernels.minselect`); the k victims
    of one add are chosen among the examples present before that add, so a batch never overwrites its own
    examples.
    """

    name = "lowest"
    uses_min_key = True

    def choose(self, tree, k):
        return select_lowest(tree.nodes, tree.layout, k)


class FIFO(Eviction):
    """Overwrite the oldest examples (a ring over the slots, which fill in order)."""

    name = "fifo"

    def __init__(self) -> None:
        self.next_slot = 0

    def choose(self, tree, k):
        return (self.next_slot + np.arange(k, dtype=np.int64)) % tree.capacity

    def commit(self, tree, slots):
        self.next_slot = int((self.next_slot + len(slots)) % tree.capacity)

    def state_dict(self):
        return {"next_slot": self.next_slot}

    def load_state_dict(self, state):
        self.next_slot = int(state["next_slot"])

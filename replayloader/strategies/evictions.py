"""Which slots to overwrite when the buffer is full."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..sumtree import SumTree


class Eviction:
    name = "eviction"
    uses_min_key = False  # True: the buffer's tree keeps a min index over the weights for this eviction

    def choose(self, tree: SumTree, k: int) -> np.ndarray:
        """Return k distinct occupied slots to overwrite; the caller sets their weights right away."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: Mapping) -> None:
        pass


class EvictLowest(Eviction):
    """Paper default: overwrite the examples of lowest current weight (ties: lowest slot).

    Ranks on live weights through the tree's min index, in O(k log N); the k victims of one add are chosen
    among the examples present before that add, so a batch never overwrites its own examples.
    """

    name = "lowest"
    uses_min_key = True

    def choose(self, tree, k):
        return tree.pop_min(k, empty=False)  # the buffer writes these slots right away


class FIFO(Eviction):
    """Overwrite the oldest examples (a ring over the slots, which fill in order)."""

    name = "fifo"

    def __init__(self) -> None:
        self.next_slot = 0

    def choose(self, tree, k):
        slots = (self.next_slot + np.arange(k)) % tree.capacity
        self.advance(k, tree.capacity)
        return slots

    def advance(self, k: int, capacity: int) -> None:
        """Move the ring past k slots that the buffer's kernel overwrote (the same slots `choose` would give)."""
        self.next_slot = int((self.next_slot + k) % capacity)

    def state_dict(self):
        return {"next_slot": self.next_slot}

    def load_state_dict(self, state):
        self.next_slot = int(state["next_slot"])

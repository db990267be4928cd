"""The trees `PromptSampler` draws from, as plain arrays its compiled kernels (`replayloader.kernels.prompts`)
read and write in one call per batch.

Why not one `SumTree` per tree: a batch of B prompts is drawn one place at a time, each drawn prompt hidden
before the next place, and through `SumTree`'s Python methods that is a dozen calls per place. The arrays hold
the same values `SumTree` would (every node is recomputed from its children), so draws are unchanged.
"""
from __future__ import annotations

import numpy as np

from ..kernels.prompts import COUNT, KEY


def _leaves_for(capacity: int) -> int:
    """Leaves of a tree over ``capacity`` slots (at least one): the next power of two."""
    return 1 << max(0, int(max(1, capacity) - 1).bit_length())


class PromptTrees:
    """The data tree (A_i), one tree per bucket (c_i, by a prompt's position in its bucket) and the active tree
    (count of active prompts and the retest keys). `replayloader.kernels.prompts` describes the layout."""

    def __init__(self, num_prompts: int, bucket_sizes: list[int]) -> None:
        self.n_leaves = _leaves_for(num_prompts)
        self.data = np.zeros(2 * self.n_leaves)
        leaves = np.array([_leaves_for(size) for size in bucket_sizes], np.int64)
        bases = np.concatenate(([0], np.cumsum(2 * leaves)[:-1])).astype(np.int64)
        self.prior_at = np.ascontiguousarray(np.stack([bases, leaves], axis=1))
        self.prior = np.zeros(int(2 * leaves.sum()))
        self.active = np.zeros((2 * self.n_leaves, 2))
        self.active[:, KEY] = np.inf

    def arrays(self) -> tuple:
        """The kernels' tree arguments, in their order: data, prior, prior_at, active, n_leaves."""
        return self.data, self.prior, self.prior_at, self.active, self.n_leaves

    def active_count(self) -> int:
        """How many prompts are not retired (the active tree's total, a sum of 0/1 leaves)."""
        return int(round(float(self.active[1, COUNT])))

    def data_leaves(self, indices: np.ndarray) -> np.ndarray:
        """A_i of the prompts ``indices``."""
        return self.data[self.n_leaves + indices]

    def prior_leaves(self, buckets: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """c_i of the prompts at ``positions`` in the trees of ``buckets``."""
        at = self.prior_at[buckets]
        return self.prior[at[:, 0] + at[:, 1] + positions]

    def retest_keys(self, indices: np.ndarray) -> np.ndarray:
        """The retest key of the prompts ``indices`` (+inf: not judged)."""
        return self.active[self.n_leaves + indices, KEY]

"""A plain-Python sum tree (lists and loops, no numpy in the hot path): the benchmark's floor.

Same operations as `replayloader.SumTree`: set leaves (recomputing ancestors from children), total, stratified
sampling, and evict-lowest through a min tree over the same leaves (argmin in O(log N)).
"""
from __future__ import annotations

import math


class PurePythonSumTree:
    """1-indexed binary heap over ``size`` leaves (capacity rounded up to a power of two)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        size = 1
        while size < capacity:
            size *= 2
        self.size = size
        self.sums = [0.0] * (2 * size)
        self.mins = [math.inf] * (2 * size)  # empty leaves are +inf so they are never the argmin

    def build(self, priorities) -> None:
        """Set leaves 0..len-1 and rebuild every parent once (O(N))."""
        size, sums, mins = self.size, self.sums, self.mins
        for s, p in enumerate(priorities):
            sums[size + s] = float(p)
            mins[size + s] = float(p)
        for i in range(size - 1, 0, -1):
            sums[i] = sums[2 * i] + sums[2 * i + 1]
            a, b = mins[2 * i], mins[2 * i + 1]
            mins[i] = a if a < b else b

    @property
    def total(self) -> float:
        return self.sums[1]

    def set(self, slots, priorities) -> None:
        size, sums, mins = self.size, self.sums, self.mins
        for s, p in zip(slots, priorities):
            i = size + s
            sums[i] = p
            mins[i] = p
            i >>= 1
            while i:
                left = 2 * i
                sums[i] = sums[left] + sums[left + 1]
                a, b = mins[left], mins[left + 1]
                mins[i] = a if a < b else b
                i >>= 1

    def sample(self, uniforms) -> list:
        """Stratified: draw j falls in the j-th of K equal segments of the mass; never a zero-mass leaf."""
        size, sums = self.size, self.sums
        k = len(uniforms)
        seg = sums[1] / k
        out = []
        for j, u in enumerate(uniforms):
            target = (j + u) * seg
            i = 1
            while i < size:
                left = 2 * i
                mass_left = sums[left]
                if (target < mass_left and mass_left > 0.0) or sums[left + 1] <= 0.0:
                    i = left
                else:
                    target -= mass_left
                    i = left + 1
            out.append(i - size)
        return out

    def pop_min(self, k: int) -> list:
        """Empty and return the k leaves of lowest priority."""
        size, sums, mins = self.size, self.sums, self.mins
        out = []
        for _ in range(k):
            i = 1
            while i < size:
                left = 2 * i
                i = left if mins[left] <= mins[left + 1] else left + 1
            out.append(i - size)
            sums[i] = 0.0
            mins[i] = math.inf
            i >>= 1
            while i:
                left = 2 * i
                sums[i] = sums[left] + sums[left + 1]
                a, b = mins[left], mins[left + 1]
                mins[i] = a if a < b else b
                i >>= 1
        return out

"""Adapters that drive each peer through the benchmark's operations, each in its fastest documented way.

Tree-level adapters (`*Tree`) share one interface:
    impl = Cls(n, priorities)          # a full tree: leaves 0..n-1 hold `priorities` (float64 numpy array)
    impl.prep_slots(a) / impl.prep_priorities(a) / impl.prep_uniforms(a)   # native inputs, made before timing
    impl.update(slots, priorities)     # set K leaves
    impl.sample(uniforms)              # K stratified draws -> slots
    impl.step(uniforms, priorities)    # evict the K lowest and refill them at the mean priority,
                                       # then sample K and set the sampled leaves to `priorities`
Whole-buffer adapters (`*Buffer`):
    impl = Cls(n, priorities, fill)    # fill(start, stop) -> int64 tokens (stop-start, 128)
    impl.prep_tokens(a) / impl.prep_priorities(a)
    impl.step(tokens, priorities)      # add K examples, sample K with their data, update the K sampled

Peers are optional: `TORCHRL_ERROR` / `CPPRB_ERROR` hold the import error (None when importable).
"""
from __future__ import annotations

import numpy as np

from bench.pure_python_tree import PurePythonSumTree

try:  # TorchRL's C++ segment trees and its PrioritizedReplayBuffer (needs torch 2.14 for torchrl 0.14)
    import torch
    from tensordict import TensorDict
    from torchrl._torchrl import (MinSegmentTreeFp32, MinSegmentTreeFp64, SumSegmentTreeFp32,
                                  SumSegmentTreeFp64)
    from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer as TorchRLPRB

    TORCHRL_ERROR = None
except Exception as exc:  # ImportError, or the C++ extension failing to load
    TORCHRL_ERROR = f"{type(exc).__name__}: {exc}"

try:
    import cpprb

    CPPRB_ERROR = None
except Exception as exc:
    CPPRB_ERROR = f"{type(exc).__name__}: {exc}"

BETA = 0.4  # importance-weight exponent for every buffer that computes weights


def _identity(a):
    return a


# ---------------------------------------------------------------------------------------------- tree level
class TorchRLTree:
    """`torchrl._torchrl` Sum + Min segment trees (as TorchRL's PrioritizedSampler keeps them), numpy overloads.

    Stratified sampling: mass_j = (j + u_j) * total / K, then `scan_lower_bound`. These trees have no argmin,
    so evict-lowest is O(N): `np.argpartition` over a numpy mirror of the leaves (the fastest of the options
    measured: reading the leaves back with `at()` + argpartition, or torch.topk, are 1.3-2x slower).
    """

    ops = ("update", "sample", "step")

    def __init__(self, n, priorities, fp64=False):
        self.dtype = np.float64 if fp64 else np.float32
        self.sum = (SumSegmentTreeFp64 if fp64 else SumSegmentTreeFp32)(n)
        self.min = (MinSegmentTreeFp64 if fp64 else MinSegmentTreeFp32)(n)
        self.n = n
        p = priorities.astype(self.dtype)
        idx = np.arange(n, dtype=np.int64)
        self.sum.update(idx, p)
        self.min.update(idx, p)
        self.mirror = p.copy()  # leaf values, for the O(N) evict-lowest of `step`

    prep_slots = staticmethod(_identity)
    prep_uniforms = staticmethod(_identity)

    def prep_priorities(self, a):
        return a.astype(self.dtype)

    def update(self, slots, priorities):
        self.sum.update(slots, priorities)
        self.min.update(slots, priorities)

    def sample(self, uniforms):
        k = uniforms.shape[0]
        total = self.sum.query(0, self.n)
        mass = ((np.arange(k) + uniforms) * (total / k)).astype(self.dtype)
        return self.sum.scan_lower_bound(mass)

    def step(self, uniforms, priorities):
        k = uniforms.shape[0]
        mean = self.sum.query(0, self.n) / self.n
        victims = np.argpartition(self.mirror, k - 1)[:k]
        self.update(victims, np.full(k, mean, self.dtype))
        self.mirror[victims] = mean
        slots = self.sample(uniforms)
        self.update(slots, priorities)
        self.mirror[slots] = priorities
        return slots


class CpprbTree:
    """cpprb exposes no tree, only its `PrioritizedReplayBuffer`: here with one float32 field per item.

    update = `update_priorities`; sample = `sample(K)`, which also gathers that one field and computes the
    importance weights (so it does a little more than a bare tree). No evict-lowest (cpprb is FIFO): no step.
    """

    ops = ("update", "sample")

    def __init__(self, n, priorities):
        self.rb = cpprb.PrioritizedReplayBuffer(n, {"x": {"shape": 1, "dtype": np.float32}}, alpha=1.0)
        self.rb.add(x=np.zeros((n, 1), np.float32), priorities=priorities.astype(np.float32))

    prep_slots = staticmethod(_identity)
    prep_uniforms = staticmethod(_identity)

    def prep_priorities(self, a):
        return a.astype(np.float32)

    def update(self, slots, priorities):
        self.rb.update_priorities(slots, priorities)

    def sample(self, uniforms):
        return self.rb.sample(uniforms.shape[0], beta=BETA)["indexes"]


class PurePythonTree:
    """bench/pure_python_tree.py: Python lists and loops."""

    ops = ("update", "sample", "step")

    def __init__(self, n, priorities):
        self.tree = PurePythonSumTree(n)
        self.tree.build(priorities.tolist())
        self.n = n

    @staticmethod
    def prep_slots(a):
        return a.tolist()

    prep_priorities = prep_uniforms = prep_slots

    def update(self, slots, priorities):
        self.tree.set(slots, priorities)

    def sample(self, uniforms):
        return self.tree.sample(uniforms)

    def step(self, uniforms, priorities):
        k = len(uniforms)
        mean = self.tree.total / self.n
        victims = self.tree.pop_min(k)
        self.tree.set(victims, [mean] * k)
        slots = self.tree.sample(uniforms)
        self.tree.set(slots, priorities)
        return slots


# ---------------------------------------------------------------------------------------------- whole buffer
FILL_CHUNK = 65536


class TorchRLBuffer:
    """`torchrl.data.PrioritizedReplayBuffer` over a `LazyTensorStorage` (CPU), alpha=1, beta=0.4.

    Default writer (round robin = FIFO eviction) and default new-item priority (the max so far). Items are plain
    int64 tensors of 128 tokens (faster than wrapping them in a TensorDict).
    """

    def __init__(self, n, priorities, fill):
        self.rb = TorchRLPRB(alpha=1.0, beta=BETA, storage=LazyTensorStorage(n))
        for start in range(0, n, FILL_CHUNK):
            self.rb.extend(torch.from_numpy(fill(start, min(n, start + FILL_CHUNK))))
        self.rb.update_priority(torch.arange(n), torch.from_numpy(priorities.astype(np.float32)))

    @staticmethod
    def prep_tokens(a):
        return torch.from_numpy(a)

    @staticmethod
    def prep_priorities(a):
        return torch.from_numpy(a.astype(np.float32))

    def step(self, tokens, priorities):
        self.rb.extend(tokens)
        data, info = self.rb.sample(tokens.shape[0], return_info=True)
        self.rb.update_priority(info["index"], priorities)
        return data


class TorchRLTensorDictBuffer(TorchRLBuffer):
    """Same, with each batch a TensorDict {"tokens": (K, 128)} (the usual TorchRL data type)."""

    def __init__(self, n, priorities, fill):
        self.rb = TorchRLPRB(alpha=1.0, beta=BETA, storage=LazyTensorStorage(n))
        for start in range(0, n, FILL_CHUNK):
            chunk = torch.from_numpy(fill(start, min(n, start + FILL_CHUNK)))
            self.rb.extend(TensorDict({"tokens": chunk}, batch_size=[chunk.shape[0]]))
        self.rb.update_priority(torch.arange(n), torch.from_numpy(priorities.astype(np.float32)))

    @staticmethod
    def prep_tokens(a):
        return TensorDict({"tokens": torch.from_numpy(a)}, batch_size=[a.shape[0]])

    def step(self, tokens, priorities):
        self.rb.extend(tokens)
        data, info = self.rb.sample(tokens.batch_size[0], return_info=True)
        self.rb.update_priority(info["index"], priorities)
        return data


class CpprbBuffer:
    """`cpprb.PrioritizedReplayBuffer`, alpha=1, beta=0.4; FIFO eviction, new items at the max priority."""

    def __init__(self, n, priorities, fill):
        self.rb = cpprb.PrioritizedReplayBuffer(n, {"tokens": {"shape": 128, "dtype": np.int64}}, alpha=1.0)
        for start in range(0, n, FILL_CHUNK):
            stop = min(n, start + FILL_CHUNK)
            self.rb.add(tokens=fill(start, stop), priorities=priorities[start:stop].astype(np.float32))

    prep_tokens = staticmethod(_identity)

    @staticmethod
    def prep_priorities(a):
        return a.astype(np.float32)

    def step(self, tokens, priorities):
        self.rb.add(tokens=tokens)
        s = self.rb.sample(tokens.shape[0], beta=BETA)
        self.rb.update_priorities(s["indexes"], priorities)
        return s

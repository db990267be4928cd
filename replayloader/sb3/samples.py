"""The batch types a prioritized buffer returns.

Why new NamedTuples rather than extra attributes: SB3's algorithms read batches by field name, so a tuple
whose first six fields are exactly SB3's (`ReplayBufferSamples` / `DictReplayBufferSamples`, same names, same
order) works wherever SB3's does, and the two extra fields travel with the batch instead of living as mutable
state on the buffer. ``weights`` is a (batch, 1) float32 tensor on the buffer's device, shaped like
``rewards`` so it broadcasts against per-transition losses; ``indices`` is a numpy int64 array of flat slots
(``position * n_envs + env``), the argument `update_priorities` takes back.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch as th
from stable_baselines3.common.type_aliases import TensorDict


class PrioritizedReplayBufferSamples(NamedTuple):
    """SB3's `ReplayBufferSamples` plus ``weights`` and ``indices``."""

    observations: th.Tensor
    actions: th.Tensor
    next_observations: th.Tensor
    dones: th.Tensor
    rewards: th.Tensor
    discounts: th.Tensor | None
    weights: th.Tensor
    indices: np.ndarray


class PrioritizedDictReplayBufferSamples(NamedTuple):
    """SB3's `DictReplayBufferSamples` plus ``weights`` and ``indices``."""

    observations: TensorDict
    actions: th.Tensor
    next_observations: TensorDict
    dones: th.Tensor
    rewards: th.Tensor
    discounts: th.Tensor | None
    weights: th.Tensor
    indices: np.ndarray

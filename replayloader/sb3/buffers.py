"""The two SB3 buffer classes with prioritized sampling: storage and `add` are SB3's, the rule is
`PrioritizedMixin`'s, and each class here only reads the sampled rows.

Why the gathering is re-written rather than inherited: SB3's ``_get_samples`` draws the env of each sampled
row itself (uniformly, from numpy's global RNG); prioritized sampling must choose the (position, env) pair
together, so the pair is passed in. The reading follows SB3 2.9's ``ReplayBuffer._get_samples`` /
``DictReplayBuffer._get_samples`` field for field: next observation from the next row when
``optimize_memory_usage``, a done that came from a time limit counts as not done when
``handle_timeout_termination``, observations and rewards normalized through ``env`` (a `VecNormalize`) when one
is given.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from stable_baselines3.common.buffers import DictReplayBuffer, NStepReplayBuffer, ReplayBuffer

from .. import _checks as checks

from .priorities import PrioritizedMixin
from .samples import PrioritizedDictReplayBufferSamples, PrioritizedReplayBufferSamples


def _flat(storage: np.ndarray) -> np.ndarray:
    """A (position, env, ...) storage array as (position * env, ...), a view (SB3 allocates it contiguous)."""
    return storage.reshape(storage.shape[0] * storage.shape[1], *storage.shape[2:])


class PrioritizedReplayBuffer(PrioritizedMixin, ReplayBuffer):
    """SB3's `ReplayBuffer` with proportional prioritized sampling (Schaul et al. 2016).

    Positional arguments are SB3's (``buffer_size, observation_space, action_space, device, n_envs,
    optimize_memory_usage, handle_timeout_termination``); the prioritized options are keyword-only and are
    usually given through an algorithm's ``replay_buffer_kwargs``:

    Args:
        alpha: priority exponent, P(i) ∝ (priority_i + priority_eps) ** alpha; 0 samples uniformly.
        beta: importance-weight exponent in [0, 1], a float or a callable of training progress (0 → 1);
            default ``replayloader.LinearSchedule(0.4, 1.0, steps=1)``, PER's annealing to 1 over ``learn``.
            Use a picklable callable (not a lambda) if you save the buffer.
        priority_eps: added to every priority, so that no transition's probability is 0.
        require_feedback: raise `MissingFeedbackError` on a `sample` whose previous batch got no
            `update_priorities` (the guard against algorithms that never feed priorities back).
        seed: seed of the buffer's own sampling RNG; None derives it from numpy's global RNG (which SB3 seeds).

    Samples are `PrioritizedReplayBufferSamples`: SB3's fields, then ``weights`` and ``indices``.

    >>> import numpy as np
    >>> from gymnasium import spaces
    >>> from replayloader.sb3 import PrioritizedReplayBuffer
    >>> buffer = PrioritizedReplayBuffer(100, spaces.Box(-1, 1, (3,)), spaces.Discrete(2), n_envs=2,
    ...                                  alpha=0.6, beta=0.4, seed=0)
    >>> for _ in range(10):
    ...     buffer.add(np.zeros((2, 3)), np.ones((2, 3)), np.array([0, 1]), np.array([1.0, 0.0]),
    ...                np.array([False, False]), [{}, {}])
    >>> batch = buffer.sample(4)
    >>> batch.weights.shape, batch.indices.shape
    (torch.Size([4, 1]), (4,))
    >>> buffer.update_priorities(batch.indices, np.array([0.1, 1.0, 3.0, 0.5]))
    """

    _samples_type = PrioritizedReplayBufferSamples

    def _read(self, slots: np.ndarray, env: Any) -> tuple:
        """`_gather`'s fields, read by flat slot: storage is (position, env, ...) in C order, so flat slot
        ``position * n_envs + env`` is the row of the storage seen as (position * env, ...), and one index array
        replaces two. Each field is a fresh array of this call, so its tensor may share it (no copy on the CPU)."""
        if self.optimize_memory_usage:
            following = _flat(self.observations).take((slots + self.n_envs) % (self.buffer_size * self.n_envs),
                                                      axis=0)
        else:
            following = _flat(self.next_observations).take(slots, axis=0)
        terminal = self.dones.reshape(-1).take(slots) * (1.0 - self.timeouts.reshape(-1).take(slots))
        rewards = self.rewards.reshape(-1).take(slots).reshape(-1, 1)
        tensor = self.to_torch
        return (tensor(self._normalize_obs(_flat(self.observations).take(slots, axis=0), env), copy=False),
                tensor(_flat(self.actions).take(slots, axis=0), copy=False),
                tensor(self._normalize_obs(following, env), copy=False),
                tensor(terminal.reshape(-1, 1), copy=False),
                tensor(self._normalize_reward(rewards, env), copy=False),
                None)  # discounts: one-step returns, the algorithm uses its gamma

    def _gather(self, rows: np.ndarray, envs: np.ndarray, env: Any) -> tuple:
        """The fields of (position, env) pairs, as SB3's ``_get_samples`` reads them (`_read` is the same by
        flat slot)."""
        if self.optimize_memory_usage:
            following = self.observations[(rows + 1) % self.buffer_size, envs]
        else:
            following = self.next_observations[rows, envs]
        terminal = self.dones[rows, envs] * (1.0 - self.timeouts[rows, envs])
        return (self.to_torch(self._normalize_obs(self.observations[rows, envs], env)),
                self.to_torch(self.actions[rows, envs]),
                self.to_torch(self._normalize_obs(following, env)),
                self.to_torch(terminal.reshape(-1, 1)),
                self.to_torch(self._normalize_reward(self.rewards[rows, envs].reshape(-1, 1), env)),
                None)  # discounts: one-step returns, the algorithm uses its gamma


class PrioritizedDictReplayBuffer(PrioritizedMixin, DictReplayBuffer):
    """SB3's `DictReplayBuffer` with the same prioritized sampling as `PrioritizedReplayBuffer` (same options;
    ``optimize_memory_usage`` is refused by SB3 for dict observations). Samples are
    `PrioritizedDictReplayBufferSamples`.

    >>> import numpy as np
    >>> from gymnasium import spaces
    >>> from replayloader.sb3 import PrioritizedDictReplayBuffer
    >>> space = spaces.Dict({"pos": spaces.Box(-1, 1, (2,)), "flag": spaces.Discrete(3)})
    >>> buffer = PrioritizedDictReplayBuffer(50, space, spaces.Discrete(2), seed=0)
    >>> obs = {"pos": np.zeros((1, 2)), "flag": np.array([1])}
    >>> buffer.add(obs, obs, np.array([1]), np.array([0.5]), np.array([False]), [{}])
    >>> sorted(buffer.sample(2).observations)
    ['flag', 'pos']
    """

    _samples_type = PrioritizedDictReplayBufferSamples

    def _gather(self, rows: np.ndarray, envs: np.ndarray, env: Any) -> tuple:
        def read(storage: dict[str, np.ndarray]) -> dict:
            picked = self._normalize_obs({key: array[rows, envs] for key, array in storage.items()}, env)
            return {key: self.to_torch(value) for key, value in picked.items()}  # type: ignore[union-attr]

        terminal = self.dones[rows, envs] * (1.0 - self.timeouts[rows, envs])
        return (read(self.observations),
                self.to_torch(self.actions[rows, envs]),
                read(self.next_observations),
                self.to_torch(terminal.reshape(-1, 1)),
                self.to_torch(self._normalize_reward(self.rewards[rows, envs].reshape(-1, 1), env)),
                None)


class PrioritizedNStepReplayBuffer(PrioritizedMixin, NStepReplayBuffer):
    """SB3's `NStepReplayBuffer` (n-step returns computed at sampling time) with the same prioritized sampling as
    `PrioritizedReplayBuffer`. A prioritized algorithm built with ``n_steps > 1`` picks it; its priority is then
    the n-step TD error.

    Args (besides `PrioritizedReplayBuffer`'s): ``n_steps`` (>= 1) and ``gamma`` (in [0, 1]), SB3's; the
    algorithm passes its own. ``optimize_memory_usage`` is refused, as SB3's n-step buffer refuses it.

    The n-step reading follows SB3 2.9's ``NStepReplayBuffer._get_samples`` field for field, for the (position,
    env) pairs the tree drew: rewards are summed with gamma ** k until the first done or time-out (inclusive) or
    the newest stored row, whichever comes first (a sequence never reads past what was written last), the
    bootstrap's discount is gamma ** (steps summed), and the next observation and done are those of the last
    step summed (a time-out is not terminal).

    >>> import numpy as np
    >>> from gymnasium import spaces
    >>> from replayloader.sb3 import PrioritizedNStepReplayBuffer
    >>> buffer = PrioritizedNStepReplayBuffer(20, spaces.Box(-1, 1, (1,)), spaces.Discrete(2), n_steps=3,
    ...                                       gamma=0.5, seed=0)
    >>> for t in range(6):
    ...     buffer.add(np.zeros(1), np.zeros(1), np.array([0]), np.array([1.0]), np.array([t == 1]), [{}])
    >>> rows = np.array([0, 2, 5])  # an episode ending at row 1; a full 3 steps; the newest row
    >>> batch = buffer._gather(rows, np.zeros(3, dtype=np.int64), None)
    >>> batch[4].ravel().tolist(), batch[5].ravel().tolist(), batch[3].ravel().tolist()  # returns, discounts, dones
    ([1.5, 1.75, 1.0], [0.25, 0.125, 0.5], [1.0, 0.0, 0.0])
    """

    _samples_type = PrioritizedReplayBufferSamples

    def __init__(self, *args: Any, n_steps: int = 3, gamma: float = 0.99, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.n_steps = checks.integer("n_steps", n_steps, 1)
        self.gamma = checks.number("gamma", gamma, 0.0, 1.0)

    def _gather(self, rows: np.ndarray, envs: np.ndarray, env: Any) -> tuple:
        offsets = np.arange(self.n_steps)
        sequence = (rows[:, None] + offsets) % self.buffer_size  # (batch, n_steps) rows read
        column = envs[:, None]
        newest = (self.pos - 1) % self.buffer_size
        ends = (self.dones[sequence, column].astype(bool) | self.timeouts[sequence, column].astype(bool)
                | (sequence == newest))
        summed = np.where(ends.any(axis=1), ends.argmax(axis=1), self.n_steps - 1)  # index of the last step
        kept = offsets[None, :] <= summed[:, None]
        rewards = self._normalize_reward(self.rewards[sequence, column], env)
        powers = self.gamma ** offsets.astype(np.float32)
        returns = (rewards * powers[None, :] * kept).sum(axis=1, keepdims=True)
        discounts = self.gamma ** kept.sum(axis=1, keepdims=True).astype(np.float32)
        last = (rows + summed) % self.buffer_size
        terminal = self.dones[last, envs] * (1.0 - self.timeouts[last, envs])
        return (self.to_torch(self._normalize_obs(self.observations[rows, envs], env)),
                self.to_torch(self.actions[rows, envs]),
                self.to_torch(self._normalize_obs(self.next_observations[last, envs], env)),
                self.to_torch(terminal.reshape(-1, 1).astype(np.float32)),
                self.to_torch(returns),
                self.to_torch(discounts))

"""Small builders shared by the SB3 tests: a buffer filled with transitions whose reward is their flat slot,
so a sampled batch can be checked against the slots it claims, and CartPole with dict observations."""
from __future__ import annotations

import numpy as np
from gymnasium import spaces

from replayloader.sb3 import PrioritizedDictReplayBuffer, PrioritizedReplayBuffer

OBS = spaces.Box(-np.inf, np.inf, (2,), np.float32)
ACT = spaces.Discrete(3)


def dict_cartpole():
    """CartPole whose observation is ``{"state": <CartPole's array>}``: the smallest env with dict observations."""
    import gymnasium as gym

    class DictCartPole(gym.ObservationWrapper):
        def __init__(self, env):
            super().__init__(env)
            self.observation_space = spaces.Dict({"state": env.observation_space})

        def observation(self, observation):
            return {"state": observation}

    return DictCartPole(gym.make("CartPole-v1"))


def fill(buffer, steps: int, *, done_every: int = 0, truncated: bool = False) -> None:
    """Add ``steps`` vectorized transitions; transition (row, env) has reward and obs[0] = its flat slot."""
    n = buffer.n_envs
    for step in range(steps):
        row = buffer.pos
        slot = (row * n + np.arange(n)).astype(np.float32)
        obs = np.stack([slot, np.full(n, step, np.float32)], axis=1)
        done = np.full(n, done_every > 0 and step % done_every == done_every - 1)
        infos = [{"TimeLimit.truncated": bool(truncated and d)} for d in done]
        if isinstance(buffer, PrioritizedDictReplayBuffer):
            obs_in = {"vec": obs, "tag": (slot % 4).astype(np.int64)}
            buffer.add(obs_in, {k: v.copy() for k, v in obs_in.items()}, np.arange(n) % 3, slot, done, infos)
        else:
            buffer.add(obs, obs + 1, np.arange(n) % 3, slot, done, infos)


def flat_buffer(capacity: int = 64, *, n_envs: int = 1, **kwargs) -> PrioritizedReplayBuffer:
    kwargs.setdefault("seed", 0)
    return PrioritizedReplayBuffer(capacity, OBS, ACT, "cpu", n_envs=n_envs, **kwargs)


def dict_buffer(capacity: int = 64, *, n_envs: int = 1, **kwargs) -> PrioritizedDictReplayBuffer:
    kwargs.setdefault("seed", 0)
    space = spaces.Dict({"vec": OBS, "tag": spaces.Discrete(4)})
    return PrioritizedDictReplayBuffer(capacity, space, ACT, "cpu", n_envs=n_envs, **kwargs)


def snapshot(buffer) -> tuple:
    """Everything update_priorities may change, to compare before/after a refused call."""
    return (buffer.priorities().tolist(), buffer.max_priority, buffer._awaiting_feedback,
            buffer._new_leaves.tolist(), buffer._rng.bit_generator.state["state"])

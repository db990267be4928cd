"""PrioritizedNStepReplayBuffer: its n-step reading equals SB3's NStepReplayBuffer for the same (position, env)
pairs, including episode ends, time-outs, the newest row and wrap-around; the algorithms pick it for
``n_steps > 1`` and learn from its n-step TD errors; what does not fit is refused by name."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import NStepReplayBuffer

from replayloader.sb3 import PrioritizedDQN, PrioritizedNStepReplayBuffer, PrioritizedSAC

from .helpers import dict_cartpole

OBS, ACT = spaces.Box(-5, 5, (3,)), spaces.Discrete(4)


def filled_pair(seed: int, capacity: int, n_envs: int, steps: int, n_steps: int, gamma: float):
    rng = np.random.default_rng(seed)
    ours = PrioritizedNStepReplayBuffer(capacity, OBS, ACT, n_envs=n_envs, n_steps=n_steps, gamma=gamma, seed=seed)
    theirs = NStepReplayBuffer(capacity, OBS, ACT, n_envs=n_envs, n_steps=n_steps, gamma=gamma)
    for _ in range(steps):
        obs, following = rng.normal(size=(n_envs, 3)), rng.normal(size=(n_envs, 3))
        action, reward = rng.integers(0, 4, size=(n_envs, 1)), rng.normal(size=n_envs)
        done = rng.random(n_envs) < 0.15
        infos = [{"TimeLimit.truncated": bool(d and rng.random() < 0.4)} for d in done]
        for buffer in (ours, theirs):
            buffer.add(obs, following, action, reward, done, infos)
    return ours, theirs


@pytest.mark.parametrize("seed, capacity, n_envs, steps, n_steps", [
    (0, 50, 1, 30, 3),    # not full
    (1, 40, 2, 95, 3),    # full, wrapped around twice, two envs
    (2, 25, 3, 60, 5),    # long sequences over a short buffer
    (3, 30, 2, 30, 1),    # exactly full, one step: the plain reading
])
def test_reading_equals_sb3_nstep_buffer(seed, capacity, n_envs, steps, n_steps):
    ours, theirs = filled_pair(seed, capacity, n_envs, steps, n_steps, gamma=0.9)
    rows = np.arange(ours.size())  # every stored position, including the newest
    np.random.seed(seed)
    envs = np.random.randint(0, n_envs, size=rows.shape)
    np.random.seed(seed)  # SB3 draws the same env of each row from numpy's global RNG
    expected = theirs._get_samples(rows)
    got = ours._gather(rows, envs, None)
    for name, a, b in zip(expected._fields, got, expected, strict=True):
        th.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=name)


def test_dqn_picks_the_nstep_buffer_and_learns_from_its_returns():
    model = PrioritizedDQN("MlpPolicy", "CartPole-v1", n_steps=3, buffer_size=1_000, learning_starts=64,
                           batch_size=16, train_freq=1, seed=0, device="cpu", policy_kwargs={"net_arch": [16]})
    buffer = model.replay_buffer
    assert isinstance(buffer, PrioritizedNStepReplayBuffer) and (buffer.n_steps, buffer.gamma) == (3, model.gamma)
    model.learn(total_timesteps=300)
    batch = buffer.sample(64)
    buffer.update_priorities(batch.indices, np.ones(64))
    discounts = batch.discounts.numpy().ravel()
    allowed = model.gamma ** np.arange(1, 4)
    assert np.isclose(discounts[:, None], allowed[None, :], rtol=1e-6).any(axis=1).all()  # gamma ** (1, 2 or 3)
    assert (batch.discounts < model.gamma).any()  # most sequences sum more than one step
    masses = buffer.priorities()
    assert (masses != masses.max()).sum() > 100  # n-step |TD errors| came back


def test_sac_uses_nstep_returns_too():
    model = PrioritizedSAC("MlpPolicy", "Pendulum-v1", n_steps=2, buffer_size=500, learning_starts=32,
                           batch_size=8, seed=0, device="cpu", policy_kwargs={"net_arch": [8]})
    model.learn(total_timesteps=80)
    assert isinstance(model.replay_buffer, PrioritizedNStepReplayBuffer) and model.replay_buffer.n_steps == 2


def test_mismatches_are_refused_by_name():
    with pytest.raises(ValueError, match=r"replay_buffer_kwargs\['gamma'\] must equal the algorithm's gamma 0.99, "
                                         r"got 0.9"):
        PrioritizedDQN("MlpPolicy", "CartPole-v1", n_steps=3, replay_buffer_kwargs={"gamma": 0.9})
    with pytest.raises(ValueError, match=r"replay_buffer_kwargs\['n_steps'\] must equal the algorithm's n_steps 3, "
                                         r"got 5"):
        PrioritizedDQN("MlpPolicy", "CartPole-v1", n_steps=3, replay_buffer_kwargs={"n_steps": 5})
    with pytest.raises(ValueError, match="n_steps must be an integer >= 1, got 0"):
        PrioritizedNStepReplayBuffer(10, OBS, ACT, n_steps=0)
    with pytest.raises(NotImplementedError, match="optimize_memory_usage"):
        PrioritizedNStepReplayBuffer(10, OBS, ACT, optimize_memory_usage=True, handle_timeout_termination=False)


def test_dict_observations_with_nsteps_are_refused():
    with pytest.raises(ValueError, match="n_steps must be 1 with dict observations.*got 2"):
        PrioritizedDQN("MultiInputPolicy", dict_cartpole(), n_steps=2)


def test_saved_nstep_buffer_keeps_its_settings(tmp_path):
    import pickle

    ours, _ = filled_pair(4, 30, 2, 40, 4, gamma=0.8)
    loaded = pickle.loads(pickle.dumps(ours))
    assert (loaded.n_steps, loaded.gamma) == (4, 0.8)
    a, b = ours.sample(8), loaded.sample(8)
    np.testing.assert_array_equal(a.indices, b.indices)
    th.testing.assert_close(a.rewards, b.rewards, rtol=0, atol=0)

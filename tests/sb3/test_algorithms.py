"""PrioritizedDQN / PrioritizedQRDQN inside SB3: training, the missing-feedback guard, save/load continuity."""
from __future__ import annotations

import doctest
import subprocess
import sys

import pytest

pytest.importorskip("stable_baselines3")

import numpy as np
import torch as th
from stable_baselines3 import DQN
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.logger import configure

import replayloader.sb3 as sb3_package
from replayloader.sb3 import (
    MissingFeedbackError,
    PrioritizedDQN,
    PrioritizedReplayBuffer,
    buffers,
    dqn,
    priorities,
)

from .helpers import dict_cartpole

ENV = "CartPole-v1"


def small_dqn(cls=PrioritizedDQN, **kwargs):
    options = dict(buffer_size=2_000, learning_starts=64, batch_size=16, seed=0, device="cpu",
                   policy_kwargs={"net_arch": [32]})
    options.update(kwargs)
    return cls("MlpPolicy", ENV, **options)


def test_dqn_trains_with_weights_and_feedback():
    model = small_dqn(train_freq=1, target_update_interval=100)
    model.learn(total_timesteps=600)
    buffer = model.replay_buffer
    assert isinstance(buffer, PrioritizedReplayBuffer) and buffer.stored_slots() == 600
    masses = buffer.priorities()
    fed_back = masses != masses.max()
    assert fed_back.sum() > 100  # |TD| came back for many transitions, at many different values
    assert len(np.unique(np.round(masses[fed_back], 6))) > 50
    assert buffer.progress == pytest.approx(1.0) and buffer.current_beta() == pytest.approx(1.0)  # annealed
    assert model.logger.name_to_value["train/per_beta"] == pytest.approx(1.0, abs=0.01)
    assert np.isfinite(model.logger.name_to_value["train/loss"])


def test_unit_weights_give_exactly_sb3_dqn_step():
    """alpha = 0: every weight is 1, so one update must equal SB3's DQN.train on the same batch."""
    ours = small_dqn(replay_buffer_kwargs={"alpha": 0.0})
    theirs = small_dqn(DQN)
    theirs.policy.load_state_dict(ours.policy.state_dict())
    theirs.policy.optimizer.load_state_dict(ours.policy.optimizer.state_dict())
    ours.learn(total_timesteps=64)  # fills the buffer, no update yet (learning_starts)
    batch = ours.replay_buffer.sample(16)
    assert th.all(batch.weights == 1)
    ours.replay_buffer.update_priorities(batch.indices, np.zeros(16))
    ours.replay_buffer.sample = lambda *args, **kwargs: batch
    theirs.replay_buffer.sample = lambda *args, **kwargs: batch
    theirs.set_logger(configure(None, []))
    for model in (ours, theirs):
        model._current_progress_remaining = 0.5
        model.train(gradient_steps=1, batch_size=16)
    for a, b in zip(ours.policy.parameters(), theirs.policy.parameters()):
        th.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert not all(th.equal(a, b) for a, b in zip(ours.policy.parameters(), small_dqn().policy.parameters()))


def test_sb3_dqn_with_a_prioritized_buffer_fails_loudly():
    model = small_dqn(DQN, replay_buffer_class=PrioritizedReplayBuffer, gradient_steps=2)
    with pytest.raises(MissingFeedbackError, match="not feeding priorities back"):
        model.learn(total_timesteps=200)


def test_prioritized_dqn_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="replay_buffer_class must be a prioritized buffer.*got ReplayBuffer"):
        small_dqn(replay_buffer_class=ReplayBuffer)
    with pytest.raises(ValueError, match="n_steps=3 needs replay_buffer_class PrioritizedNStepReplayBuffer.*"
                                         "got PrioritizedReplayBuffer"):
        small_dqn(n_steps=3, replay_buffer_class=PrioritizedReplayBuffer)


def test_dict_observations_train():
    model = PrioritizedDQN("MultiInputPolicy", dict_cartpole(), buffer_size=500, learning_starts=32,
                           batch_size=8, seed=1, device="cpu", policy_kwargs={"net_arch": [16]})
    model.learn(total_timesteps=120)
    assert type(model.replay_buffer).__name__ == "PrioritizedDictReplayBuffer"
    assert (model.replay_buffer.priorities() != 1.0).any()


def test_several_envs_train():
    from stable_baselines3.common.env_util import make_vec_env

    model = PrioritizedDQN("MlpPolicy", make_vec_env(ENV, n_envs=3, seed=0), buffer_size=900, learning_starts=60,
                           batch_size=16, seed=0, device="cpu", policy_kwargs={"net_arch": [16]})
    model.learn(total_timesteps=300)
    buffer = model.replay_buffer
    assert buffer.n_envs == 3 and buffer.stored_slots() == 300
    fed = np.flatnonzero(buffer.priorities() != buffer.priorities().max()) % 3
    assert set(fed) == {0, 1, 2}  # every env's transitions are sampled and fed back


def test_saved_buffer_continues_with_identical_samples(tmp_path):
    model = small_dqn(train_freq=2)
    model.learn(total_timesteps=300)
    path = tmp_path / "buffer.pkl"
    model.save_replay_buffer(path)
    restored = small_dqn(seed=123)
    restored.load_replay_buffer(path)
    original, loaded = model.replay_buffer, restored.replay_buffer
    np.testing.assert_array_equal(loaded.priorities(), original.priorities())
    assert loaded.max_priority == original.max_priority and loaded.progress == original.progress
    feedback = np.random.default_rng(0)
    for _ in range(5):
        a, b = original.sample(32), loaded.sample(32)
        np.testing.assert_array_equal(a.indices, b.indices)
        th.testing.assert_close(a.weights, b.weights, rtol=0, atol=0)
        th.testing.assert_close(a.observations, b.observations, rtol=0, atol=0)
        values = feedback.random(32) * 3
        original.update_priorities(a.indices, values)
        loaded.update_priorities(b.indices, values)
    # the sum tree was rebuilt, not a stale copy: its root is the sum of the leaves
    assert loaded.tree.total == pytest.approx(loaded.priorities().sum())
    # and training goes on from the loaded buffer
    restored.learn(total_timesteps=50, reset_num_timesteps=False)


def test_qrdqn_quantile_loss_matches_sb3_contrib_and_trains():
    pytest.importorskip("sb3_contrib")
    from sb3_contrib.common.utils import quantile_huber_loss

    from replayloader.sb3.qrdqn import PrioritizedQRDQN, quantile_huber_per_sample

    gen = th.Generator().manual_seed(0)
    current, target = th.randn(7, 5, generator=gen) * 2, th.randn(7, 5, generator=gen) * 2
    th.testing.assert_close(quantile_huber_per_sample(current, target).mean(),
                            quantile_huber_loss(current, target, sum_over_quantiles=True))
    model = PrioritizedQRDQN("MlpPolicy", ENV, buffer_size=1_000, learning_starts=64, batch_size=16, seed=0,
                             device="cpu", policy_kwargs={"net_arch": [16], "n_quantiles": 8})
    model.learn(total_timesteps=300)
    assert (model.replay_buffer.priorities() != model.replay_buffer.max_priority ** 0.6).sum() > 20
    assert sb3_package.PrioritizedQRDQN is PrioritizedQRDQN


@pytest.mark.parametrize("module", [sb3_package, buffers, priorities, dqn])
def test_docstring_examples_run(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_core_import_stays_light_and_missing_sb3_says_how_to_install():
    light = subprocess.run([sys.executable, "-c", "import sys, replayloader; "
                            "print(sorted({'torch', 'stable_baselines3'} & set(sys.modules)))"],
                           capture_output=True, text=True, timeout=120)
    assert light.stdout.strip() == "[]", light.stderr
    missing = subprocess.run([sys.executable, "-c", "import sys; sys.modules['stable_baselines3'] = None; "
                              "import replayloader.sb3"], capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and 'pip install "replayloader[sb3]"' in missing.stderr

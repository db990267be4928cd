"""replayloader.sb3 with its networks on a CUDA device: every prioritized algorithm trains there with its weights
on the device and its priorities fed back, and with every weight 1 a DQN update equals SB3's on the device too.

Run by `checks/gpu_check.py` on a GPU machine; skipped where CUDA or Stable-Baselines3 is missing.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("stable_baselines3")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

from stable_baselines3 import DQN  # noqa: E402
from stable_baselines3.common.logger import configure  # noqa: E402

from replayloader.sb3 import PrioritizedDQN, PrioritizedSAC, PrioritizedTD3  # noqa: E402



def small(cls, env, **kwargs):
    """A fresh model each time (SB3 writes into the policy_kwargs dict it is given)."""
    return cls("MlpPolicy", env, buffer_size=2_000, learning_starts=64, batch_size=32, seed=0, device="cuda",
               policy_kwargs={"net_arch": [32]}, **kwargs)


@pytest.mark.parametrize("cls, env", [(PrioritizedDQN, "CartPole-v1"), (PrioritizedSAC, "Pendulum-v1"),
                                      (PrioritizedTD3, "Pendulum-v1")])
def test_prioritized_algorithms_train_on_cuda(cls, env):
    model = small(cls, env, train_freq=1)
    model.learn(total_timesteps=300)
    batch = model.replay_buffer.sample(32)
    assert batch.weights.device.type == "cuda" and batch.observations.device.type == "cuda"
    masses = model.replay_buffer.priorities()
    assert (masses != masses.max()).sum() > 100 and np.isfinite(masses).all()


def test_unit_weights_give_sb3_dqn_step_on_cuda():
    ours = small(PrioritizedDQN, "CartPole-v1", replay_buffer_kwargs={"alpha": 0.0})
    theirs = small(DQN, "CartPole-v1")
    theirs.policy.load_state_dict(ours.policy.state_dict())
    theirs.policy.optimizer.load_state_dict(ours.policy.optimizer.state_dict())
    ours.learn(total_timesteps=64)
    batch = ours.replay_buffer.sample(32)
    ours.replay_buffer.require_feedback = False
    ours.replay_buffer.sample = theirs.replay_buffer.sample = lambda *args, **kwargs: batch
    theirs.set_logger(configure(None, []))
    for model in (ours, theirs):
        model._current_progress_remaining = 0.5
        model.train(gradient_steps=1, batch_size=32)
    for a, b in zip(ours.policy.parameters(), theirs.policy.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)

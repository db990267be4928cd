"""experiments/sb3_cartpole_per.py (issue 42): the cpprb adapter behind PrioritizedDQN's training step, and the
summary on hand-made records; no real training run."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from experiments import sb3_cartpole_per as cartpole  # noqa: E402


def filled_buffer(n: int = 4, **kwargs):
    pytest.importorskip("cpprb")
    from gymnasium import spaces

    buffer = cartpole.cpprb_buffer_class()(16, spaces.Box(-1, 1, (2,), np.float32), spaces.Discrete(2),
                                           device="cpu", alpha=1.0, beta=1.0, priority_eps=1e-6, **kwargs)
    for i in range(n):
        buffer.add(np.full((1, 2), i, np.float32), np.full((1, 2), i + 0.5, np.float32), np.array([i % 2]),
                   np.array([float(i)]), np.array([0.0]), [{}])
    return buffer


def test_cpprb_adapter_reads_sb3_rows_at_the_slots_cpprb_draws_and_takes_feedback():
    buffer = filled_buffer()
    batch = buffer.sample(8)
    assert np.array_equal(batch.observations[:, 0].numpy(), batch.indices.astype(np.float32))  # row i holds i
    assert np.allclose(batch.weights.numpy(), 1.0)  # new transitions share the largest priority
    buffer.update_priorities(batch.indices, np.zeros(8))
    buffer.update_priorities(np.array([3]), np.array([9.0]))  # slot 3 now carries nearly all the mass
    counts = np.zeros(4)
    for _ in range(50):
        batch = buffer.sample(8)  # no MissingFeedbackError: update_priorities answered the previous one
        counts += np.bincount(batch.indices, minlength=4)
        buffer.update_priorities(batch.indices, np.where(batch.indices == 3, 9.0, 0.0))
    assert counts[3] == counts.sum()
    drawn = buffer.cpprb.sample(4, beta=1.0)
    # weights (P_min / P(i)) ** beta with P_min over the whole buffer (slots 0-2 at eps), as replayloader's
    assert np.allclose(drawn["weights"], 1e-6 / (9.0 + 1e-6), rtol=1e-5)


def test_cpprb_adapter_trains_prioritized_dqn_a_few_steps():
    pytest.importorskip("cpprb")
    from replayloader.sb3 import PrioritizedDQN

    model = PrioritizedDQN("MlpPolicy", "CartPole-v1", buffer_size=500, learning_starts=100, train_freq=50,
                           gradient_steps=4, batch_size=16, seed=0, device="cpu",
                           replay_buffer_class=cartpole.cpprb_buffer_class(), policy_kwargs={"net_arch": [16]})
    model.learn(300)
    assert model.replay_buffer.cpprb.get_stored_size() == 300
    assert model.replay_buffer.cpprb.get_max_priority() != 1.0  # |TD errors| came back


def record(arm, seed, greedy, returns=(10.0, 20.0)):
    return {"arm": arm, "seed": seed, "steps": 100, "episodes": {"step": [50, 100], "return": list(returns),
                                                                 "cpu_s": [1.0, 2.0]},
            "evals": [{"step": 50, "returns": [greedy - 10]}, {"step": 100, "returns": [greedy, greedy]}],
            "train_cpu_s": 2.0, "wall_s": 3.0}


def test_summary_tabulates_final_greedy_returns_and_pairs_them(tmp_path):
    finals = {"uniform": [500.0, 400.0, 300.0], "per": [300.0, 400.0, 100.0], "cpprb": [200.0, 450.0, 150.0]}
    for arm, values in finals.items():
        for seed, value in enumerate(values):
            cartpole.record_path(tmp_path, arm, seed).write_text(json.dumps(record(arm, seed, value)))
    text = cartpole.summary(tmp_path, list(cartpole.ARMS), [0, 1, 2, 3])
    assert "Seeds with every arm finished: 3 of 4 (0, 1, 2)" in text
    assert "| 0 | 500.0 | 300.0 | 200.0 |" in text
    assert "| runs at 500 | 1 of 3 | 0 of 3 | 0 of 3 |" in text
    assert "- per - uniform: -133.3 [" in text and "behind in 2, tied in 1 of 3" in text
    assert "| 50 | 390.0 | 256.7 | 256.7 |" in text  # the greedy curve: mean over seeds at each evaluation
    assert cartpole.best_training_mean(record("per", 0, 1.0, returns=[1.0] * 19)) != \
        cartpole.best_training_mean(record("per", 0, 1.0, returns=[1.0] * 20))  # nan below 20 episodes

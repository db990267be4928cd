"""PrioritizedSAC / PrioritizedTD3: the weighted critic loss against a numpy reference, one update equal to SB3's
with every weight 1, training with feedback, and the refusals they share with the value-based classes."""
from __future__ import annotations

import doctest

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

import torch as th
from hypothesis import given, settings
from hypothesis import strategies as st
from stable_baselines3 import SAC, TD3
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.logger import configure

from replayloader.sb3 import MissingFeedbackError, PrioritizedReplayBuffer, PrioritizedSAC, PrioritizedTD3
from replayloader.sb3 import actor_critic
from replayloader.sb3.training import weighted_critic_loss

ENV = "Pendulum-v1"
ALGORITHMS = [(PrioritizedSAC, SAC), (PrioritizedTD3, TD3)]
UPDATES = [(PrioritizedSAC, SAC, {}), (PrioritizedSAC, SAC, {"ent_coef": 0.2}),  # learned and fixed entropy
           (PrioritizedSAC, SAC, {"use_sde": True}), (PrioritizedTD3, TD3, {})]


def small(cls, **kwargs):
    options = dict(buffer_size=2_000, learning_starts=64, batch_size=16, seed=0, device="cpu",
                   policy_kwargs={"net_arch": [32]})
    options.update(kwargs)
    return cls("MlpPolicy", ENV, **options)


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 9), critics=st.integers(1, 3), scale=st.sampled_from([0.5, 1.0]),
       seed=st.integers(0, 2**16))
def test_weighted_critic_loss_matches_numpy(batch, critics, scale, seed):
    rng = np.random.default_rng(seed)
    q = [rng.normal(size=(batch, 1)) for _ in range(critics)]
    target, weights = rng.normal(size=(batch, 1)), rng.uniform(0.01, 1.0, size=(batch, 1))
    loss, errors = weighted_critic_loss([th.tensor(a) for a in q], th.tensor(target), th.tensor(weights), scale)
    expected = scale * sum(np.mean(weights * (a - target) ** 2) for a in q)
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    np.testing.assert_allclose(errors.numpy(), np.mean([a - target for a in q], axis=0).ravel(), rtol=1e-12)
    unit = weighted_critic_loss([th.tensor(a) for a in q], th.tensor(target), th.ones(batch, 1, dtype=th.float64),
                                scale)[0]
    reference = scale * sum(th.nn.functional.mse_loss(th.tensor(a), th.tensor(target)) for a in q)
    th.testing.assert_close(unit, reference)  # SB3's critic loss when every weight is 1


@pytest.mark.parametrize("ours_cls, theirs_cls, options", UPDATES)
def test_unit_weights_give_exactly_sb3_updates(ours_cls, theirs_cls, options):
    """alpha = 0: every weight is 1, so two updates (TD3: one with and one without the delayed actor step) must
    equal SB3's train() on the same batch and the same torch random draws."""
    ours = small(ours_cls, replay_buffer_kwargs={"alpha": 0.0}, **options)
    theirs = small(theirs_cls, **options)
    theirs.policy.load_state_dict(ours.policy.state_dict())
    for name in ("actor", "critic"):
        getattr(theirs, name).optimizer.load_state_dict(getattr(ours, name).optimizer.state_dict())
    if ours_cls is PrioritizedSAC and ours.ent_coef_optimizer is not None:
        theirs.log_ent_coef.data.copy_(ours.log_ent_coef.data)
        theirs.ent_coef_optimizer.load_state_dict(ours.ent_coef_optimizer.state_dict())
    ours.learn(total_timesteps=64)  # fills the buffer, no update yet (learning_starts)
    batch = ours.replay_buffer.sample(16)
    assert th.all(batch.weights == 1)
    ours.replay_buffer.require_feedback = False
    ours.replay_buffer.sample = theirs.replay_buffer.sample = lambda *args, **kwargs: batch
    theirs.set_logger(configure(None, []))
    for model in (ours, theirs):
        model._current_progress_remaining = 0.5
        th.manual_seed(7)  # SAC's action sampling and TD3's target noise draw from torch's RNG
        model.train(gradient_steps=2, batch_size=16)
    for a, b in zip(ours.policy.parameters(), theirs.policy.parameters(), strict=True):
        th.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert ours._n_updates == theirs._n_updates == 2
    assert ours.logger.name_to_value["train/critic_loss"] == pytest.approx(
        theirs.logger.name_to_value["train/critic_loss"], rel=1e-5)
    untrained = small(ours_cls)
    assert not all(th.equal(a, b) for a, b in zip(ours.policy.parameters(), untrained.policy.parameters()))


@pytest.mark.parametrize("cls", [PrioritizedSAC, PrioritizedTD3])
def test_trains_with_weights_and_feeds_the_critics_errors_back(cls):
    model = small(cls, train_freq=1)
    model.learn(total_timesteps=300)
    buffer = model.replay_buffer
    assert isinstance(buffer, PrioritizedReplayBuffer) and buffer.stored_slots() == 300
    masses = buffer.priorities()
    assert (masses != masses.max()).sum() > 100 and len(np.unique(np.round(masses, 6))) > 50
    assert buffer.current_beta() == pytest.approx(1.0)
    assert np.isfinite(model.logger.name_to_value["train/critic_loss"])
    assert model.logger.name_to_value["train/per_beta"] == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize("cls", [PrioritizedSAC, PrioritizedTD3])
def test_saved_model_and_buffer_load_and_train_on(cls, tmp_path):
    model = small(cls)
    model.learn(total_timesteps=120)
    model.save(tmp_path / "model")
    model.save_replay_buffer(tmp_path / "buffer")
    loaded = cls.load(tmp_path / "model", env=model.get_env(), device="cpu")
    loaded.load_replay_buffer(tmp_path / "buffer")
    for a, b in zip(model.policy.parameters(), loaded.policy.parameters(), strict=True):
        assert th.equal(a, b)
    np.testing.assert_array_equal(loaded.replay_buffer.priorities(), model.replay_buffer.priorities())
    loaded.learn(total_timesteps=40, reset_num_timesteps=False)
    assert loaded.replay_buffer.stored_slots() == 160


def test_several_envs_train_and_every_env_is_fed_back():
    from stable_baselines3.common.env_util import make_vec_env

    model = PrioritizedSAC("MlpPolicy", make_vec_env(ENV, n_envs=2, seed=0), buffer_size=600, learning_starts=64,
                           batch_size=16, seed=0, device="cpu", policy_kwargs={"net_arch": [16]})
    model.learn(total_timesteps=300)
    buffer = model.replay_buffer
    assert buffer.n_envs == 2 and buffer.stored_slots() == 300
    fed = np.flatnonzero(buffer.priorities() != buffer.priorities().max()) % 2
    assert set(fed) == {0, 1}


@pytest.mark.parametrize("ours_cls, theirs_cls", ALGORITHMS)
def test_refusals_are_the_shared_ones(ours_cls, theirs_cls):
    with pytest.raises(ValueError, match="replay_buffer_class must be a prioritized buffer.*got ReplayBuffer"):
        small(ours_cls, replay_buffer_class=ReplayBuffer)
    with pytest.raises(ValueError, match="n_steps=3 needs replay_buffer_class PrioritizedNStepReplayBuffer"):
        small(ours_cls, n_steps=3, replay_buffer_class=PrioritizedReplayBuffer)
    plain = small(theirs_cls, replay_buffer_class=PrioritizedReplayBuffer, gradient_steps=2)
    with pytest.raises(MissingFeedbackError, match="not feeding priorities back"):
        plain.learn(total_timesteps=100)


def test_docstring_examples_run():
    result = doctest.testmod(actor_critic)
    assert result.attempted > 0 and result.failed == 0

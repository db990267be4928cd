"""The cheaper computations of issue 41 against the ones they replaced, on fixed seeds, bit for bit.

* `PrioritizedDQN`'s gradient step (closed-form gradient of the weighted Huber loss) against the autograd
  step it replaced (`ValueBasedMixin._gradient_step` over `_per_sample_loss`): same parameters, optimizer
  state, priorities and logged loss after many updates;
* `weighted_huber_terms`, both its numpy and its torch path, against autograd on random batches, including
  errors of exactly +-1, +-0 and far outside [-1, 1];
* the buffer's batched write of new transitions' leaves against a leaf-by-leaf model of the per-`add` rule;
* `PrioritizedReplayBuffer._read` (flat slots) against `_gather` ((position, env) pairs).
"""
from __future__ import annotations

import pickle

import pytest

pytest.importorskip("stable_baselines3")

import numpy as np
import torch as th
from torch.nn import functional as F

from replayloader.sb3 import PrioritizedDQN
from replayloader.sb3.dqn import _terms_in_numpy, _terms_in_torch
from replayloader.sb3.training import ValueBasedMixin

from .helpers import fill, flat_buffer

EPS = 1e-6


def autograd_terms(chosen: np.ndarray, target: np.ndarray, weights: np.ndarray):
    """The replaced computation: loss = dot(w, smooth_l1(none)) / n, backward through autograd."""
    leaf = th.tensor(chosen, requires_grad=True)
    losses = F.smooth_l1_loss(leaf, th.tensor(target), reduction="none").view(-1)
    loss = th.dot(th.tensor(weights).view(-1), losses) / losses.shape[0]
    loss.backward()
    errors = (leaf.detach() - th.tensor(target)).view(-1)
    return loss.item(), leaf.grad.numpy(), np.abs(errors.numpy())


def random_batch(rng: np.random.Generator, n: int, scale: float, on_the_edges: bool):
    chosen = rng.normal(0, scale, (n, 1)).astype(np.float32)
    if on_the_edges:  # TD errors of exactly -1, +1, -0 and +0, where smooth L1 changes branch
        target = chosen - rng.choice(np.array([-1.0, 1.0, -0.0, 0.0], np.float32), (n, 1))
    else:
        target = rng.normal(0, scale, (n, 1)).astype(np.float32)
    return chosen, target.astype(np.float32), rng.random((n, 1)).astype(np.float32)


@pytest.mark.parametrize("path", ["numpy", "torch"])
def test_weighted_huber_terms_are_autograd_bit_for_bit(path):
    rng = np.random.default_rng(41)
    for trial in range(400):
        n = int(rng.choice([1, 7, 16, 32, 33, 100, 256]))
        chosen, target, weights = random_batch(rng, n, float(rng.choice([1e-3, 0.5, 1.0, 3.0, 100.0])),
                                               on_the_edges=trial % 4 == 0)
        want_loss, want_gradient, want_priorities = autograd_terms(chosen, target, weights)
        scale = np.float32(1.0) / np.float32(n)
        if path == "numpy":
            loss, gradient, priorities = _terms_in_numpy(chosen, target, weights, scale)
        else:
            loss, gradient, priorities = _terms_in_torch(th.tensor(chosen), th.tensor(target), th.tensor(weights),
                                                         scale)
        assert loss == want_loss
        assert gradient.dtype == th.float32 and gradient.shape == (n, 1)
        np.testing.assert_array_equal(gradient.numpy().view(np.int32), want_gradient.view(np.int32))  # signs too
        np.testing.assert_array_equal(priorities, want_priorities)


def autograd_step(model, batch, step):
    """The replaced gradient step: the shared value-based one, autograd through `_per_sample_loss`."""
    return ValueBasedMixin._gradient_step(model, batch, step)


@pytest.mark.parametrize("n_steps", [1, 3])
def test_dqn_step_equals_the_autograd_step_over_many_updates(n_steps):
    """Two identical models, each fed the same batches, one by each step: every update gives the same bits."""
    def make():
        return PrioritizedDQN("MlpPolicy", "CartPole-v1", buffer_size=2_000, learning_starts=64, batch_size=32,
                              seed=3, device="cpu", n_steps=n_steps, policy_kwargs={"net_arch": [32]})

    fast = make()  # each model is built (which seeds every RNG) and trained before the next one is built
    fast.learn(total_timesteps=1_200)  # about 280 updates, with its own batches and feedback
    slow = make()
    slow._gradient_step = lambda batch, step: autograd_step(slow, batch, step)
    slow.learn(total_timesteps=1_200)
    for a, b in zip(fast.policy.parameters(), slow.policy.parameters()):
        assert th.equal(a, b)
    for a, b in zip(fast.policy.optimizer.state.values(), slow.policy.optimizer.state.values()):
        assert all(th.equal(a[key], b[key]) for key in a)
    np.testing.assert_array_equal(fast.replay_buffer.priorities(), slow.replay_buffer.priorities())
    assert fast.replay_buffer.max_priority == slow.replay_buffer.max_priority
    assert fast.logger.name_to_value["train/loss"] == slow.logger.name_to_value["train/loss"]
    assert len(np.unique(fast.replay_buffer.priorities())) > 100  # the updates did feed varied priorities back


class LeafModel:
    """The per-`add` rule, leaf by leaf: a new transition's slots get the new-transition mass at once, and with
    ``optimize_memory_usage`` the next position's slots drop to 0; feedback writes (p + eps) ** alpha."""

    def __init__(self, buffer):
        self.buffer, self.leaves = buffer, np.zeros(buffer.buffer_size * buffer.n_envs)
        self.new_mass, self.top = 1.0, 1.0

    def add(self, position: int) -> None:
        n, size = self.buffer.n_envs, self.buffer.buffer_size
        self.leaves[position * n:(position + 1) * n] = self.new_mass
        if self.buffer.optimize_memory_usage:
            following = (position + 1) % size
            self.leaves[following * n:(following + 1) * n] = 0.0

    def feedback(self, slots: np.ndarray, values: np.ndarray) -> None:
        values = values + EPS
        if self.buffer.optimize_memory_usage and self.buffer.full:
            valid = slots // self.buffer.n_envs != self.buffer.pos
            slots, values = slots[valid], values[valid]
        self.leaves[slots] = values ** self.buffer.alpha
        if values.size and values.max() > self.top:
            self.top = float(values.max())
            self.new_mass = self.top ** self.buffer.alpha


@pytest.mark.parametrize("n_envs, optimize", [(1, False), (3, False), (1, True), (2, True)])
def test_batched_new_leaves_equal_leaf_by_leaf_writes(n_envs, optimize):
    """Random runs of adds, samples and feedback (sometimes with adds between a sample and its feedback,
    sometimes more adds than the buffer holds): the tree always holds the leaves of the per-add rule."""
    rng = np.random.default_rng(n_envs + 10 * optimize)
    buffer = flat_buffer(10, n_envs=n_envs, alpha=0.7, optimize_memory_usage=optimize,
                         handle_timeout_termination=not optimize, require_feedback=False)
    model = LeafModel(buffer)
    for _ in range(60):
        for _ in range(int(rng.choice([0, 1, 3, 12, 25]))):
            model.add(buffer.pos)
            fill(buffer, 1)
        if buffer.stored_slots() == 0:
            continue
        batch = buffer.sample(int(rng.integers(1, 8)))
        for _ in range(int(rng.choice([0, 0, 2]))):  # adds between the sample and its feedback
            model.add(buffer.pos)
            fill(buffer, 1)
        values = rng.random(batch.indices.shape[0]) * float(rng.choice([0.5, 4.0]))
        model.feedback(batch.indices, values)
        buffer.update_priorities(batch.indices, values)
        np.testing.assert_array_equal(buffer.tree.get(np.arange(model.leaves.size)), model.leaves)
        assert buffer.max_priority == model.top
    assert buffer.tree.total == pytest.approx(model.leaves.sum(), rel=1e-12)


def test_unwritten_leaves_are_written_before_pickling_and_not_pickled():
    buffer = flat_buffer(16, n_envs=2, alpha=0.5)
    fill(buffer, 4)
    buffer.update_priorities(buffer.sample(4).indices, np.array([3.0, 0.1, 2.0, 0.5]))
    fill(buffer, 3)  # not yet in the tree
    state = buffer.__getstate__()
    assert not {"_tree", "tree", "_unwritten", "_unwritten_from", "_beta_at"} & set(state)
    loaded = pickle.loads(pickle.dumps(buffer))
    np.testing.assert_array_equal(loaded.priorities(), buffer.priorities())
    assert (buffer.priorities()[8:14] == (3.0 + EPS) ** 0.5).all()  # the 3 new rows at the largest priority


class Normalizer:
    """What a buffer asks of a `VecNormalize` when sampling: observations and rewards, rescaled."""

    def normalize_obs(self, obs: np.ndarray) -> np.ndarray:
        return (obs * 0.5 - 1.0).astype(np.float32)

    def normalize_reward(self, reward: np.ndarray) -> np.ndarray:
        return reward * 0.1


@pytest.mark.parametrize("normalizer", [None, Normalizer()])
@pytest.mark.parametrize("n_envs, optimize", [(1, False), (3, False), (1, True), (3, True)])
def test_reading_by_flat_slot_equals_reading_by_position_and_env(n_envs, optimize, normalizer):
    buffer = flat_buffer(12, n_envs=n_envs, optimize_memory_usage=optimize, handle_timeout_termination=not optimize,
                         require_feedback=False)
    fill(buffer, 17, done_every=3, truncated=True)  # wrapped around
    slots = np.random.default_rng(0).integers(0, buffer.stored_slots(), 40)
    by_slot = buffer._read(slots, normalizer)
    rows, envs = np.divmod(slots, n_envs)
    by_pair = buffer._gather(rows, envs, normalizer)
    for a, b in zip(by_slot, by_pair):
        if b is None:
            assert a is None
            continue
        assert a.dtype == b.dtype and a.shape == b.shape and th.equal(a, b)

"""DQN with prioritized replay: SB3's DQN whose loss is importance-weighted and whose |TD errors| become the
sampled transitions' priorities.

Why this is all the class holds: SB3's ``DQN.train`` (stable-baselines3 2.9.2, the version tested) computes a
mean Huber loss inline with no hook for per-transition weights, so the loop is replaced by the shared one in
`training` and only the per-transition part is written here, the same target and loss as ``DQN.train``:
target r + (1 - done) * gamma * max_a' Q_target(s', a') (no gradient), Huber (smooth L1, delta 1) against
Q(s, a). With every weight 1 (alpha = 0) a gradient step equals SB3's (tested).

Why the gradient step does not call ``backward`` on the loss: the loss is ``dot(w, huber(Q - target)) / n``,
and its gradient with respect to the chosen Q-values is known in closed form, ``clamp(Q - target, -1, 1) *
(w * (1 / n))``, the same float32 operations autograd's ``/ n``, ``dot`` and smooth-L1 backward nodes perform,
in the same order, so the same bits (tested against autograd). Computing it directly, together with the loss
value and the |TD errors|, in numpy on a CPU batch of a few dozen, costs less than the torch ops and autograd
nodes it replaces, which were most of what a prioritized step cost beyond SB3's; backpropagation then starts
at the chosen Q-values with that gradient.
"""
from __future__ import annotations

import functools

import numpy as np
import torch as th
from stable_baselines3 import DQN
from torch.nn import functional as F

from .training import ValueBasedMixin


def weighted_huber_terms(chosen: th.Tensor, target: th.Tensor, weights: th.Tensor
                         ) -> tuple[float, th.Tensor, np.ndarray]:
    """For ``loss = dot(w, smooth_l1(chosen, target, reduction="none")) / n`` (all (n, 1), float32): the loss's
    value, its gradient with respect to ``chosen`` (a (n, 1) tensor on ``chosen``'s device) and the |TD errors|
    ``|chosen - target|`` (numpy, (n,)), each bit for bit what autograd and the torch ops give.

    ``chosen`` may require grad (it is read detached); ``target`` and ``weights`` must not."""
    scale = _backward_scale(chosen.shape[0])
    if chosen.device.type == "cpu":
        return _terms_in_numpy(chosen.detach().numpy(), target.numpy(), weights.numpy(), scale)
    return _terms_in_torch(chosen.detach(), target, weights, scale)


@functools.lru_cache(maxsize=64)
def _backward_scale(n: int) -> np.float32:
    """What autograd sends back through the loss's ``/ n``: 1 / n in float32 (one value per batch size)."""
    return np.float32(1.0) / np.float32(n)


def _terms_in_numpy(chosen: np.ndarray, target: np.ndarray, weights: np.ndarray, scale: np.float32
                    ) -> tuple[float, th.Tensor, np.ndarray]:
    """`weighted_huber_terms` for CPU tensors, on their numpy views (float32 throughout)."""
    errors = chosen - target
    gradient = np.minimum(np.maximum(errors, -1.0), 1.0) * (scale * weights)
    size = np.abs(errors)
    within = np.minimum(size, 1.0)
    # smooth L1 with beta 1, one formula for both sides: below 1, size * (size - size / 2) = 0.5 * size * size
    # (size - size / 2 is exact); from 1 up, size - 0.5; the same float32 values as torch's kernel
    losses = within * (size - 0.5 * within)
    weighted_sum = th.dot(th.from_numpy(weights.reshape(-1)), th.from_numpy(losses.reshape(-1))).item()
    loss = float(np.float32(weighted_sum) / np.float32(chosen.shape[0]))  # torch's float32 division by n
    return loss, th.from_numpy(gradient), size.reshape(-1)


def _terms_in_torch(chosen: th.Tensor, target: th.Tensor, weights: th.Tensor, scale: np.float32
                    ) -> tuple[float, th.Tensor, np.ndarray]:
    """`weighted_huber_terms` with torch ops, for tensors on an accelerator (no autograd graph is built)."""
    with th.no_grad():
        errors = chosen - target
        gradient = errors.clamp(-1.0, 1.0).mul_(weights * float(scale))  # scale is exact in float32
        losses = F.smooth_l1_loss(chosen, target, reduction="none").view(-1)
        loss = (th.dot(weights.view(-1), losses) / chosen.shape[0]).item()
    return loss, gradient, np.abs(errors.view(-1).cpu().numpy())


class PrioritizedDQN(ValueBasedMixin, DQN):
    """`stable_baselines3.DQN` with prioritized replay. Same arguments as DQN; the buffer defaults to
    `PrioritizedReplayBuffer` (`PrioritizedDictReplayBuffer` for dict observations), configured through
    ``replay_buffer_kwargs`` (``alpha``, ``beta``, ``priority_eps``, ``seed``); ``n_steps > 1`` picks
    `PrioritizedNStepReplayBuffer`.

    >>> from replayloader.sb3 import PrioritizedDQN
    >>> model = PrioritizedDQN("MlpPolicy", "CartPole-v1", buffer_size=1_000, learning_starts=50, seed=0,
    ...                        replay_buffer_kwargs={"alpha": 0.6, "beta": 0.4})
    >>> _ = model.learn(total_timesteps=100)
    >>> model.replay_buffer.max_priority > 0
    True
    """

    def _chosen_and_target(self, batch) -> tuple[th.Tensor, th.Tensor]:
        """Q(s, a) of the batch (with its graph) and the TD target (without), both (batch, 1)."""
        discount = self._discount(batch)
        with th.no_grad():
            best_next = self.q_net_target(batch.next_observations).max(dim=1).values.reshape(-1, 1)
            target = batch.rewards + (1.0 - batch.dones) * discount * best_next
        return self.q_net(batch.observations).gather(1, batch.actions.long()), target

    def _per_sample_loss(self, batch) -> tuple[th.Tensor, th.Tensor]:
        """The loss as autograd sees it (the definition `_gradient_step` computes in closed form; tested equal)."""
        chosen, target = self._chosen_and_target(batch)
        losses = F.smooth_l1_loss(chosen, target, reduction="none").view(-1)
        return losses, (chosen.detach() - target).view(-1)  # signed TD errors: the buffer takes |.| in numpy

    def _gradient_step(self, batch, step: int) -> np.ndarray:
        chosen, target = self._chosen_and_target(batch)
        loss, gradient, priorities = weighted_huber_terms(chosen, target, batch.weights)
        self.policy.optimizer.zero_grad()
        chosen.backward(gradient)
        self._clip_and_step()
        self._logged["loss"].append(loss)
        return priorities

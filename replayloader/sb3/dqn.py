"""DQN with prioritized replay: SB3's DQN whose loss is importance-weighted and whose |TD errors| become the
sampled transitions' priorities.

Why this is all the class holds: SB3's ``DQN.train`` (stable-baselines3 2.9.2, the version tested) computes a
mean Huber loss inline with no hook for per-transition weights, so the loop is replaced by the shared one in
`training` and only the per-transition part is written here, the same target and loss as ``DQN.train``:
target r + (1 - done) * gamma * max_a' Q_target(s', a') (no gradient), Huber (smooth L1, delta 1) against
Q(s, a). With every weight 1 (alpha = 0) a gradient step equals SB3's (tested).
"""
from __future__ import annotations

import torch as th
from stable_baselines3 import DQN
from torch.nn import functional as F

from .training import ValueBasedMixin


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

    def _per_sample_loss(self, batch) -> tuple[th.Tensor, th.Tensor]:
        discount = self._discount(batch)
        with th.no_grad():
            best_next = self.q_net_target(batch.next_observations).max(dim=1).values.reshape(-1, 1)
            target = batch.rewards + (1.0 - batch.dones) * discount * best_next
        chosen = self.q_net(batch.observations).gather(1, batch.actions.long())
        losses = F.smooth_l1_loss(chosen, target, reduction="none").view(-1)
        return losses, (chosen.detach() - target).view(-1)  # signed TD errors: the buffer takes |.| in numpy

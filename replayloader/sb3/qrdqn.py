"""QR-DQN (sb3-contrib) with prioritized replay, by the same pattern as `PrioritizedDQN`.

Why it fits the pattern: sb3-contrib's ``QRDQN.train`` (2.9.2, the version tested) has the loop of
``DQN.train`` with a different loss, so only the per-transition quantile Huber loss is written here: the
target quantiles of the greedy next action (by mean over quantiles, target network, no gradient), and the loss
of Dabney et al. 2018 summed over the current quantiles and averaged over the target ones, which is
``sb3_contrib.common.utils.quantile_huber_loss(..., sum_over_quantiles=True)`` kept per transition (tested).
The priority is that per-transition loss: for a distribution, "how wrong is this transition" is the loss, and
unlike |mean TD| it stays positive while the quantiles are off but their means agree (Rainbow's choice,
with its KL loss, for the same reason).
"""
from __future__ import annotations

import torch as th

try:
    from sb3_contrib import QRDQN
except ImportError as err:  # pragma: no cover - exercised in an environment without sb3-contrib
    raise ImportError('PrioritizedQRDQN needs sb3-contrib; install it with: pip install sb3-contrib') from err

from .training import ValueBasedMixin


def quantile_huber_per_sample(current: th.Tensor, target: th.Tensor) -> th.Tensor:
    """Quantile Huber loss (kappa 1) per transition: current (batch, n), target (batch, m) -> (batch,)."""
    n = current.shape[1]
    tau = (th.arange(n, device=current.device, dtype=current.dtype) + 0.5) / n
    delta = target.unsqueeze(1) - current.unsqueeze(2)  # (batch, n, m): target j minus current i
    size = delta.abs()
    huber = th.where(size <= 1.0, 0.5 * delta.pow(2), size - 0.5)
    asymmetric = (tau.view(1, -1, 1) - (delta.detach() < 0).to(current.dtype)).abs()
    return (asymmetric * huber).sum(dim=1).mean(dim=1)


class PrioritizedQRDQN(ValueBasedMixin, QRDQN):
    """`sb3_contrib.QRDQN` with prioritized replay; same arguments as QRDQN, buffer options through
    ``replay_buffer_kwargs``.

    >>> from replayloader.sb3 import PrioritizedQRDQN
    >>> model = PrioritizedQRDQN("MlpPolicy", "CartPole-v1", buffer_size=1_000, learning_starts=50, seed=0)
    >>> _ = model.learn(total_timesteps=100)
    >>> model.replay_buffer.max_priority > 0
    True
    """

    def _per_sample_loss(self, batch) -> tuple[th.Tensor, th.Tensor]:
        discount = self._discount(batch)
        size = batch.rewards.shape[0]
        with th.no_grad():
            following = self.quantile_net_target(batch.next_observations)  # (batch, n_quantiles, n_actions)
            greedy = following.mean(dim=1, keepdim=True).argmax(dim=2, keepdim=True)
            following = following.gather(2, greedy.expand(size, self.n_quantiles, 1)).squeeze(2)
            target = batch.rewards + (1.0 - batch.dones) * discount * following
        actions = batch.actions.long().unsqueeze(1).expand(size, self.n_quantiles, 1)
        current = self.quantile_net(batch.observations).gather(2, actions).squeeze(2)
        losses = quantile_huber_per_sample(current, target)
        return losses, losses.detach()

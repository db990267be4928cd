"""SAC and TD3 with prioritized replay: the critics learn from importance-weighted squared TD errors, and the
critics' mean |TD error| goes back to the buffer as each transition's priority.

Why these two classes write a whole gradient step: SB3's ``SAC.train`` and ``TD3.train`` (stable-baselines3
2.9.2, the version tested) compute the critic loss inline as ``F.mse_loss`` with no per-transition hook, and the
loss sits between the entropy, actor and target updates, so the step is re-written here in the same order as
SB3's: (SAC) entropy coefficient, critic, actor, targets every ``target_update_interval`` steps; (TD3) critic,
then every ``policy_delay`` updates the actor and both targets. Only the critic loss differs, and it is
`training.weighted_critic_loss`; with every weight 1 an update equals SB3's (tested). The loop around the step
(sampling, feedback, beta, logging) is the shared one in `training`.

The actor's loss is not weighted: importance weights undo the bias that prioritized sampling puts into the
critics' regression targets; the actor is trained on the sampled states, as in SB3.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch as th
from stable_baselines3 import SAC, TD3
from stable_baselines3.common.utils import polyak_update

from .training import PrioritizedAlgorithmMixin, absolute_errors, weighted_critic_loss


def _smallest_q(values: tuple[th.Tensor, ...]) -> th.Tensor:
    """The smallest of the critics' Q-values per transition, (batch, 1): clipped double Q, as SB3 takes it."""
    return th.cat(values, dim=1).min(dim=1, keepdim=True)[0]


class PrioritizedSAC(PrioritizedAlgorithmMixin, SAC):
    """`stable_baselines3.SAC` with prioritized replay. Same arguments as SAC; the buffer defaults to
    `PrioritizedReplayBuffer` (`PrioritizedDictReplayBuffer` for dict observations), configured through
    ``replay_buffer_kwargs`` (``alpha``, ``beta``, ``priority_eps``, ``seed``).

    >>> from replayloader.sb3 import PrioritizedSAC
    >>> model = PrioritizedSAC("MlpPolicy", "Pendulum-v1", buffer_size=1_000, learning_starts=50, seed=0,
    ...                        policy_kwargs={"net_arch": [16]}, replay_buffer_kwargs={"alpha": 0.6})
    >>> _ = model.learn(total_timesteps=80)
    >>> model.replay_buffer.max_priority > 1.0  # |TD errors| came back
    True
    """

    def _optimizers(self) -> list[th.optim.Optimizer]:
        extra = [self.ent_coef_optimizer] if self.ent_coef_optimizer is not None else []
        return [self.actor.optimizer, self.critic.optimizer, *extra]

    def _gradient_step(self, batch: Any, step: int) -> np.ndarray:
        if self.use_sde:
            self.actor.reset_noise()
        actions_pi, log_prob = self.actor.action_log_prob(batch.observations)
        log_prob = log_prob.reshape(-1, 1)
        if self.ent_coef_optimizer is not None and self.log_ent_coef is not None:
            ent_coef = th.exp(self.log_ent_coef.detach())
            ent_coef_loss = -(self.log_ent_coef * (log_prob + self.target_entropy).detach()).mean()
            self.ent_coef_optimizer.zero_grad()
            ent_coef_loss.backward()
            self.ent_coef_optimizer.step()
            self._logged["ent_coef_loss"].append(ent_coef_loss.item())
        else:
            ent_coef = self.ent_coef_tensor
        self._logged["ent_coef"].append(ent_coef.item())

        with th.no_grad():
            next_actions, next_log_prob = self.actor.action_log_prob(batch.next_observations)
            next_q = _smallest_q(self.critic_target(batch.next_observations, next_actions))
            next_q = next_q - ent_coef * next_log_prob.reshape(-1, 1)
            target = batch.rewards + (1 - batch.dones) * self._discount(batch) * next_q
        critic_loss, errors = weighted_critic_loss(self.critic(batch.observations, batch.actions), target,
                                                   batch.weights, scale=0.5)
        self.critic.optimizer.zero_grad()
        critic_loss.backward()
        self.critic.optimizer.step()
        self._logged["critic_loss"].append(critic_loss.item())

        q_pi = _smallest_q(self.critic(batch.observations, actions_pi))
        actor_loss = (ent_coef * log_prob - q_pi).mean()
        self.actor.optimizer.zero_grad()
        actor_loss.backward()
        self.actor.optimizer.step()
        self._logged["actor_loss"].append(actor_loss.item())

        if step % self.target_update_interval == 0:
            polyak_update(self.critic.parameters(), self.critic_target.parameters(), self.tau)
            polyak_update(self.batch_norm_stats, self.batch_norm_stats_target, 1.0)
        return absolute_errors(errors)


class PrioritizedTD3(PrioritizedAlgorithmMixin, TD3):
    """`stable_baselines3.TD3` with prioritized replay; same arguments as TD3, buffer options through
    ``replay_buffer_kwargs``.

    >>> from replayloader.sb3 import PrioritizedTD3
    >>> model = PrioritizedTD3("MlpPolicy", "Pendulum-v1", buffer_size=1_000, learning_starts=50, seed=0,
    ...                        policy_kwargs={"net_arch": [16]})
    >>> _ = model.learn(total_timesteps=80)
    >>> model.replay_buffer.max_priority > 1.0
    True
    """

    def _optimizers(self) -> list[th.optim.Optimizer]:
        return [self.actor.optimizer, self.critic.optimizer]

    def _gradient_step(self, batch: Any, step: int) -> np.ndarray:
        with th.no_grad():
            noise = batch.actions.clone().data.normal_(0, self.target_policy_noise)
            noise = noise.clamp(-self.target_noise_clip, self.target_noise_clip)
            next_actions = (self.actor_target(batch.next_observations) + noise).clamp(-1, 1)
            next_q = _smallest_q(self.critic_target(batch.next_observations, next_actions))
            target = batch.rewards + (1 - batch.dones) * self._discount(batch) * next_q
        critic_loss, errors = weighted_critic_loss(self.critic(batch.observations, batch.actions), target,
                                                   batch.weights)
        self.critic.optimizer.zero_grad()
        critic_loss.backward()
        self.critic.optimizer.step()
        self._logged["critic_loss"].append(critic_loss.item())

        if self._n_updates % self.policy_delay == 0:
            actor_loss = -self.critic.q1_forward(batch.observations, self.actor(batch.observations)).mean()
            self.actor.optimizer.zero_grad()
            actor_loss.backward()
            self.actor.optimizer.step()
            self._logged["actor_loss"].append(actor_loss.item())
            polyak_update(self.critic.parameters(), self.critic_target.parameters(), self.tau)
            polyak_update(self.actor.parameters(), self.actor_target.parameters(), self.tau)
            polyak_update(self.critic_batch_norm_stats, self.critic_batch_norm_stats_target, 1.0)
            polyak_update(self.actor_batch_norm_stats, self.actor_batch_norm_stats_target, 1.0)
        return absolute_errors(errors)

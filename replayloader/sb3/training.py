"""The one gradient-step loop every prioritized algorithm here shares, and the two families that plug into it.

Why one loop: a prioritized algorithm changes SB3's ``train()`` in exactly two places. Each batch's loss on the
stored transitions becomes an importance-weighted mean, and each batch's new priorities go back to the buffer.
Everything else (train mode, learning-rate schedules, the update counter, beta's progress, logging) is the same
for every algorithm, so it lives in `PrioritizedAlgorithmMixin.train`, and an algorithm supplies one gradient
step, ``_gradient_step(batch, step) -> priorities`` (the batch's |TD errors|, a numpy array of shape (batch,);
`absolute_errors` makes it from a tensor of signed errors), and the optimizers its learning rate drives.

Two families fill that step:

* value-based (`ValueBasedMixin`: DQN, QR-DQN): one optimizer; the class writes only
  ``_per_sample_loss(batch) -> (losses, errors)``, and the weighted mean and the optimizer step are here;
* actor-critic (SAC, TD3, in `actor_critic`): the critics' squared TD errors are weighted by
  `weighted_critic_loss`, the actor's loss is not (PER's weights correct the critics' regression target
  distribution; the actor is trained on states, as in SB3).

The loop follows ``DQN.train`` / ``SAC.train`` / ``TD3.train`` of stable-baselines3 2.9.2 (and ``QRDQN.train``
of sb3-contrib 2.9.2), the versions tested; with every weight 1 each algorithm's update equals SB3's (tested).
"""
from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces

from .buffers import PrioritizedDictReplayBuffer, PrioritizedNStepReplayBuffer, PrioritizedReplayBuffer
from .priorities import PrioritizedMixin


def _mean(values: list[float]) -> float:
    """``float(np.mean(values))``; one value (one gradient step per ``train``, SB3's default) is its own mean."""
    return float(values[0]) if len(values) == 1 else float(np.mean(values))


def absolute_errors(errors: th.Tensor) -> np.ndarray:
    """|errors| as the numpy array the buffer takes: the absolute value is taken in numpy, which is cheaper than
    a torch op on a batch this small."""
    return np.abs(errors.detach().cpu().numpy())


def weighted_critic_loss(current: Sequence[th.Tensor], target: th.Tensor, weights: th.Tensor,
                         scale: float = 1.0) -> tuple[th.Tensor, th.Tensor]:
    """The critics' regression loss with importance weights, and each transition's TD error for its priority.

    ``current``: each critic's Q(s, a), shape (batch, 1); ``target``: the shared target, (batch, 1);
    ``weights``: (batch, 1). Returns ``scale * sum over critics of mean_i(w_i * (Q_i - target_i) ** 2)``, which is
    SB3's ``scale * sum(F.mse_loss(q, target))`` when every weight is 1, and the mean over the critics of
    ``Q - target`` (detached, shape (batch,)): one error per transition from all critics, so a transition one
    critic fits badly still comes back often.
    """
    errors = th.cat([q - target for q in current], dim=1)  # (batch, n_critics)
    per_sample = errors.pow(2).sum(dim=1)  # summed over critics
    loss = scale * th.dot(weights.view(-1), per_sample) / per_sample.shape[0]
    return loss, errors.detach().mean(dim=1)


class PrioritizedAlgorithmMixin:
    """For an SB3 off-policy algorithm: picks a prioritized buffer by default (the n-step one when ``n_steps > 1``),
    refuses a non-prioritized one, and trains with weights and feedback through one loop (see the module docstring)."""

    def _setup_model(self) -> None:
        n_steps = getattr(self, "n_steps", 1)
        dict_obs = isinstance(self.observation_space, spaces.Dict)
        if self.replay_buffer_class is None:
            if n_steps > 1 and dict_obs:
                raise ValueError(f"n_steps must be 1 with dict observations (SB3 has no n-step dict buffer), "
                                 f"got {n_steps!r}")
            self.replay_buffer_class = (PrioritizedNStepReplayBuffer if n_steps > 1 else
                                        PrioritizedDictReplayBuffer if dict_obs else PrioritizedReplayBuffer)
        elif not issubclass(self.replay_buffer_class, PrioritizedMixin):
            raise ValueError(f"replay_buffer_class must be a prioritized buffer (a subclass of "
                             f"replayloader.sb3.PrioritizedMixin), got {self.replay_buffer_class.__name__}")
        n_step_buffer = issubclass(self.replay_buffer_class, PrioritizedNStepReplayBuffer)
        if n_steps > 1 and not n_step_buffer:
            raise ValueError(f"n_steps={n_steps!r} needs replay_buffer_class PrioritizedNStepReplayBuffer (or "
                             f"None, which picks it), got {self.replay_buffer_class.__name__}")
        if n_step_buffer:  # the buffer sums the returns with the algorithm's n_steps and gamma, as in SB3
            wanted = {"gamma": self.gamma} | ({"n_steps": n_steps} if n_steps > 1 else {})
            for name, value in wanted.items():
                given = self.replay_buffer_kwargs.setdefault(name, value)
                if given != value:
                    raise ValueError(f"replay_buffer_kwargs[{name!r}] must equal the algorithm's {name} "
                                     f"{value!r}, got {given!r}")
        with warnings.catch_warnings():  # SB3 warns that a custom buffer class ignores n_steps; this one uses it
            warnings.filterwarnings("ignore", message=r"`n_steps=\d+` is ignored because a custom")
            super()._setup_model()  # type: ignore[misc]

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "_logged"]  # type: ignore[misc]  # per-call, not model state

    def _discount(self, batch: Any) -> Any:
        """The bootstrap's discount: the batch's own (gamma ** steps summed, from an n-step buffer) or gamma."""
        return self.gamma if batch.discounts is None else batch.discounts

    def _optimizers(self) -> list[th.optim.Optimizer]:
        """The optimizers whose learning rate SB3's schedule sets before each ``train``."""
        raise NotImplementedError

    def _gradient_step(self, batch: Any, step: int) -> np.ndarray:
        """One update from ``batch`` (the ``step``-th of this ``train`` call); returns the batch's new
        priorities, its |TD errors| (numpy, shape (batch,)). Losses to log go to ``self._logged[name]``."""
        raise NotImplementedError

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        buffer = self.replay_buffer
        if not isinstance(buffer, PrioritizedMixin):
            raise TypeError(f"{type(self).__name__} needs a prioritized replay buffer, got "
                            f"{type(buffer).__name__} (was a plain buffer loaded with load_replay_buffer?)")
        buffer.progress = min(max(1.0 - self._current_progress_remaining, 0.0), 1.0)
        self.policy.set_training_mode(True)
        self._update_learning_rate(self._optimizers())
        self._logged: defaultdict[str, list[float]] = defaultdict(list)
        for step in range(gradient_steps):
            self._n_updates += 1  # before the step: TD3's policy delay counts this update
            batch = buffer.sample(batch_size, env=self._vec_normalize_env)
            priorities = self._gradient_step(batch, step)
            # SB3's name, the alias of `feedback`: it reaches a buffer that overrides either name (a cpprb adapter)
            buffer.update_priorities(batch.indices, priorities)
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        for name, values in self._logged.items():
            self.logger.record(f"train/{name}", _mean(values))
        self.logger.record("train/per_beta", buffer.current_beta())


class ValueBasedMixin(PrioritizedAlgorithmMixin):
    """DQN-like algorithms (``policy.optimizer``, ``max_grad_norm``): the class writes the per-transition loss,
    ``_per_sample_loss(batch) -> (losses, errors)``, both of shape (batch,)."""

    def _per_sample_loss(self, batch: Any) -> tuple[th.Tensor, th.Tensor]:
        raise NotImplementedError

    def _optimizers(self) -> list[th.optim.Optimizer]:
        return [self.policy.optimizer]

    def _gradient_step(self, batch: Any, step: int) -> np.ndarray:
        per_sample, errors = self._per_sample_loss(batch)
        loss = th.dot(batch.weights.view(-1), per_sample) / per_sample.shape[0]  # the weighted mean, one op
        self.policy.optimizer.zero_grad()
        loss.backward()
        self._clip_and_step()
        self._logged["loss"].append(loss.item())
        return absolute_errors(errors)

    def _clip_and_step(self) -> None:
        """After the gradient is in: SB3's gradient-norm clipping, then the optimizer step."""
        if self.max_grad_norm is not None:
            th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
        self.policy.optimizer.step()

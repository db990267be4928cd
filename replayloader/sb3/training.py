"""The one gradient-step loop every prioritized algorithm here shares.

Why one loop: SB3's value-based ``train()`` methods (DQN's, QR-DQN's) differ only in the loss of a batch; the
rest (train mode, learning-rate schedule, zero_grad / backward / clip / step, update counter, logging) is the
same. A prioritized algorithm needs exactly two changes to that loop: the mean loss becomes an
importance-weighted mean of per-transition losses, and each batch's new priorities go back to the buffer. So
an algorithm class supplies only ``_per_sample_loss(batch) -> (losses, errors)``, both of shape (batch,)
(the priorities are ``|errors|``),
and this loop does the rest. It follows the structure of ``DQN.train`` in stable-baselines3 2.9.2 (and
``QRDQN.train`` in sb3-contrib 2.9.2), the versions tested.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces

from .buffers import PrioritizedDictReplayBuffer, PrioritizedReplayBuffer
from .priorities import PrioritizedMixin


class PrioritizedAlgorithmMixin:
    """For an SB3 off-policy algorithm with ``policy.optimizer`` and ``max_grad_norm`` (DQN, QR-DQN): picks a
    prioritized buffer by default, refuses a non-prioritized one, and trains with weights and feedback."""

    def _setup_model(self) -> None:
        if self.replay_buffer_class is None:
            dict_obs = isinstance(self.observation_space, spaces.Dict)
            self.replay_buffer_class = PrioritizedDictReplayBuffer if dict_obs else PrioritizedReplayBuffer
        elif not issubclass(self.replay_buffer_class, PrioritizedMixin):
            raise ValueError(f"replay_buffer_class must be a prioritized buffer (a subclass of "
                             f"replayloader.sb3.PrioritizedMixin), got {self.replay_buffer_class.__name__}")
        if getattr(self, "n_steps", 1) != 1:
            raise ValueError(f"n_steps must be 1 with a prioritized buffer (n-step returns are not implemented "
                             f"for it), got {self.n_steps!r}")
        super()._setup_model()  # type: ignore[misc]

    def _per_sample_loss(self, batch: Any) -> tuple[th.Tensor, th.Tensor]:
        raise NotImplementedError

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        buffer = self.replay_buffer
        if not isinstance(buffer, PrioritizedMixin):
            raise TypeError(f"{type(self).__name__} needs a prioritized replay buffer, got "
                            f"{type(buffer).__name__} (was a plain buffer loaded with load_replay_buffer?)")
        buffer.progress = min(max(1.0 - self._current_progress_remaining, 0.0), 1.0)
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        losses = []
        for _ in range(gradient_steps):
            batch = buffer.sample(batch_size, env=self._vec_normalize_env)
            per_sample, priorities = self._per_sample_loss(batch)
            loss = th.dot(batch.weights.view(-1), per_sample) / per_sample.shape[0]  # the weighted mean, one op
            self.policy.optimizer.zero_grad()
            loss.backward()
            if self.max_grad_norm is not None:
                th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
            self.policy.optimizer.step()
            buffer.update_priorities(batch.indices, np.abs(priorities.detach().cpu().numpy()))  # |.| in numpy: cheaper
            losses.append(loss.item())
        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/loss", float(np.mean(losses)))
        self.logger.record("train/per_beta", buffer.current_beta())

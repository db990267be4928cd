"""Prioritized experience replay (Schaul et al. 2016) for Stable-Baselines3.

Why a separate, optional package: Stable-Baselines3 has no prioritized buffer (SB3 issue #1242), and the core
of `replayloader` needs only numpy and numba. Nothing here is imported by ``import replayloader``; importing
``replayloader.sb3`` without SB3 installed fails at once with the command that fixes it.

Public names:

* `PrioritizedReplayBuffer`, `PrioritizedDictReplayBuffer`, `PrioritizedNStepReplayBuffer`: drop-in subclasses
  of SB3's `ReplayBuffer`, `DictReplayBuffer` and `NStepReplayBuffer` whose samples carry importance ``weights``
  and the sampled ``indices``;
* `PrioritizedDQN`: DQN that weights its Huber loss and feeds |TD error| back;
* `PrioritizedQRDQN` (needs sb3-contrib): the same for QR-DQN;
* `PrioritizedSAC`, `PrioritizedTD3`: SAC and TD3 whose critics' squared TD errors are weighted and whose
  critics' mean |TD error| is fed back;
* `PrioritizedReplayBufferSamples`, `PrioritizedDictReplayBufferSamples`, `MissingFeedbackError`.

Example:

>>> from replayloader.sb3 import PrioritizedDQN
>>> model = PrioritizedDQN("MlpPolicy", "CartPole-v1", learning_starts=50, buffer_size=1_000, seed=0,
...                        replay_buffer_kwargs={"alpha": 0.6})
>>> _ = model.learn(total_timesteps=120)
>>> batch = model.replay_buffer.sample(4)  # SB3's fields, plus importance weights and the sampled slots
>>> bool((batch.weights <= 1).all()), batch.indices.shape
(True, (4,))
"""
try:
    import stable_baselines3  # noqa: F401
except ImportError as err:  # pragma: no cover - exercised in an environment without SB3
    raise ImportError('replayloader.sb3 needs Stable-Baselines3; install it with: pip install "replayloader[sb3]"'
                      ) from err

from .buffers import PrioritizedDictReplayBuffer, PrioritizedNStepReplayBuffer, PrioritizedReplayBuffer
from .actor_critic import PrioritizedSAC, PrioritizedTD3
from .dqn import PrioritizedDQN
from .priorities import MissingFeedbackError, PrioritizedMixin
from .samples import PrioritizedDictReplayBufferSamples, PrioritizedReplayBufferSamples

__all__ = [
    "MissingFeedbackError",
    "PrioritizedDQN",
    "PrioritizedDictReplayBuffer",
    "PrioritizedDictReplayBufferSamples",
    "PrioritizedMixin",
    "PrioritizedNStepReplayBuffer",
    "PrioritizedQRDQN",
    "PrioritizedReplayBuffer",
    "PrioritizedReplayBufferSamples",
    "PrioritizedSAC",
    "PrioritizedTD3",
]


def __getattr__(name: str):
    """`PrioritizedQRDQN` needs sb3-contrib, an extra dependency: imported on first use only."""
    if name == "PrioritizedQRDQN":
        from .qrdqn import PrioritizedQRDQN
        return PrioritizedQRDQN
    raise AttributeError(f"module 'replayloader.sb3' has no attribute {name!r}")

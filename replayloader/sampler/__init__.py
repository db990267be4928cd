"""Prioritized sampling over a fixed dataset: the indices a DataLoader, HF Trainer or Lightning loads.

- `PrioritizedSampler`: a warm-up pass over every index, then draws by learned importance, with feedback.
- `SampledBatch`: one drawn batch (indices, probabilities, importance weights, epoch, step).
- `LinearSchedule`: a value annealed over steps (β of the importance weights).
- `SamplerLike`: the family as a Protocol (what a batch sampler needs; the DDP sampler qualifies too).
"""
from .prioritized import LinearSchedule, PrioritizedSampler, SampledBatch
from .protocol import SamplerLike

__all__ = ["PrioritizedSampler", "SampledBatch", "LinearSchedule", "SamplerLike"]

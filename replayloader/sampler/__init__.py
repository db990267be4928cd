"""Prioritized sampling over a fixed dataset: the indices a DataLoader, HF Trainer or Lightning loads.

- `PrioritizedSampler`: a warm-up pass over every index, then draws by learned importance, with feedback.
- `SampledBatch`: one drawn batch (indices, probabilities, importance weights, epoch, step).
- `LinearSchedule`: a value annealed over steps (β of the importance weights).
"""
from .prioritized import LinearSchedule, PrioritizedSampler, SampledBatch

__all__ = ["PrioritizedSampler", "SampledBatch", "LinearSchedule"]

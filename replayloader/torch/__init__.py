"""Where torch users train: DataLoader batch samplers, the Hugging Face Trainer and Lightning (torch needed).

- `PrioritizedBatchSampler`: a `PrioritizedSampler` as a DataLoader ``batch_sampler`` (workers, prefetching).
- `CandidateBatchSampler`, `take_rows`: score-then-select inside a DataLoader loop.
- `BackgroundScorer`, `ProxyScorer`: cheaper scoring for it (the next pool scored while the trainer trains; a
  small model learning online that scores in the main model's place).
- `MixtureBatchSampler`, `concat_sources`, `MixtureIterableDataset`: a `replayloader.mixing.MixtureSampler` in a
  DataLoader (``torch.mixing``).
- `PrioritizedTrainer`, `SelectingTrainer` (``torch.hf``), `MixingTrainer` (``torch.mixing_trainer``; all three
  need transformers) and `PrioritizedModule` (``torch.lightning``, needs lightning): imported on first use, so
  this package never imports either.
"""
from .batch_sampler import PrioritizedBatchSampler
from .candidates import CandidateBatchSampler, take_rows
from .mixing import MixtureBatchSampler, MixtureIterableDataset, concat_sources
from .scoring import BackgroundScorer, ProxyScorer

__all__ = ["PrioritizedBatchSampler", "CandidateBatchSampler", "take_rows", "BackgroundScorer", "ProxyScorer",
           "MixtureBatchSampler", "MixtureIterableDataset", "concat_sources",
           "PrioritizedTrainer", "SelectingTrainer", "MixingTrainer", "PrioritizedModule"]

_LAZY = {"PrioritizedTrainer": "hf", "SelectingTrainer": "hf", "MixingTrainer": "mixing_trainer",
         "PrioritizedModule": "lightning"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

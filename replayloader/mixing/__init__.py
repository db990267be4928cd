"""Online data mixing: a dataset made of K sources (domains), drawn in proportions learned from training loss.

- `MixtureSampler`: batches of dataset indices; each batch's per-source counts come from a rule's weights,
  and `feedback(batch, loss=...)` gives the rule each source's mean training loss (numpy only).
- `MixtureBatch`: one drawn batch (indices, their sources, the weights used, step).
- Rules (`MixingRule`): `FixedMixture` (``natural``, ``stratified``), `ODM` (the authors' smoothed-mean rule),
  `ODMExp3` (their EXP3 updater), `ExcessLoss` (DoReMi's multiplicative weights on loss above a reference),
  `ADO` (per-source scaling-law fits, Jiang et al. 2025).
- Torch (imported on first use): `MixtureBatchSampler` (a DataLoader ``batch_sampler``, DDP slices),
  `concat_sources` (K map-style datasets as one), `MixtureIterableDataset` (K streams);
  ``replayloader.mixing.hf.MixingTrainer`` (the Hugging Face Trainer, needs transformers).
- ``python -m replayloader.mixing.plot LOG.jsonl -o weights.png``: the weight trajectory of a ``log_path`` file.
"""
from .ado import ADO
from .rules import ODM, ExcessLoss, FixedMixture, MixingRule, ODMExp3, ReportsEstimates
from .sampler import MixtureBatch, MixtureSampler, SourceMixer

__all__ = ["MixtureSampler", "MixtureBatch", "MixingRule", "FixedMixture", "ODM", "ODMExp3", "ExcessLoss", "ADO",
           "ReportsEstimates", "SourceMixer",
           "MixtureBatchSampler", "MixtureIterableDataset", "concat_sources", "MixingTrainer"]

_LAZY = {"MixtureBatchSampler": "torch", "MixtureIterableDataset": "torch", "concat_sources": "torch",
         "MixingTrainer": "hf"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

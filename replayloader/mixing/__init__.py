"""Online data mixing: a dataset made of K sources (domains), drawn in proportions learned from training loss.

- `MixtureSampler`: batches of dataset indices; each batch's per-source counts come from a rule's weights,
  and `feedback(batch, loss=...)` gives the rule each source's mean training loss (numpy only).
- `MixtureBatch`: one drawn batch (indices, their sources, the weights used, step).
- Rules (`MixingRule`): `FixedMixture` (``natural``, ``stratified``), `ODM` (the authors' smoothed-mean rule),
  `ODMExp3` (their EXP3 updater), `ExcessLoss` (DoReMi's multiplicative weights on loss above a reference),
  `ADO` (per-source scaling-law fits, Jiang et al. 2025).
- ``python -m replayloader.mixing.plot LOG.jsonl -o weights.png``: the weight trajectory of a ``log_path`` file.

In torch, as every adapter of the library, in ``replayloader.torch``: `MixtureBatchSampler` (a DataLoader
``batch_sampler``, DDP slices), `concat_sources` (K map-style datasets as one), `MixtureIterableDataset` (K
streams) and `MixingTrainer` (the Hugging Face Trainer). Their 1.0 names here (``replayloader.mixing.X``, and the
modules ``replayloader.mixing.torch`` / ``.hf``) still work for one release, with a DeprecationWarning naming the
new home.
"""
from .ado import ADO
from .rules import ODM, ExcessLoss, FixedMixture, MixingRule, ODMExp3, ReportsEstimates
from .sampler import MixtureBatch, MixtureSampler, SourceMixer

__all__ = ["MixtureSampler", "MixtureBatch", "MixingRule", "FixedMixture", "ODM", "ODMExp3", "ExcessLoss", "ADO",
           "ReportsEstimates", "SourceMixer"]

_MOVED_TO_TORCH = ("MixtureBatchSampler", "MixtureIterableDataset", "concat_sources", "MixingTrainer")


def __getattr__(name: str):
    if name in _MOVED_TO_TORCH:
        import importlib

        from .._moved import _warn

        _warn(f"{__name__}.{name}", f"replayloader.torch.{name}", "1.1")
        return getattr(importlib.import_module("replayloader.torch"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

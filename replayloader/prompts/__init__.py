"""Prompt prioritization for RL post-training of language models (GRPO, DAPO, RLOO): prompts drawn by how much
their next group of completions can teach, from the rewards the rollouts already computed.

- `PromptSampler`: batches of distinct prompt indices by priority, fed once per generation batch with each
  group's rewards (``feedback(prompt_indices, rewards=...)``); a prior for unseen prompts (per bucket with
  ``labels``), an exploration floor, retests of prompts judged solved / unsolved, a staleness bound and
  retirement; O(log N) draws over sum trees (numpy + numba).
- Rules (`PriorityRule`): `Learnability` (p(1−p), unbiased from each group), `RewardSpread` (graded rewards),
  `Uniform` (the baseline).
- Baselines: `DynamicSampling` (DAPO: over-sample, drop zero-variance groups, refill) and `OnlineFilter` (keep
  groups whose mean reward lies inside a band).
- Torch (imported on first use): `GRPOPromptSampler`, a ``torch.utils.data.Sampler`` with the index layout of
  TRL's ``RepeatSampler``, identical on every DDP rank, with feedback gathered across ranks.
- Trainers (imported on first use): `PrioritizedGRPOTrainer` (TRL's ``GRPOTrainer`` with that sampler, fed by
  the rewards it computes; needs trl), `DynamicSamplingGRPOTrainer` (TRL's with DAPO's dynamic sampling, the
  baseline; needs trl) and `VerlPromptSampler` (verl's curriculum-sampler contract,
  ``data.sampler.class_path``).
"""
from .baselines import DynamicSampling, OnlineFilter
from .groups import read_completions, read_groups
from .rules import Learnability, PriorityRule, RewardSpread, Uniform
from .sampler import PromptBatch, PromptSampler

__all__ = ["PromptSampler", "PromptBatch", "PriorityRule", "Learnability", "RewardSpread", "Uniform",
           "DynamicSampling", "OnlineFilter", "read_groups", "read_completions", "GRPOPromptSampler",
           "PrioritizedGRPOTrainer", "DynamicSamplingGRPOTrainer", "VerlPromptSampler"]

_LAZY = {"GRPOPromptSampler": "torch", "PrioritizedGRPOTrainer": "trl", "DynamicSamplingGRPOTrainer": "trl_dapo",
         "VerlPromptSampler": "verl"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

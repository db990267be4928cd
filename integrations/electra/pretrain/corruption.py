"""Turning a raw batch into the discriminator's task: mask, run the generator, sample replacements.

The producer of `replayloader.ReplayDataLoader` is `CorruptionProducer`: it gets each raw batch from the loader's
``source`` (a `BatchStream`) and returns (examples for the buffer, aux with L_G still attached to its graph).
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class SpecialIds:
    pad: int
    cls: int
    sep: int
    mask: int

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> SpecialIds:
        return cls(tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.mask_token_id)


def choose_masked_positions(input_ids: torch.Tensor, attention_mask: torch.Tensor, special: SpecialIds,
                            mask_prob: float) -> torch.Tensor:
    """Bool (B, T): round(mask_prob · n) (at least 1) uniformly chosen non-special, non-padding positions per row."""
    eligible = attention_mask.bool() & (input_ids != special.cls) & (input_ids != special.sep) \
        & (input_ids != special.pad)
    count = eligible.sum(1)
    k = torch.minimum((count.float() * mask_prob).round().long().clamp_min(1), count)
    scores = torch.rand(input_ids.shape, device=input_ids.device).masked_fill(~eligible, 2.0)
    rank = scores.argsort(1).argsort(1)
    return rank < k[:, None]


def mask_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor, special: SpecialIds, mask_prob: float,
                mask_token_prob: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(generator input, masked positions): masked positions become [MASK] with probability mask_token_prob and
    keep their token otherwise (ELECTRA: no random replacement)."""
    masked = choose_masked_positions(input_ids, attention_mask, special, mask_prob)
    use_mask_token = masked & (torch.rand(input_ids.shape, device=input_ids.device) < mask_token_prob)
    return input_ids.masked_fill(use_mask_token, special.mask), masked


def gumbel_max_sample(logits: torch.Tensor) -> torch.Tensor:
    """argmax(logits + Gumbel noise) in float32: an exact sample of softmax(logits), no gradient, no NaNs."""
    with torch.no_grad():
        logits = logits.detach().float()
        uniform = torch.rand(logits.shape, device=logits.device, dtype=torch.float32)
        uniform.clamp_(min=torch.finfo(torch.float32).tiny, max=1.0 - torch.finfo(torch.float32).eps)
        return (logits - torch.log(-torch.log(uniform))).argmax(-1)


def uniform_replacements(logits: torch.Tensor, special: SpecialIds) -> torch.Tensor:
    """Token ids drawn uniformly from the vocabulary minus the special tokens, one per row of ``logits``."""
    allowed = torch.ones(logits.shape[-1], dtype=torch.bool, device=logits.device)
    allowed[[special.pad, special.cls, special.sep, special.mask]] = False
    candidates = allowed.nonzero().squeeze(1)
    return candidates[torch.randint(len(candidates), logits.shape[:-1], device=logits.device)]


def explicit_positions(input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) position and segment ids (HF's default buffers have batch dim 1, which mixes ghost-norm examples)."""
    b, t = input_ids.shape
    positions = torch.arange(t, device=input_ids.device).expand(b, t)
    return positions, torch.zeros_like(input_ids)


def corrupt_batch(generator: Callable[..., torch.Tensor], raw: Mapping[str, torch.Tensor], special: SpecialIds,
                  mask_prob: float = 0.15, mask_token_prob: float = 0.85,
                  autocast: contextlib.AbstractContextManager | None = None,
                  replacements: str = "generator") -> tuple[dict, dict]:
    """Mask, run the generator (vocabulary logits at masked positions only), sample replacements (from the
    generator, or uniformly from the vocabulary with ``replacements="uniform"``).

    ``generator`` is the generator's pass of the pair, ``pair.part("generator")`` (or the same part of its DDP
    wrapper): called with the masked inputs and ``masked``, it returns logits at the masked positions.

    Returns (examples for the buffer, aux) where aux["generator_loss"] still carries its graph. A sampled token
    equal to the original counts as original, so ``input_ids != original_ids`` are exactly the replaced tokens.
    """
    input_ids, attention_mask = raw["input_ids"], raw["attention_mask"]
    generator_input, masked = mask_inputs(input_ids, attention_mask, special, mask_prob, mask_token_prob)
    positions, segments = explicit_positions(input_ids)
    # the masked positions as indices, found once: each boolean-mask index below would size its result on the
    # host again (a wait for the device on a GPU); integer indices select the same rows in the same order
    where = masked.nonzero(as_tuple=True)
    with autocast or contextlib.nullcontext():
        logits = generator(input_ids=generator_input, attention_mask=attention_mask, position_ids=positions,
                           token_type_ids=segments, masked=where)
    targets = input_ids[where]
    generator_loss = F.cross_entropy(logits.float(), targets)
    sampled = gumbel_max_sample(logits) if replacements == "generator" else uniform_replacements(logits, special)
    corrupted = input_ids.clone()
    corrupted[where] = sampled
    examples = {"input_ids": corrupted, "original_ids": input_ids, "attention_mask": attention_mask,
                "masked": masked}
    with torch.no_grad():  # accuracies stay on the device: read only on the steps that log them
        aux = {"generator_loss": generator_loss, "masked_tokens": targets.numel(),
               "generator_accuracy": (logits.argmax(-1) == targets).float().mean(),
               "changed_fraction": (sampled != targets).float().mean()}
    return examples, aux


class CorruptionProducer:
    """The `ReplayDataLoader` producer: a raw batch from the loader's source -> `corrupt_batch`, timed."""

    def __init__(self, generator: Callable[..., torch.Tensor], special: SpecialIds, mask_prob: float,
                 mask_token_prob: float,
                 autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                 replacements: str = "generator") -> None:
        self.generator = generator
        self.special = special
        self.mask_prob = mask_prob
        self.mask_token_prob = mask_token_prob
        self.autocast = autocast
        self.replacements = replacements

    def __call__(self, raw: Mapping[str, torch.Tensor]) -> tuple[dict, dict]:
        started = time.perf_counter()
        examples, aux = corrupt_batch(self.generator, raw, self.special, self.mask_prob, self.mask_token_prob,
                                      self.autocast(), self.replacements)
        aux["produce_seconds"] = time.perf_counter() - started
        return examples, aux

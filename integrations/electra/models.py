"""Model presets and the ELECTRA generator/discriminator pair with one shared embedding table.

The generator is `ElectraForMaskedLM` with 1/4 of the discriminator's hidden size, the discriminator is
`ElectraForPreTraining`. As in ELECTRA (and the TMR paper) the whole embedding block (token, position and
segment tables plus their LayerNorm) is one module used by both, and the generator's output projection is that
same token table, so there is exactly one (vocab x embedding) tensor in the pair.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch
from torch import nn
from transformers import ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining

from .errors import UserError


@dataclass(frozen=True)
class Preset:
    """Sizes and default training settings of one model scale (discriminator sizes; generator derived)."""

    name: str
    hidden: int
    layers: int
    heads: int
    ffn: int
    embedding: int
    generator_heads: int
    vocab_size: int
    max_len: int
    max_positions: int
    batch_size: int
    learning_rate: float
    warmup_steps: int
    steps: int
    dropout: float = 0.1
    generator_fraction: float = 0.25
    generator_layers: int | None = None  # None: as deep as the discriminator

    @property
    def generator_hidden(self) -> int:
        return int(self.hidden * self.generator_fraction)

    @property
    def generator_ffn(self) -> int:
        return int(self.ffn * self.generator_fraction)

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, Preset] = {
    # CPU-sized (≈0.09 s/step at batch 32, seq 128 on 2 cores). No dropout: it costs ~30% of the step and
    # does not matter at a few hundred steps.
    "tiny": Preset("tiny", hidden=64, layers=2, heads=2, ffn=256, embedding=64, generator_heads=1,
                   vocab_size=4096, max_len=128, max_positions=128, batch_size=32, learning_rate=2e-3,
                   warmup_steps=100, steps=1000, dropout=0.0),
    # The next size up for CPU runs: twice tiny's width, twice its depth (0.43 s/step at batch 32 on 2 cores
    # per ../shared/notes/electra.md; 0.60 s/step measured on 1 thread in results/discriminator_probe/discriminator_probe.md).
    "mini": Preset("mini", hidden=128, layers=4, heads=2, ffn=512, embedding=128, generator_heads=1,
                   vocab_size=4096, max_len=128, max_positions=128, batch_size=32, learning_rate=1e-3,
                   warmup_steps=200, steps=5000, dropout=0.0),
    # ELECTRA-Small as in the paper (generator hidden 64, 1 head, FFN 256).
    "small": Preset("small", hidden=256, layers=12, heads=4, ffn=1024, embedding=128, generator_heads=1,
                    vocab_size=30522, max_len=128, max_positions=512, batch_size=128, learning_rate=5e-4,
                    warmup_steps=10_000, steps=1_000_000),
    # ELECTRA-Base sizes (generator 1/4: hidden 192, 3 heads, FFN 768), batch 256 as in the TMR paper.
    "base": Preset("base", hidden=768, layers=12, heads=12, ffn=3072, embedding=768, generator_heads=3,
                   vocab_size=30522, max_len=512, max_positions=512, batch_size=256, learning_rate=2e-4,
                   warmup_steps=10_000, steps=766_000),
}


def get_preset(name: str) -> Preset:
    """Look a preset up by name (a `UserError` listing the choices otherwise)."""
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def electra_configs(preset: Preset, vocab_size: int, pad_token_id: int,
                    dropout: float | None = None) -> tuple[ElectraConfig, ElectraConfig]:
    """(generator config, discriminator config) for a preset and a tokenizer's vocabulary."""
    p = dropout if dropout is not None else preset.dropout
    common = dict(vocab_size=vocab_size, embedding_size=preset.embedding, max_position_embeddings=preset.max_positions,
                  hidden_dropout_prob=p, attention_probs_dropout_prob=p, pad_token_id=pad_token_id)
    discriminator = ElectraConfig(hidden_size=preset.hidden, num_hidden_layers=preset.layers,
                                  num_attention_heads=preset.heads, intermediate_size=preset.ffn, **common)
    generator = ElectraConfig(hidden_size=preset.generator_hidden,
                              num_hidden_layers=preset.generator_layers or preset.layers,
                              num_attention_heads=preset.generator_heads, intermediate_size=preset.generator_ffn,
                              **common)
    return generator, discriminator


class ElectraPair(nn.Module):
    """Generator + discriminator sharing one embedding block; `named_parameters` lists each tensor once."""

    def __init__(self, generator: ElectraForMaskedLM, discriminator: ElectraForPreTraining) -> None:
        super().__init__()
        self.discriminator = discriminator  # registered first, so shared tensors are named after it
        self.generator = generator
        share_embeddings(generator, discriminator)

    @property
    def shared_embeddings(self) -> nn.Module:
        return self.discriminator.electra.embeddings

    def forward(self, part: str, **inputs):
        """Either model's pass through one entry point, so a `DistributedDataParallel` wrapper around the pair
        sees (and prepares its one reducer for) both passes of a step; see `PairPart`."""
        if part == "generator":
            return masked_lm_logits(self.generator, **inputs)
        if part == "discriminator":
            return self.discriminator(**inputs)
        raise ValueError(f"part must be 'generator' or 'discriminator', got {part!r}")

    def part(self, name: str) -> PairPart:
        """The generator's or the discriminator's pass of this (unwrapped) pair as a callable."""
        return PairPart(self, name)


class PairPart:
    """``module(name, **inputs)`` as a plain callable, for ``module`` an `ElectraPair` or a DDP wrapper of one.

    The generator part returns vocabulary logits at the ``masked`` positions only; the discriminator part
    returns `ElectraForPreTraining`'s output (``.logits``).
    """

    def __init__(self, module: nn.Module, name: str) -> None:
        self.module = module
        self.name = name

    def __call__(self, **inputs):
        return self.module(self.name, **inputs)


def masked_lm_logits(generator: ElectraForMaskedLM, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     position_ids: torch.Tensor, token_type_ids: torch.Tensor,
                     masked: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The generator's vocabulary logits at the masked positions only (the head runs on those rows alone).

    ``masked``: a boolean mask of the positions, or its ``nonzero(as_tuple=True)`` indices (the same rows in the
    same order, without sizing the selection on the host again)."""
    hidden = generator.electra(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               token_type_ids=token_type_ids).last_hidden_state
    return generator.generator_lm_head(generator.generator_predictions(hidden[masked]))


def share_embeddings(generator: ElectraForMaskedLM, discriminator: ElectraForPreTraining) -> None:
    """Make the generator use the discriminator's embedding block and tie its output layer to the token table."""
    generator.electra.embeddings = discriminator.electra.embeddings
    generator.generator_lm_head.weight = discriminator.electra.embeddings.word_embeddings.weight


def embeddings_are_shared(pair: ElectraPair) -> bool:
    """True when generator input, generator output and discriminator input use the very same tensor."""
    table = pair.discriminator.electra.embeddings.word_embeddings.weight
    return (pair.generator.electra.embeddings.word_embeddings.weight is table
            and pair.generator.generator_lm_head.weight is table)


def build_electra_pair(preset: Preset, vocab_size: int, pad_token_id: int, dropout: float | None = None,
                       seed: int | None = None) -> ElectraPair:
    """Fresh generator and discriminator for a preset (seeded init when ``seed`` is given)."""
    if seed is not None:
        torch.manual_seed(seed)
    generator_config, discriminator_config = electra_configs(preset, vocab_size, pad_token_id, dropout)
    discriminator = ElectraForPreTraining(discriminator_config)
    generator = ElectraForMaskedLM(generator_config)
    return ElectraPair(generator, discriminator)


def count_parameters(module: nn.Module) -> int:
    """Distinct parameters (a shared tensor counts once)."""
    return sum(p.numel() for p in module.parameters())


def with_overrides(preset: Preset, **overrides) -> Preset:
    """A copy of a preset with some fields replaced (None values are ignored)."""
    return replace(preset, **{k: v for k, v in overrides.items() if v is not None})

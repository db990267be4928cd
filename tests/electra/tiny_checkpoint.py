"""Tiny random ELECTRA checkpoints (WordPiece tokenizer + discriminator) for the fine-tuning tests.

They are saved exactly like real ones (``save_pretrained``), so they exercise the same loading path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from replayloader_electra.tokenizer import train_wordpiece


def build_tiny_checkpoint(
    directory: str | Path,
    lines: Iterable[str],
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 2,
    vocab_size: int = 400,
    max_positions: int = 512,
    seed: int = 0,
    embedding_size: int | None = None,
    intermediate_size: int | None = None,
) -> Path:
    """Train a tokenizer on ``lines``, build a random ``ElectraForPreTraining`` and save both to ``directory``."""
    import torch
    from transformers import ElectraConfig, ElectraForPreTraining

    directory = Path(directory)
    tokenizer = train_wordpiece(list(lines), vocab_size)
    torch.manual_seed(seed)
    config = ElectraConfig(
        vocab_size=len(tokenizer),
        embedding_size=embedding_size or hidden_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        intermediate_size=intermediate_size or 4 * hidden_size,
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
    )
    ElectraForPreTraining(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory

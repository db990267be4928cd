"""Tiny random ELECTRA checkpoints (WordPiece tokenizer + discriminator) for tests and smoke runs.

They are saved exactly like real ones (``save_pretrained``), so they exercise the same loading path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def train_wordpiece_tokenizer(lines: Iterable[str], vocab_size: int = 400):
    """A lower-casing BERT-style WordPiece fast tokenizer trained on ``lines``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    backend.train_from_iterator(list(lines), trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS))
    cls_id, sep_id = backend.token_to_id("[CLS]"), backend.token_to_id("[SEP]")
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")


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
    tokenizer = train_wordpiece_tokenizer(lines, vocab_size)
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

"""BERT/ELECTRA input packing shared by GLUE and SQuAD: ``[CLS] A [SEP] (B [SEP])``, padding, batching.

Packing is done here rather than by the tokenizer's post-processor, so a checkpoint whose saved
tokenizer lacks a post-processor still gets the special tokens the discriminator was trained with.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..common import quiet_transformers


def truncate_pair(a: list[int], b: list[int] | None, max_tokens: int) -> tuple[list[int], list[int] | None]:
    """Longest-first truncation (HF's default): drop from the end of the longer text until it fits."""
    a = list(a)
    b = None if b is None else list(b)
    while len(a) + (len(b) if b is not None else 0) > max_tokens:
        if b is not None and len(b) > len(a):
            b.pop()
        else:
            a.pop()
    return a, b


def pack_inputs(cls_id: int, sep_id: int, a: Sequence[int], b: Sequence[int] | None = None) -> tuple[list[int], list[int]]:
    """Input ids and token type ids for one (already truncated) text or text pair."""
    ids = [cls_id, *a, sep_id]
    types = [0] * len(ids)
    if b is not None:
        ids += [*b, sep_id]
        types += [1] * (len(b) + 1)
    return ids, types


def encode_texts(tokenizer, texts_a: Sequence[str], texts_b: Sequence[str] | None, max_length: int) -> list[dict]:
    """Tokenise a batch of texts (or pairs) into packed features, truncated to ``max_length`` tokens."""
    with quiet_transformers():  # long texts are truncated below, not by the tokenizer
        ids_a = tokenizer(list(texts_a), add_special_tokens=False)["input_ids"]
        ids_b = tokenizer(list(texts_b), add_special_tokens=False)["input_ids"] if texts_b is not None else [None] * len(ids_a)
    specials = 2 if texts_b is None else 3
    features = []
    for a, b in zip(ids_a, ids_b):
        a, b = truncate_pair(a, b, max_length - specials)
        input_ids, token_type_ids = pack_inputs(tokenizer.cls_token_id, tokenizer.sep_token_id, a, b)
        # numpy rather than lists: MNLI/QQP train hold ~10^7 token ids
        features.append({"input_ids": np.asarray(input_ids, dtype=np.int32),
                         "token_type_ids": np.asarray(token_type_ids, dtype=np.int8)})
    return features


def pad_batch(features: Sequence[dict], pad_id: int, extra_keys: Sequence[str] = ()) -> dict[str, torch.Tensor]:
    """Right-pad to the longest sequence in the batch; ``extra_keys`` are stacked as tensors."""
    length = max(len(f["input_ids"]) for f in features)
    input_ids = torch.full((len(features), length), pad_id, dtype=torch.long)
    token_type_ids = torch.zeros((len(features), length), dtype=torch.long)
    attention_mask = torch.zeros((len(features), length), dtype=torch.long)
    for row, feature in enumerate(features):
        n = len(feature["input_ids"])
        input_ids[row, :n] = torch.as_tensor(np.asarray(feature["input_ids"], dtype=np.int64))
        token_type_ids[row, :n] = torch.as_tensor(np.asarray(feature["token_type_ids"], dtype=np.int64))
        attention_mask[row, :n] = 1
    batch = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}
    for key in extra_keys:
        batch[key] = torch.tensor([f[key] for f in features])
    return batch

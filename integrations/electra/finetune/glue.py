"""GLUE fine-tuning: the [CLS] final hidden vector and one new linear layer (regression for STS-B).

Loss: cross-entropy over ``h_[CLS] W^T`` for classification (the paper's formula), mean squared
error on a single output for STS-B (as ELECTRA does).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .encoding import encode_texts, pad_batch
from .glue_data import GlueTask
from .hparams import FinetuneConfig
from .metrics import glue_metrics
from .training import TrainStats, predict, set_seed, train


def uses_token_types(encoder: nn.Module) -> bool:
    """Segment ids only for models with a segment embedding of more than one type (BERT, ELECTRA)."""
    return int(getattr(encoder.config, "type_vocab_size", 0) or 0) > 1


class ClsClassifier(nn.Module):
    """Pretrained encoder + dropout + ``Linear(H, C)`` on the first ([CLS]) token's final hidden state."""

    def __init__(self, encoder: nn.Module, num_labels: int):
        super().__init__()
        self.encoder = encoder
        self.token_types = uses_token_types(encoder)
        dropout = getattr(encoder.config, "hidden_dropout_prob", 0.1)
        self.dropout = nn.Dropout(0.1 if dropout is None else dropout)
        self.head = nn.Linear(encoder.config.hidden_size, num_labels)
        nn.init.normal_(self.head.weight, std=getattr(encoder.config, "initializer_range", 0.02))
        nn.init.zeros_(self.head.bias)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.token_types and token_type_ids is not None:
            inputs["token_type_ids"] = token_type_ids
        hidden = self.encoder(**inputs).last_hidden_state[:, 0]
        return self.head(self.dropout(hidden))


def encode_glue_split(dataset, task: GlueTask, tokenizer, max_length: int) -> list[dict]:
    """Packed token ids plus the label of every example."""
    texts_b = dataset[task.text_columns[1]] if len(task.text_columns) > 1 else None
    features = encode_texts(tokenizer, dataset[task.text_columns[0]], texts_b, max_length)
    for feature, label in zip(features, dataset["label"]):
        feature["label"] = float(label) if task.is_regression else int(label)
    return features


def _forward(model: ClsClassifier, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])


def glue_loss(task: GlueTask):
    """Per-example losses (the training loop reduces them; prioritized sampling feeds them back)."""
    def compute(model: ClsClassifier, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = _forward(model, batch)
        if task.is_regression:
            return F.mse_loss(logits.squeeze(-1).float(), batch["label"].float(), reduction="none")
        return F.cross_entropy(logits.float(), batch["label"].long(), reduction="none")

    return compute


def predict_glue(
    model: ClsClassifier, task: GlueTask, features: list[dict], pad_id: int, config: FinetuneConfig, device
) -> np.ndarray:
    """Class ids (argmax) or, for STS-B, the regression outputs."""
    outputs = np.zeros(len(features), dtype=np.float64)
    collate = lambda fs: pad_batch(fs, pad_id)  # noqa: E731
    for indices, logits in predict(model, features, collate, _forward, config.eval_batch_size, device, config.use_amp):
        values = logits.squeeze(-1) if task.is_regression else logits.argmax(-1)
        outputs[indices] = values.numpy()
    return outputs


@dataclass
class GlueRunResult:
    metrics: dict[str, float]
    stats: TrainStats


def run_glue_seed(
    base_encoder: nn.Module,
    task: GlueTask,
    train_features: list[dict],
    eval_features: dict[str, list[dict]],
    pad_id: int,
    config: FinetuneConfig,
    seed: int,
    device: torch.device,
    description: str = "",
    progress: bool = True,
) -> GlueRunResult:
    """Fine-tune a fresh copy of ``base_encoder`` with one seed and score every dev split of the task."""
    set_seed(seed)
    model = ClsClassifier(copy.deepcopy(base_encoder), task.num_labels)
    collate = lambda fs: pad_batch(fs, pad_id, extra_keys=("label",))  # noqa: E731
    stats = train(model, model.encoder, model.head, train_features, collate, glue_loss(task), config, seed, device,
                  description=description or f"{task.name} seed {seed}", progress=progress)
    metrics: dict[str, float] = {}
    for split, features in eval_features.items():
        suffix = task.eval_splits[split][1]
        predictions = predict_glue(model, task, features, pad_id, config, device)
        labels = np.array([f["label"] for f in features])
        metrics.update({name + suffix: value for name, value in glue_metrics(task.name, predictions, labels).items()})
    return GlueRunResult(metrics=metrics, stats=stats)

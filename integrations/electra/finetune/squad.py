"""SQuAD v1.1 fine-tuning: a start vector S and an end vector E over the encoder's final hidden states.

P_start(i) = softmax_i(S·h_i) and P_end(i) = softmax_i(E·h_i) over the window's context tokens (and
[CLS], the target when the answer is not wholly inside the window); loss -log P_start - log P_end.
Prediction: across all windows of a question, the span i <= j of at most ``max_answer_length``
tokens maximising S·h_i + E·h_j (exactly, not over top-k starts/ends), mapped back to the context
text through the tokenizer's character offsets.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .encoding import pad_batch
from .glue import uses_token_types
from .hparams import FinetuneConfig
from .metrics import squad_v1_scores
from .squad_data import SquadWindow
from .training import TrainStats, predict, set_seed, train


class SpanModel(nn.Module):
    """Pretrained encoder + the two new vectors S and E (rows of a bias-free ``Linear(H, 2)``)."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.token_types = uses_token_types(encoder)
        self.head = nn.Linear(encoder.config.hidden_size, 2, bias=False)
        nn.init.normal_(self.head.weight, std=getattr(encoder.config, "initializer_range", 0.02))

    def forward(self, input_ids, attention_mask, token_type_ids=None) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.token_types and token_type_ids is not None:
            inputs["token_type_ids"] = token_type_ids
        scores = self.head(self.encoder(**inputs).last_hidden_state)
        return scores[..., 0], scores[..., 1]  # S·h_i and E·h_i


def collate_windows(features: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    batch = pad_batch(features, pad_id, extra_keys=("start_position", "end_position"))
    context_mask = torch.zeros_like(batch["attention_mask"])
    for row, feature in enumerate(features):
        mask = np.asarray(feature["context_mask"], dtype=np.int64)
        context_mask[row, : len(mask)] = torch.as_tensor(mask)
    batch["context_mask"] = context_mask
    return batch


def _forward(model: SpanModel, batch: dict[str, torch.Tensor]):
    return model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])


def span_loss(model: SpanModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per example: -log P_start[start] - log P_end[end], softmax over [CLS] + context."""
    start_scores, end_scores = _forward(model, batch)
    outside = batch["context_mask"] == 0
    start_scores = start_scores.float().masked_fill(outside, -1e9)
    end_scores = end_scores.float().masked_fill(outside, -1e9)
    return (F.cross_entropy(start_scores, batch["start_position"], reduction="none")
            + F.cross_entropy(end_scores, batch["end_position"], reduction="none"))


@dataclass(frozen=True)
class SpanCandidate:
    score: float
    char_start: int
    char_end: int
    window: int  # index among the question's windows

    def text(self, context: str) -> str:
        return context[self.char_start : self.char_end]


def offsets_array(offsets: Sequence[tuple[int, int] | None] | np.ndarray) -> np.ndarray:
    """(L, 2) int array with -1 where a position has no context offset (None in list form)."""
    if isinstance(offsets, np.ndarray):
        return offsets
    return np.asarray([(-1, -1) if o is None else o for o in offsets], dtype=np.int64).reshape(-1, 2)


def best_spans(
    start_scores: Sequence[np.ndarray],
    end_scores: Sequence[np.ndarray],
    offsets: Sequence[Sequence[tuple[int, int] | None] | np.ndarray],
    n_best: int = 20,
    max_answer_length: int = 30,
) -> list[SpanCandidate]:
    """The ``n_best`` highest-scoring spans over all windows of one question, best first.

    A span lies within one window's context tokens, so an answer cut by a window edge can only be
    predicted whole from a window that contains all of it. Identical character spans from
    overlapping windows are merged, keeping the higher score.
    """
    best: dict[tuple[int, int], SpanCandidate] = {}
    for window, (starts, ends, window_offsets) in enumerate(zip(start_scores, end_scores, offsets)):
        window_offsets = offsets_array(window_offsets)
        positions = np.flatnonzero(window_offsets[: len(starts), 0] >= 0)
        if len(positions) == 0:
            continue
        s = np.asarray(starts, dtype=np.float64)[positions]
        e = np.asarray(ends, dtype=np.float64)[positions]
        scores = s[:, None] + e[None, :]
        i, j = np.meshgrid(np.arange(len(positions)), np.arange(len(positions)), indexing="ij")
        length = positions[j] - positions[i] + 1
        scores[(j < i) | (length > max_answer_length)] = -np.inf
        flat = scores.ravel()
        k = min(n_best, int(np.isfinite(flat).sum()))
        if k == 0:
            continue
        top = np.argpartition(-flat, k - 1)[:k]
        for index in top:
            a, b = divmod(int(index), len(positions))
            char_start = int(window_offsets[positions[a], 0])
            char_end = int(window_offsets[positions[b], 1])
            candidate = SpanCandidate(float(flat[index]), char_start, char_end, window)
            key = (char_start, char_end)
            if key not in best or best[key].score < candidate.score:
                best[key] = candidate
    return sorted(best.values(), key=lambda c: -c.score)[:n_best]


def predict_answers(
    model: SpanModel,
    windows: list[SquadWindow],
    contexts: Sequence[str],
    ids: Sequence[str],
    pad_id: int,
    config: FinetuneConfig,
    device: torch.device,
    n_best: int = 20,
    max_answer_length: int = 30,
) -> tuple[dict[str, str], dict[str, list[dict]]]:
    """Best answer text per question id, and the n-best lists (text, score) for inspection."""
    features = [w.as_feature() for w in windows]
    start_by_window: list[np.ndarray | None] = [None] * len(windows)
    end_by_window: list[np.ndarray | None] = [None] * len(windows)
    collate = lambda fs: collate_windows(fs, pad_id)  # noqa: E731
    for indices, (starts, ends) in predict(model, features, collate, _forward, config.eval_batch_size, device, config.use_amp):
        for row, window_index in enumerate(indices):
            start_by_window[window_index] = starts[row].numpy()
            end_by_window[window_index] = ends[row].numpy()
    windows_of_example: dict[int, list[int]] = defaultdict(list)
    for window_index, window in enumerate(windows):
        windows_of_example[window.example_index].append(window_index)
    predictions: dict[str, str] = {}
    nbest: dict[str, list[dict]] = {}
    for example_index, window_indices in windows_of_example.items():
        candidates = best_spans(
            [start_by_window[w] for w in window_indices],
            [end_by_window[w] for w in window_indices],
            [windows[w].offsets for w in window_indices],
            n_best=n_best,
            max_answer_length=max_answer_length,
        )
        context = contexts[example_index]
        qid = ids[example_index]
        predictions[qid] = candidates[0].text(context) if candidates else ""
        nbest[qid] = [{"text": c.text(context), "score": c.score} for c in candidates]
    return predictions, nbest


@dataclass
class SquadRunResult:
    metrics: dict[str, float]
    stats: TrainStats
    predictions: dict[str, str]
    nbest: dict[str, list[dict]]


def run_squad_seed(
    base_encoder: nn.Module,
    train_windows: list[SquadWindow],
    eval_windows: list[SquadWindow],
    eval_dataset,
    pad_id: int,
    config: FinetuneConfig,
    seed: int,
    device: torch.device,
    n_best: int = 20,
    max_answer_length: int = 30,
    description: str = "",
    progress: bool = True,
) -> SquadRunResult:
    """Fine-tune a fresh copy of ``base_encoder`` with one seed; EM/F1 (percent) on ``eval_dataset``."""
    set_seed(seed)
    model = SpanModel(copy.deepcopy(base_encoder))
    features = [w.as_feature() for w in train_windows]
    collate = lambda fs: collate_windows(fs, pad_id)  # noqa: E731
    stats = train(model, model.encoder, model.head, features, collate, span_loss, config, seed, device,
                  description=description or f"squad seed {seed}", progress=progress)
    predictions, nbest = predict_answers(model, eval_windows, eval_dataset["context"], eval_dataset["id"], pad_id,
                                         config, device, n_best=n_best, max_answer_length=max_answer_length)
    golds = {qid: answers["text"] for qid, answers in zip(eval_dataset["id"], eval_dataset["answers"])}
    return SquadRunResult(squad_v1_scores(predictions, golds), stats, predictions, nbest)

"""SQuAD v1.1: loading and doc-stride windows, and fine-tuning with start/end vectors.

SQuAD v1.1 data: loading (hub ``rajpurkar/squad`` or local JSON / JSON.gz) and doc-stride windows.

Windowing follows BERT/ELECTRA, where ``doc_stride`` is the *step* between window starts (ELECTRA
``doc_stride`` = 128). HF ``run_qa.py``'s ``--doc_stride`` is instead the tokenizer's ``stride``,
the number of *overlapping* tokens: with 384-token inputs and a 10-token question (371 context
tokens per window), an HF stride of 128 is a step of 243. We use the ELECTRA meaning.
The question is truncated to ``max_query_length`` tokens (HF does not truncate it).

SQuAD v1.1 fine-tuning: a start vector S and an end vector E over the encoder's final hidden states.

P_start(i) = softmax_i(S·h_i) and P_end(i) = softmax_i(E·h_i) over the window's context tokens (and
[CLS], the target when the answer is not wholly inside the window); loss -log P_start - log P_end.
Prediction: across all windows of a question, the span i <= j of at most ``max_answer_length``
tokens maximising S·h_i + E·h_j (exactly, not over top-k starts/ends), mapped back to the context
text through the tokenizer's character offsets.
"""

from __future__ import annotations

import copy
import gzip
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..errors import UserError
from ..output import quiet_transformers
from ..runtime import set_seed
from .glue import uses_token_types
from .metrics import squad_v1_scores
from .sources import DataSource, load_hub_split
from .training import FinetuneConfig, pad_batch, predict, train, TrainStats

if TYPE_CHECKING:  # imported where used: GLUE fine-tuning from local files needs no `datasets`
    import datasets


# --------------------------------------------------------------------------------------------------
# SQuAD v1.1 data: loading (hub ``rajpurkar/squad`` or local JSON / JSON.gz) and doc-stride windows.
SQUAD_HUB_NAME = "rajpurkar/squad"

_LOCAL_FILES = {
    "train": ("train-v1.1.json", "train-v1.1.json.gz"),
    "validation": ("dev-v1.1.json", "dev-v1.1.json.gz"),
}
# The offline train set is rebuilt in parts (see shared/data/README.md, section 5b).
_LOCAL_PART_GLOB = {"train": "train-v1.1*.part*of*.json*", "validation": "dev-v1.1*.part*of*.json*"}


def find_local_squad_files(directory: Path, split: str) -> list[Path]:
    """The file(s) of one split in a local SQuAD directory: the official name (optionally .gz) or parts."""
    if split not in _LOCAL_FILES:
        raise UserError(f"unknown SQuAD split {split!r} (train or validation)")
    for name in _LOCAL_FILES[split]:
        if (directory / name).is_file():
            return [directory / name]
    parts = sorted(directory.glob(_LOCAL_PART_GLOB[split]))
    if parts:
        return parts
    raise UserError(
        f"SQuAD {split}: missing file {directory / _LOCAL_FILES[split][0]} (or .gz, or "
        f"{_LOCAL_PART_GLOB[split]} parts) in {directory}; use --squad-dir hub when online"
    )


def _open_json(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, json.JSONDecodeError) as error:
        raise UserError(f"could not read SQuAD JSON {path}: {error}") from error


def read_squad_json(paths: Sequence[Path]) -> datasets.Dataset:
    """Flatten SQuAD v1.1 JSON (articles -> paragraphs -> questions) into the hub's columns."""
    import datasets

    rows: dict[str, list] = {"id": [], "title": [], "context": [], "question": [], "answers": []}
    for path in paths:
        for article in _open_json(path).get("data", []):
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    rows["id"].append(qa["id"])
                    rows["title"].append(article.get("title", ""))
                    rows["context"].append(paragraph["context"])
                    rows["question"].append(qa["question"])
                    rows["answers"].append({
                        "text": [a["text"] for a in qa["answers"]],
                        "answer_start": [int(a["answer_start"]) for a in qa["answers"]],
                    })
    features = datasets.Features({
        "id": datasets.Value("string"),
        "title": datasets.Value("string"),
        "context": datasets.Value("string"),
        "question": datasets.Value("string"),
        "answers": datasets.Sequence({"text": datasets.Value("string"), "answer_start": datasets.Value("int32")}),
    })
    return datasets.Dataset.from_dict(rows, features=features)


def load_squad_split(source: DataSource, split: str) -> datasets.Dataset:
    """``train`` or ``validation`` from the hub or a local directory, with the hub's columns."""
    if source.local_dir is None:
        return load_hub_split(source.hub_name, None, split)
    return read_squad_json(find_local_squad_files(source.local_dir, split))


# ----------------------------------------------------------------------------------------------
# Windows


def window_starts(num_context_tokens: int, max_context_tokens: int, doc_stride: int) -> list[tuple[int, int]]:
    """(start, length) of each context window: step ``doc_stride``, stop once the end is covered."""
    if max_context_tokens <= 0:
        raise UserError("max_seq_length leaves no room for the context; raise it or lower max_query_length")
    windows: list[tuple[int, int]] = []
    start = 0
    while True:
        length = min(num_context_tokens - start, max_context_tokens)
        windows.append((start, length))
        if start + length >= num_context_tokens:
            return windows
        start += min(length, doc_stride)


def char_span_to_tokens(offsets: Sequence[tuple[int, int]], char_start: int, char_end: int) -> tuple[int, int] | None:
    """First and last context token overlapping the characters [char_start, char_end), or None."""
    first = last = None
    for index, (begin, end) in enumerate(offsets):
        if end > char_start and begin < char_end and end > begin:
            if first is None:
                first = index
            last = index
    return None if first is None else (first, last)


@dataclass
class SquadWindow:
    """One model input: ``[CLS] question [SEP] context-window [SEP]`` (numpy arrays, to keep the
    ~88k windows of the full train set in a few hundred MB).

    ``offsets[p]`` is the character span in the context of the token at position ``p``, or (-1, -1)
    for question/special tokens (None when not kept, e.g. for training windows);
    ``start_position``/``end_position`` are the answer's token positions (0 = [CLS] when the answer
    is not wholly inside this window). ``context_mask`` is 1 at [CLS] and at context tokens."""

    example_index: int
    input_ids: np.ndarray
    token_type_ids: np.ndarray
    context_mask: np.ndarray
    offsets: np.ndarray | None = None
    start_position: int = 0
    end_position: int = 0

    def as_feature(self) -> dict:
        return {
            "input_ids": self.input_ids,
            "token_type_ids": self.token_type_ids,
            "context_mask": self.context_mask,
            "start_position": self.start_position,
            "end_position": self.end_position,
        }


def build_windows(
    example_index: int,
    question_ids: Sequence[int],
    context_ids: Sequence[int],
    context_offsets: Sequence[tuple[int, int]],
    cls_id: int,
    sep_id: int,
    max_seq_length: int,
    doc_stride: int,
    max_query_length: int,
    answer_char_span: tuple[int, int] | None = None,
    keep_offsets: bool = True,
) -> list[SquadWindow]:
    """All windows of one question, labelled with the answer's token positions when it is given."""
    question_ids = list(question_ids)[:max_query_length]
    answer_tokens = None
    if answer_char_span is not None:
        answer_tokens = char_span_to_tokens(context_offsets, *answer_char_span)
    prefix = [cls_id, *question_ids, sep_id]
    max_context = max_seq_length - len(prefix) - 1
    all_offsets = np.asarray(context_offsets, dtype=np.int32).reshape(-1, 2)
    no_offset = np.full((1, 2), -1, dtype=np.int32)
    windows = []
    for start, length in window_starts(len(context_ids), max_context, doc_stride):
        input_ids = np.asarray(prefix + list(context_ids[start : start + length]) + [sep_id], dtype=np.int32)
        token_type_ids = np.asarray([0] * len(prefix) + [1] * (length + 1), dtype=np.int8)
        context_mask = np.asarray([1] + [0] * (len(prefix) - 1) + [1] * length + [0], dtype=np.int8)
        offsets = None
        if keep_offsets:
            offsets = np.concatenate([np.repeat(no_offset, len(prefix), 0), all_offsets[start : start + length], no_offset])
        window = SquadWindow(example_index, input_ids, token_type_ids, context_mask, offsets)
        if answer_tokens is not None:
            first, last = answer_tokens
            if start <= first and last < start + length:
                window.start_position = len(prefix) + first - start
                window.end_position = len(prefix) + last - start
        windows.append(window)
    return windows


def build_squad_windows(
    dataset: datasets.Dataset,
    tokenizer,
    max_seq_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
    with_labels: bool = True,
    keep_offsets: bool | None = None,
) -> list[SquadWindow]:
    """Windows of every question. Training windows (``with_labels``) are labelled from the first gold
    answer; evaluation windows keep the character offsets needed to turn spans back into text."""
    contexts = dataset["context"]
    unique_contexts = list(dict.fromkeys(contexts))
    try:
        with quiet_transformers():  # contexts are longer than the model; the windows below cut them
            encoded = tokenizer(unique_contexts, add_special_tokens=False, return_offsets_mapping=True)
            questions = tokenizer([q.strip() for q in dataset["question"]], add_special_tokens=False)["input_ids"]
    except (NotImplementedError, ValueError) as error:
        raise UserError(f"SQuAD needs a fast tokenizer with offset mapping: {error}") from error
    by_context = {c: (ids, offs) for c, ids, offs in zip(unique_contexts, encoded["input_ids"], encoded["offset_mapping"])}
    windows: list[SquadWindow] = []
    for index, (context, question_ids, answers) in enumerate(zip(contexts, questions, dataset["answers"])):
        context_ids, offsets = by_context[context]
        span = None
        if with_labels and answers["text"]:
            start = int(answers["answer_start"][0])
            span = (start, start + len(answers["text"][0]))
        windows += build_windows(index, question_ids, context_ids, offsets, tokenizer.cls_token_id,
                                 tokenizer.sep_token_id, max_seq_length, doc_stride, max_query_length, span,
                                 keep_offsets=not with_labels if keep_offsets is None else keep_offsets)
    return windows


# --------------------------------------------------------------------------------------------------
# SQuAD v1.1 fine-tuning: a start vector S and an end vector E over the encoder's final hidden states.
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
    for indices, (starts, ends) in predict(model, features, collate, _forward, config.eval_batch_size, device, config.autocast):
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

"""SQuAD v1.1: loading, doc-stride windows, offsets back to text, span decoding, a tiny end-to-end run."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from replayloader_electra.errors import UserError
from replayloader_electra.tokenizer import load_tokenizer
from replayloader_electra.finetune.api import finetune_squad
from replayloader_electra.finetune.sources import DataSource
from replayloader_electra.finetune.squad import (best_spans, build_squad_windows, build_windows,
                                                 char_span_to_tokens, find_local_squad_files, load_squad_split,
                                                 read_squad_json, window_starts)
from tests.electra.tiny_checkpoint import build_tiny_checkpoint

SHARED_SQUAD = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "squad"
FILLER = "river stone green field house quiet old small north winter bright road tree light".split()
NAMES = "Alice Bruno Chloe Dmitri Elena Farid Greta Hiro Ines Jonas Kira Luca Mara Nils Olga Pavel".split()
GREEK = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def synthetic_squad(num_questions: int, seed: int) -> dict:
    """Paragraphs of filler words that mention one person; the question asks who is mentioned."""
    rng = random.Random(seed)
    paragraphs = []
    for q in range(num_questions):
        words = [rng.choice(FILLER) for _ in range(rng.randint(30, 60))]
        position = rng.randrange(len(words))
        name = rng.choice(NAMES)
        words.insert(position, name)
        context = " ".join(words) + "."
        start = context.index(name)
        question = rng.choice(["who is in the text?", "which person appears?", "who is mentioned?"])
        paragraphs.append({"context": context, "qas": [{"id": f"q{q}", "question": question,
                                                          "answers": [{"text": name, "answer_start": start}]}]})
    return {"version": "1.1", "data": [{"title": "synthetic", "paragraphs": paragraphs}]}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    lines = [" ".join(FILLER + NAMES + GREEK), "who is in the text? which person appears? who is mentioned?"] * 20
    lines += [" ".join(random.Random(i).sample(FILLER + NAMES, 12)) for i in range(200)]
    return build_tiny_checkpoint(tmp_path_factory.mktemp("squad_ckpt"), lines, vocab_size=200, seed=0)


@pytest.fixture(scope="module")
def tokenizer(checkpoint):
    return load_tokenizer(str(checkpoint))


# ---------------------------------------------------------------------------- windows and offsets


def test_window_starts_step_is_doc_stride():
    assert window_starts(10, 4, 2) == [(0, 4), (2, 4), (4, 4), (6, 4)]
    assert window_starts(300, 200, 128) == [(0, 200), (128, 172)]  # ELECTRA meaning: step, not overlap
    assert window_starts(3, 10, 128) == [(0, 3)]


def test_char_span_to_tokens():
    offsets = [(0, 4), (5, 9), (9, 10), (11, 16)]  # "Some word, later"
    assert char_span_to_tokens(offsets, 5, 10) == (1, 2)
    assert char_span_to_tokens(offsets, 6, 8) == (1, 1)  # inside one token
    assert char_span_to_tokens(offsets, 16, 20) is None


def test_answer_crossing_a_window_edge_is_labelled_only_where_whole(tokenizer):
    context = " ".join(GREEK)  # one token per word
    encoded = tokenizer(context, add_special_tokens=False, return_offsets_mapping=True)
    assert len(encoded["input_ids"]) == len(GREEK)
    question = tokenizer("who", add_special_tokens=False)["input_ids"]
    answer = "epsilon zeta"  # context tokens 4 and 5
    start = context.index(answer)
    # 1 question token + 3 specials + 5 context tokens = 9; step 3 -> windows start at tokens 0, 3, 6
    windows = build_windows(0, question, encoded["input_ids"], encoded["offset_mapping"], tokenizer.cls_token_id,
                            tokenizer.sep_token_id, max_seq_length=9, doc_stride=3, max_query_length=64,
                            answer_char_span=(start, start + len(answer)))
    assert [len(w.input_ids) for w in windows] == [9, 9, 8]
    first, second, third = windows
    # window 0 holds tokens 0-4: "epsilon" is in, "zeta" is not -> target [CLS]
    assert (first.start_position, first.end_position) == (0, 0)
    # window 1 holds tokens 3-7: the answer is whole
    assert (second.start_position, second.end_position) == (3 + 1, 3 + 2)
    span = context[second.offsets[second.start_position][0] : second.offsets[second.end_position][1]]
    assert span == answer
    assert tokenizer.decode(second.input_ids[second.start_position : second.end_position + 1].tolist()) == answer
    assert (third.start_position, third.end_position) == (0, 0)
    # layout: [CLS] q [SEP] context [SEP], segment ids 0 then 1, context mask on [CLS] + context
    assert second.input_ids[0] == tokenizer.cls_token_id and second.input_ids[2] == tokenizer.sep_token_id
    assert second.token_type_ids.tolist() == [0, 0, 0] + [1] * 6
    assert second.context_mask.tolist() == [1, 0, 0, 1, 1, 1, 1, 1, 0]
    assert second.offsets[:3].tolist() == [[-1, -1]] * 3 and second.offsets[-1].tolist() == [-1, -1]


def test_question_is_truncated_to_max_query_length(tokenizer):
    context_ids = tokenizer("alpha beta", add_special_tokens=False, return_offsets_mapping=True)
    windows = build_windows(0, list(range(10, 30)), context_ids["input_ids"], context_ids["offset_mapping"],
                            tokenizer.cls_token_id, tokenizer.sep_token_id, 64, 128, max_query_length=5)
    assert windows[0].input_ids[1:6].tolist() == list(range(10, 15)) and windows[0].input_ids[6] == tokenizer.sep_token_id


def test_offsets_return_original_text_with_case_and_punctuation(tokenizer):
    context = "Gamma  said:   Alice-Bruno, THETA!"
    dataset = read_squad_json_from(
        {"data": [{"title": "t", "paragraphs": [{"context": context, "qas": [
            {"id": "x", "question": "who?", "answers": [{"text": "Alice-Bruno", "answer_start": context.index("Alice")}]}]}]}]}
    )
    (window,) = build_squad_windows(dataset, tokenizer, max_seq_length=64, doc_stride=16, max_query_length=8,
                                    keep_offsets=True)
    text = context[window.offsets[window.start_position][0] : window.offsets[window.end_position][1]]
    assert text == "Alice-Bruno"


def read_squad_json_from(payload: dict, tmp: Path | None = None):
    import tempfile

    directory = Path(tempfile.mkdtemp()) if tmp is None else tmp
    path = directory / "data.json"
    path.write_text(json.dumps(payload), encoding="utf-8")
    return read_squad_json([path])


# ---------------------------------------------------------------------------- decoding


def test_best_span_comes_from_the_window_where_the_answer_is_whole():
    context = "alpha beta gamma delta epsilon zeta eta theta"
    spans = [(m, m + len(w)) for w, m in zip(context.split(), [context.index(w) for w in context.split()])]
    # window 0: [CLS] q [SEP] alpha..epsilon [SEP]; window 1: [CLS] q [SEP] delta..theta [SEP]
    offsets0 = [None, None, None] + spans[0:5] + [None]
    offsets1 = [None, None, None] + spans[3:8] + [None]
    start0, end0 = np.full(9, -5.0), np.full(9, -5.0)
    start1, end1 = np.full(9, -5.0), np.full(9, -5.0)
    start0[3 + 4] = 6.0  # window 0 sees the answer's start ("epsilon") but not its end ("zeta")
    end0[0] = 50.0  # [CLS] and question positions are never part of a span
    end0[1] = 50.0
    start1[3 + 1], end1[3 + 2] = 5.0, 5.0  # window 1: "epsilon zeta", whole
    end1[3 + 0], start1[3 + 0] = 40.0, -100.0  # a high end before the answer's start pairs with no good start
    candidates = best_spans([start0, start1], [end0, end1], [offsets0, offsets1], n_best=20, max_answer_length=30)
    best = candidates[0]
    assert context[best.char_start : best.char_end] == "epsilon zeta"
    assert best.window == 1 and best.score == pytest.approx(10.0)
    assert len(candidates) == 20 and all(a.score >= b.score for a, b in zip(candidates, candidates[1:]))
    assert len({(c.char_start, c.char_end) for c in candidates}) == len(candidates)  # overlap windows merged


def test_best_span_respects_max_answer_length_and_order():
    offsets = [None] + [(i * 2, i * 2 + 1) for i in range(6)] + [None]
    start = np.array([0, 9.0, 0, 0, 0, 0, 0, 0])
    end = np.array([0, 0, 0, 0, 0, 0, 9.0, 0])  # best pair spans 6 tokens
    (best,) = best_spans([start], [end], [offsets], n_best=1, max_answer_length=6)
    assert (best.char_start, best.char_end) == (0, 11)
    (best,) = best_spans([start], [end], [offsets], n_best=1, max_answer_length=5)
    assert best.char_end - best.char_start < 11  # the 6-token span is excluded
    start = np.array([0, 0, 0, 0, 0, 0, 9.0, 0])
    end = np.array([0, 9.0, 0, 0, 0, 0, 0, 0])  # end before start: the pair (score 18) is not a span
    (best,) = best_spans([start], [end], [offsets], n_best=1)
    assert best.score == pytest.approx(9.0)


# ---------------------------------------------------------------------------- loading


def test_local_json_gz_and_parts(tmp_path):
    payload = synthetic_squad(5, seed=1)
    with gzip.open(tmp_path / "dev-v1.1.json.gz", "wt", encoding="utf-8") as handle:
        json.dump(payload, handle)
    for part in (1, 2):
        (tmp_path / f"train-v1.1.rebuilt.part{part}of2.json").write_text(json.dumps(synthetic_squad(3, part)), encoding="utf-8")
    dev = load_squad_split(DataSource(local_dir=tmp_path), "validation")
    train = load_squad_split(DataSource(local_dir=tmp_path), "train")
    assert len(dev) == 5 and len(train) == 6
    row = dev[0]
    assert row["context"][row["answers"]["answer_start"][0]:].startswith(row["answers"]["text"][0])


def test_hub_name_is_used_when_no_directory_is_given(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        return read_squad_json_from(synthetic_squad(2, seed=0))

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert len(load_squad_split(DataSource(hub_name="rajpurkar/squad"), "validation")) == 2
    assert calls == [("rajpurkar/squad", None, "validation")]


def test_missing_squad_file_is_named(tmp_path):
    with pytest.raises(UserError, match="dev-v1.1.json"):
        find_local_squad_files(tmp_path, "validation")


@pytest.mark.skipif(not (SHARED_SQUAD / "dev-v1.1.json.gz").is_file(), reason="shared SQuAD data absent")
def test_real_local_squad_counts():
    source = DataSource(local_dir=SHARED_SQUAD.resolve())
    dev = load_squad_split(source, "validation")
    assert len(dev) == 10570
    assert sum(len(a["text"]) for a in dev["answers"]) == 34726
    train = load_squad_split(source, "train")
    assert len(train) == 87599


# ---------------------------------------------------------------------------- end to end


def test_tiny_squad_finetune_learns(tmp_path, checkpoint):
    data_dir = tmp_path / "squad"
    data_dir.mkdir()
    payload = synthetic_squad(48, seed=3)
    (data_dir / "train-v1.1.json").write_text(json.dumps(payload), encoding="utf-8")
    (data_dir / "dev-v1.1.json").write_text(json.dumps(payload), encoding="utf-8")  # score on the train set
    rows = finetune_squad({"tiny": str(checkpoint)}, str(data_dir), max_train_examples=None, max_eval_examples=24,
                          seeds=[0], output_dir=str(tmp_path / "out"), learning_rate=2e-3, epochs=12, batch_size=8,
                          max_seq_length=48, doc_stride=16, max_query_length=8, progress=False)
    (row,) = rows
    assert row["train_windows"] > row["train_examples"]  # contexts were split into several windows
    assert row["train_loss_last_epoch"] < 0.5 * row["train_loss_first_epoch"]
    assert row["f1"] > 50.0
    report = (tmp_path / "out" / "results.md").read_text()
    assert "squad: train 48 of 48 questions, eval 24 of 48" in report
    predictions = json.loads((tmp_path / "out" / "runs" / "tiny" / "squad" / "seed0.predictions.json").read_text())
    assert len(predictions) == 24

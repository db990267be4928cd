"""The python blocks of docs/scoring.md run as written: background scoring in a plain loop, a proxy scorer in a
plain loop, and the Hugging Face recipe (a `SelectingTrainer` scored by a proxy) on a one-layer BERT."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from replayloader import PrioritizedSampler
from replayloader.selection import Selector, TopK
from tests.docs_blocks import block
from tests.test_torch_sampler import TokenDataset

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run_block(after: str, name: str) -> dict:
    namespace: dict = {}
    exec(compile(block("docs/scoring.md", after), name, "exec"), namespace)
    return namespace


def test_the_background_scoring_example_runs_and_leaves_no_thread(capsys):
    before = set(threading.enumerate())
    run_block("## Background scoring", "docs background scoring example")
    pools, refreshes, staleness_max, age_max = map(int, capsys.readouterr().out.split())
    assert (pools, refreshes, staleness_max, age_max) == (9, 4, 1, 2)  # r = 2: up to 1 step, used 1 step later
    assert set(threading.enumerate()) == before


def test_the_proxy_example_runs(capsys):
    run_block("## A proxy scorer", "docs proxy example")
    steps, forward_rows, correlation = capsys.readouterr().out.split()
    assert int(steps) == 10 and int(forward_rows) == 10 * (64 + 8) and -1.0 <= float(correlation) <= 1.0


def test_the_hugging_face_proxy_recipe_trains_on_the_rows_the_proxy_picks(tmp_path):
    transformers = pytest.importorskip("transformers")
    namespace = run_block("**With the Hugging Face Trainer:** subclass", "docs HF proxy recipe")
    from replayloader.torch import ProxyScorer

    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=20, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, num_labels=2))
    small = torch.nn.EmbeddingBag(20, 2)
    proxy = ProxyScorer(small, torch.optim.SGD(small.parameters(), lr=0.1), namespace["bag_of_tokens_loss"])
    dataset = TokenDataset()
    sampler = PrioritizedSampler(len(dataset), 8, alpha=0.0, seed=0)
    selector = Selector(TopK(2), seed=0)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=6, learning_rate=1e-3,
                                          save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True)
    trainer = namespace["ProxySelectingTrainer"](model=model, args=args, train_dataset=dataset,
                                                 eval_dataset=dataset, sampler=sampler, selector=selector,
                                                 proxy=proxy)
    before = [p.detach().clone() for p in model.parameters()]
    proxy_before = small.weight.detach().clone()
    assert np.isfinite(trainer.train().training_loss)
    assert selector.stats()["batches"] == 6 and selector.stats()["selected"] == 6 * 2
    stats = proxy.stats()
    assert stats["pools"] == 6 and stats["steps"] == 6 and stats["train_rows"] == 6 * 2
    assert stats["correlated_steps"] <= 6 and not torch.equal(proxy_before, small.weight)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    selection = trainer.last_selection
    assert selection.positions.tolist() == np.argsort(-selection.scores, kind="stable")[:2].tolist()
    assert np.isfinite(trainer.evaluate()["eval_loss"]) and proxy.stats()["pools"] == 6  # eval: untouched

"""Where users train: `ReusedPool`, `SelectionSwitch` and the stale reducible-loss tree in a DataLoader loop with 2
workers (exact resume included), and in the Hugging Face Trainer recipes."""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, default_collate  # noqa: E402

from replayloader import PrioritizedBatchSampler, PrioritizedSampler  # noqa: E402
from replayloader.selection import (ReducibleLoss, ReusedPool, SelectionSwitch, Selector, TopK,  # noqa: E402
                                    stale_reducible_sampler, stale_rows)
from replayloader.torch import CandidateBatchSampler, take_rows  # noqa: E402
from tests.test_torch_sampler import IndexDataset, TokenDataset  # noqa: E402

from .helpers import stream_of  # noqa: E402

N = 40
IL = np.linspace(0.0, 0.5, N)


def loader_for(batches, workers=2):
    return DataLoader(IndexDataset(), batch_sampler=batches, num_workers=workers,
                      **({"prefetch_factor": 2} if workers else {}))


# ----------------------------------------------------------------------------- ReusedPool
def make_pool(seed=0):
    pool = ReusedPool(Selector(TopK(3), ReducibleLoss(IL), seed=seed), steps=3)
    sampler = PrioritizedSampler(N, 12, alpha=1.0, beta=0.5, uniform_fraction=0.1, seed=seed)
    return CandidateBatchSampler(sampler, pool), pool


def train_pool(batch, steps, out, stop):
    """Train the pool's steps on ``batch`` (the fetched candidates, in memory); True once ``stop`` steps are done."""
    for chosen in steps:
        rows = take_rows(batch, chosen.positions)
        assert rows["index"].tolist() == chosen.indices.tolist()  # cut from the batch: nothing fetched again
        out.append((batch["index"].tolist(), chosen.positions.tolist()))
        if len(out) == stop:
            return True
    return False


def pool_run(batches, pool, stop, out=None):
    out = [] if out is None else out
    loader = loader_for(batches)
    while len(out) < stop:
        for batch in loader:
            candidates = batches.next_batch_info()
            scores = stream_of(batch["index"].numpy(), pool.stats()["pools"])
            if train_pool(batch, pool.steps(batches.choose(candidates, scores)), out, stop):
                return out
    return out


@pytest.mark.parametrize("stop", [4, 13])  # mid-pool in the warm-up pass (pools of 3, 3, 3, 2 steps), after it
def test_a_reused_pool_feeds_m_steps_per_fetched_batch_and_resumes_mid_pool_through_two_workers(stop):
    whole_batches, whole_pool = make_pool()
    whole = pool_run(whole_batches, whole_pool, 24)
    assert whole_pool.stats()["forward_rows_per_trained_row"] == pytest.approx(
        whole_pool.stats()["scored"] / whole_pool.stats()["selected"])
    batches, pool = make_pool()
    head = pool_run(batches, pool, stop)
    state = copy.deepcopy(batches.state_dict())
    resumed_batches, resumed_pool = make_pool(seed=3)
    resumed_batches.load_state_dict(state)
    assert resumed_pool.pending_steps > 0
    dataset = IndexDataset()  # the pool's rows, fetched again by index (the positions index them)
    again = default_collate([dataset[i] for i in resumed_pool.candidate_indices()])
    tail = []
    train_pool(again, resumed_pool.steps(), tail, None)
    tail = pool_run(resumed_batches, resumed_pool, 24 - stop, tail)
    assert head + tail == whole


# ----------------------------------------------------------------------------- SelectionSwitch
def make_switch(seed=0):
    switch = SelectionSwitch(Selector(TopK(3), ReducibleLoss(IL), seed=seed), window=3, probe_every=3)
    sampler = PrioritizedSampler(N, 12, alpha=0.0, seed=seed)  # uniform candidates
    return CandidateBatchSampler(sampler, switch), switch


def switch_run(batches, switch, steps, workers=2):
    out = []
    loader = loader_for(batches, workers)
    while len(out) < steps:
        for batch in loader:
            candidates = batches.next_batch_info()
            t = switch.stats()["steps"]
            level = 1.0 - 0.02 * t if t < 12 else 0.7 - 0.005 * t  # selection pays early, not later
            if switch.selecting:
                chosen = batches.choose(candidates, level + IL[batch["index"].numpy()] + 0.01 * (batch["x"][:, 0]
                                                                                                   % 3).numpy())
                switch.step_done()  # nothing to add (cost="rows"): a no-op, as the loop in the docs writes it
            else:
                chosen = switch.uniform(candidates)
                rows = take_rows(batch, chosen.positions)
                assert rows["index"].tolist() == chosen.indices.tolist()
                switch.step_done(level + IL[chosen.indices] + 0.01 * (chosen.indices % 3))
            out.append((switch.stats()["selecting_steps"], chosen.indices.tolist()))
            if len(out) == steps:
                return out
    return out


def test_the_switch_in_a_two_worker_loop_equals_no_workers_and_resumes_mid_window():
    whole_batches, whole_switch = make_switch()
    whole = switch_run(whole_batches, whole_switch, 30)
    no_workers_batches, no_workers_switch = make_switch()
    assert switch_run(no_workers_batches, no_workers_switch, 30, workers=0) == whole
    stats = whole_switch.stats()
    assert 0 < stats["selecting_fraction"] < 1 and stats["steps"] == 30
    batches, switch = make_switch()
    head = switch_run(batches, switch, 13)  # window 4, step 2 of 3
    resumed_batches, resumed_switch = make_switch(seed=5)
    resumed_batches.load_state_dict(copy.deepcopy(batches.state_dict()))
    assert head + switch_run(resumed_batches, resumed_switch, 17) == whole


def test_the_switch_runs_inside_selecting_trainer(tmp_path):
    """SelectingTrainer asks the switch first: a selecting step scores the pool, a uniform step takes the
    switch's uniform rows without a scoring forward (counted); the switch decides, stops and reports."""
    pytest.importorskip("transformers")
    n = len(TokenDataset())
    switch = SelectionSwitch(Selector(TopK(2), ReducibleLoss(np.zeros(n)), seed=0), window=2, probe_every=3)
    trainer = tiny_trainer(tmp_path, PrioritizedSampler(n, 8, alpha=0.0, seed=0), switch, steps=8)
    assert np.isfinite(trainer.train().training_loss)
    stats = switch.stats()
    assert stats["steps"] == 8 and stats["scored_rows"] == 8 * stats["selecting_steps"]
    assert stats["trained_rows"] == 8 * 2
    assert stats["selecting_steps"] <= 6  # window 1 (steps 2-3) was a uniform probe, at least
    assert trainer.batch_sampler.state_dict()["selector"]["switch"]["steps"] == 8


# ----------------------------------------------------------------------------- the stale reducible-loss tree
def stale_run(batches, steps, start=0):
    out = []
    loader = loader_for(batches)
    while len(out) < steps:
        for batch in loader:
            info = batches.next_batch_info()
            t = start + len(out)
            batches.feedback(info, loss=torch.as_tensor(stream_of(batch["index"].numpy(), t)))  # training losses
            if t % 3 == 2:
                rows = stale_rows(batches, 4)
                batches.feedback(rows, loss=stream_of(rows, -t))  # the periodic refresh of a slice
            out.append((info.indices.tolist(), info.weights.tolist()))
            if len(out) == steps:
                return out
    return out


def make_stale(seed=0):
    return PrioritizedBatchSampler(stale_reducible_sampler(IL, batch_size=6, initial_loss=0.69, beta=0.5, seed=seed))


def test_the_stale_tree_in_a_two_worker_loop_resumes_exactly():
    whole = stale_run(make_stale(), 20)
    first = make_stale()
    head = stale_run(first, 7)
    resumed = make_stale(seed=2)
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    assert head + stale_run(resumed, 13, start=7) == whole
    assert first.sampler.update_rule.calls == 7 + 2  # 7 training feedbacks, 2 refreshes


def test_the_stale_tree_drives_prioritized_trainer(tmp_path):
    transformers = pytest.importorskip("transformers")
    from replayloader.torch.hf import PrioritizedTrainer

    n = len(TokenDataset())
    sampler = stale_reducible_sampler(np.full(n, 0.3), batch_size=4, initial_loss=0.69, seed=0)
    torch.manual_seed(0)
    trainer = PrioritizedTrainer(model=tiny_bert(transformers), args=tiny_args(transformers, tmp_path, 6),
                                 train_dataset=TokenDataset(), sampler=sampler)
    trainer.train()
    fed = sampler.update_rule.last_fed >= 0
    assert sampler.update_rule.calls == 6 and fed.sum() >= 4
    assert (sampler.weights[fed] >= 0.01).all() and (sampler.weights[~fed] == 0.69 - 0.3 + 0.01).all()


# ----------------------------------------------------------------------------- the tiny Trainer
def tiny_bert(transformers):
    return transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=20, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, num_labels=2))


def tiny_args(transformers, tmp_path, steps):
    return transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=steps, learning_rate=1e-3,
                                          save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True)


def tiny_trainer(tmp_path, sampler, selector, steps):
    import transformers
    from replayloader.torch.hf import SelectingTrainer

    torch.manual_seed(0)
    return SelectingTrainer(model=tiny_bert(transformers), args=tiny_args(transformers, tmp_path, steps),
                            train_dataset=TokenDataset(), sampler=sampler, selector=selector)

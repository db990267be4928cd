"""The cheaper-selection parts inside `SelectingTrainer` (Hugging Face): a `SelectionSwitch` skips the scoring
forward in uniform steps, a `ReusedPool` feeds m steps per scored pool (fetched once) and resumes exactly from a
Trainer checkpoint mid-pool and between pools, a `ProxyScorer` scores in the model's place; bad combinations are
refused with the reason. A one-layer BERT built from a config (nothing downloaded), a few steps each."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from replayloader import PrioritizedSampler  # noqa: E402
from replayloader.distributed import load_shared_state, save_shared_state  # noqa: E402
from replayloader.selection import ReducibleLoss, ReusedPool, SelectionSwitch, Selector, TopK  # noqa: E402
from replayloader.state import InvalidState  # noqa: E402
from replayloader.torch import ProxyScorer  # noqa: E402
from replayloader.torch.hf import PooledCandidateBatchSampler, SelectingTrainer  # noqa: E402
from tests.test_torch_sampler import TokenDataset  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N, POOL, K, M = 24, 8, 2, 3  # TokenDataset rows, n_B, n_b, steps per pool
IDS = TokenDataset().ids
STATE_FILE = "selection.npz"


class SaveSelection(transformers.TrainerCallback):
    """What the docs tell a user to do: write the batch sampler's state into every Trainer checkpoint."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_save(self, args, state, control, **kwargs):
        folder = f"{args.output_dir}/checkpoint-{state.global_step}"
        save_shared_state(self.trainer.batch_sampler.state_dict(), f"{folder}/{STATE_FILE}")


class Recorded(SelectingTrainer):
    """Records, per training step, the rows the DataLoader fetched, the selection and the rows the training
    forward saw; and every forward pass of the model (with or without gradients, rows)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fetched, self.steps, self.forwards = [], [], []
        self.model.register_forward_pre_hook(self._forward, with_kwargs=True)

    def _forward(self, module, args, kwargs):
        self.forwards.append((torch.is_grad_enabled(), kwargs["input_ids"].shape[0]))
        if torch.is_grad_enabled():
            self.trained_ids = kwargs["input_ids"].detach().clone()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:
            self.fetched.append(len(inputs["input_ids"]))
        out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if model.training:
            selection = self.last_selection
            assert torch.equal(self.trained_ids, IDS[selection.indices])  # the training forward saw these rows
            self.steps.append({"indices": selection.indices.tolist(), "positions": selection.positions.tolist(),
                               "scores": selection.scores.copy()})
        return out

    def scoring_forwards(self):
        return [rows for grad, rows in self.forwards if not grad]


def make_trainer(out, selector, steps, *, n_b_pool=POOL, save_steps=None, scorer=None, **args):
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=20, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    # no dropout: a resumed Trainer's DataLoader iterator draws its seed from the RNG the checkpoint restored, so
    # dropout masks after a resume differ from an uninterrupted run's whatever the sampler does
    options = {"output_dir": str(out), "max_steps": steps, "learning_rate": 1e-2, "report_to": [], "use_cpu": True,
               "disable_tqdm": True, "logging_strategy": "no", "seed": 0, "ignore_data_skip": True,
               **({"save_strategy": "steps", "save_steps": save_steps} if save_steps else {"save_strategy": "no"}),
               **args}
    trainer = Recorded(model=model, args=transformers.TrainingArguments(**options), train_dataset=TokenDataset(),
                       sampler=PrioritizedSampler(N, n_b_pool, alpha=0.0, seed=0), selector=selector, scorer=scorer)
    trainer.add_callback(SaveSelection(trainer))
    return trainer


def make_switch(seed=0, **options):
    return SelectionSwitch(Selector(TopK(K), ReducibleLoss(np.zeros(N)), seed=seed), window=2, probe_every=3,
                           **options)


def make_pool(seed=0, **options):
    return ReusedPool(Selector(TopK(K), ReducibleLoss(np.zeros(N)), seed=seed), steps=M, **options)


def top(scores, count):
    return np.argsort(-scores, kind="stable")[:count].tolist()


# ----------------------------------------------------------------------------- SelectionSwitch
def test_a_switch_in_the_trainer_runs_no_scoring_forward_in_uniform_steps(tmp_path):
    switch = make_switch()
    trainer = make_trainer(tmp_path, switch, 10)
    trainer.train()
    stats = switch.stats()
    selecting, uniform = stats["selecting_steps"], stats["steps"] - stats["selecting_steps"]
    assert stats["steps"] == 10 and selecting > 0 and uniform > 0  # window 1 (steps 2, 3) is a uniform probe
    assert trainer.scoring_forwards() == [POOL] * selecting  # one scoring forward per selection step, none else
    assert stats["scored_rows"] == POOL * selecting and stats["trained_rows"] == K * 10
    assert trainer.fetched == [POOL] * 10  # the DataLoader fetches the pool either way (the mode is decided later)
    scored = [step for step in trainer.steps if not np.isnan(step["scores"]).all()]
    assert len(scored) == selecting
    for step in scored:  # selection steps: TopK of the scored pool
        assert step["positions"] == top(step["scores"], K)
    for step in trainer.steps:
        assert len(step["indices"]) == K


def test_the_switchs_uniform_rows_are_what_switch_uniform_hands_out_and_the_switch_measures_them(tmp_path):
    """A second switch replays the trainer's calls: the same candidates, the same uniform rows, the same losses
    from the training forward give the same state, step by step."""
    switch = make_switch()
    trainer = make_trainer(tmp_path, switch, 8)
    seen = []
    batches = trainer.batch_sampler
    next_info = batches.next_batch_info

    def recorded_info():
        info = next_info()
        seen.append((info, switch.selecting, switch.state_dict()))
        return info

    batches.next_batch_info = recorded_info
    ended = []
    step_done = switch.step_done
    switch.step_done = lambda losses=None, **kw: (ended.append(None if losses is None else losses.clone()),
                                                  step_done(losses, **kw))[1]
    trainer.train()
    uniform_steps = [i for i, (_, selecting, _) in enumerate(seen) if not selecting]
    assert uniform_steps and len(ended) == 8
    for i in uniform_steps:
        info, _, before = seen[i]
        replay = make_switch(seed=7)
        replay.load_state_dict(before)
        chosen = replay.uniform(info)
        assert trainer.steps[i]["indices"] == chosen.indices.tolist()  # trained on the rows the switch chose
        assert trainer.steps[i]["indices"] == info.indices[chosen.positions].tolist()
        replay.step_done(ended[i])  # the training forward's per-example losses
        after = seen[i + 1][2] if i + 1 < len(seen) else switch.state_dict()
        assert replay.state_dict()["switch"]["acc"].tolist() == after["switch"]["acc"].tolist()


def test_a_switch_measuring_seconds_gets_every_steps_seconds_from_training_step(tmp_path):
    switch = make_switch(cost="seconds")
    make_trainer(tmp_path, switch, 6).train()
    stats = switch.stats()
    assert stats["steps"] == 6 and stats["seconds_selecting"] > 0 and stats["seconds_uniform"] > 0


# ----------------------------------------------------------------------------- ReusedPool
def test_two_dataloader_workers_train_the_same_rows_as_none(tmp_path):
    plain = make_trainer(tmp_path / "plain", make_pool(), 7)
    plain.train()
    workers = make_trainer(tmp_path / "workers", make_pool(), 7, dataloader_num_workers=2)
    workers.train()
    assert [s["indices"] for s in workers.steps] == [s["indices"] for s in plain.steps]
    assert workers.fetched == plain.fetched == [POOL, 1, 1] * 2 + [POOL]


def test_a_reused_pool_feeds_m_steps_per_scored_pool_fetched_once(tmp_path):
    pool = make_pool()
    trainer = make_trainer(tmp_path, pool, 12)  # one epoch: 3 pools of 3 steps, then the next epoch's first
    assert isinstance(trainer.batch_sampler, PooledCandidateBatchSampler) and len(trainer.batch_sampler) == 9
    trainer.train()
    assert trainer.scoring_forwards() == [POOL] * 4  # one scoring forward per pool
    assert trainer.fetched == [POOL, 1, 1] * 4  # the pool once, a one-row placeholder for each further step
    stats = pool.stats()
    assert stats["pools"] == 4 and stats["steps_handed"] == 12 and stats["pending_steps"] == 0
    assert stats["forward_rows_per_trained_row"] == POOL / (M * K)
    for p in range(4):  # the rows ReusedPool hands out: the pool's m·n_b highest scores, n_b per step
        steps = trainer.steps[p * M:(p + 1) * M]
        plan = top(steps[0]["scores"], M * K)
        for j, step in enumerate(steps):
            np.testing.assert_array_equal(step["scores"], steps[0]["scores"])  # the pool's (stale) scores
            assert step["positions"] == plan[j * K:(j + 1) * K]
    first_epoch = [i for step in trainer.steps[:9] for i in step["indices"]]
    assert len(first_epoch) == 18 and len(set(first_epoch)) == 18  # warm-up pass: 3 disjoint pools


def test_a_reranked_pool_and_a_short_pool(tmp_path):
    """rerank=True takes each step's rows from the pool's remaining rows; a pool of 10 for m·n_b = 6 in a pass
    of 24 leaves a last pool of 4 candidates: 2 steps (ceil(4 / 2)), the epoch ends early."""
    pool = make_pool(rerank=True)
    trainer = make_trainer(tmp_path, pool, 9, n_b_pool=10)
    assert len(trainer.batch_sampler) == 3 * M
    trainer.train()
    assert trainer.fetched == [10, 1, 1, 10, 1, 1, 4, 1, 10]  # epoch 0: 3 + 3 + 2 steps; epoch 1 begins
    assert trainer.scoring_forwards() == [10, 10, 4, 10]
    for p, start in enumerate((0, 3, 6)):
        steps = trainer.steps[start:start + (2 if p == 2 else 3)]
        taken = [i for step in steps for i in step["positions"]]
        assert taken == top(steps[0]["scores"], len(taken))  # TopK reranked: the same rows as one pick


@pytest.mark.parametrize("saved_at, workers", [(4, 0), (6, 0), (4, 2)])
def test_resuming_a_reused_pool_from_a_trainer_checkpoint_continues_identically(tmp_path, saved_at, workers):
    """Checkpoint 4 lies mid-pool (the second pool trained 1 of its 3 steps), checkpoint 6 between pools; 2
    DataLoader workers prefetch further ahead."""
    options = {"dataloader_num_workers": workers}
    whole = make_trainer(tmp_path / "whole", make_pool(), 10, save_steps=saved_at, **options)
    whole.train()
    checkpoint = tmp_path / "whole" / f"checkpoint-{saved_at}"
    state = load_shared_state(checkpoint / STATE_FILE)
    if not workers:  # the pool's rest, or the prefetched next pool's m steps
        assert len(state["pending"]) == M - saved_at % M
    resumed_pool = make_pool(seed=5)  # another seed: the state decides
    resumed = make_trainer(tmp_path / "resumed", resumed_pool, 10, **options)
    resumed.batch_sampler.load_state_dict(state)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == 10
    assert [s["indices"] for s in resumed.steps] == [s["indices"] for s in whole.steps[saved_at:]]
    if saved_at % M:  # the pool's rows are fetched again by index, whole, then placeholders; not scored again
        assert resumed.fetched[:M - saved_at % M] == [POOL] + [1] * (M - saved_at % M - 1)
    assert len(resumed.scoring_forwards()) == len(whole.scoring_forwards()) - (saved_at + M - 1) // M
    for a, b in zip(whole.model.parameters(), resumed.model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert resumed_pool.stats()["steps_handed"] == whole.selector.stats()["steps_handed"]


def test_a_switch_resumes_from_a_trainer_checkpoint_mid_window(tmp_path):
    whole_switch = make_switch()
    whole = make_trainer(tmp_path / "whole", whole_switch, 10, save_steps=7)  # windows of 2: step 7 is mid-window
    whole.train()
    resumed_switch = make_switch(seed=3)
    resumed = make_trainer(tmp_path / "resumed", resumed_switch, 10)
    resumed.batch_sampler.load_state_dict(load_shared_state(tmp_path / "whole" / "checkpoint-7" / STATE_FILE))
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-7"))
    assert [s["indices"] for s in resumed.steps] == [s["indices"] for s in whole.steps[7:]]
    selecting_after = sum(not np.isnan(s["scores"]).all() for s in whole.steps[7:])
    assert len(resumed.scoring_forwards()) == selecting_after  # the same steps select, the same skip scoring
    assert resumed_switch.state_dict()["switch"]["acc"].tolist() == whole_switch.state_dict()["switch"]["acc"].tolist()
    assert resumed_switch.stats()["selecting_steps"] == whole_switch.stats()["selecting_steps"]


# ----------------------------------------------------------------------------- ProxyScorer
def bag_of_tokens_loss(proxy, rows):
    inputs, labels = rows
    return torch.nn.functional.cross_entropy(proxy(inputs["input_ids"]), labels, reduction="none")


def make_proxy(**options):
    torch.manual_seed(1)
    small = torch.nn.EmbeddingBag(20, 2)
    return ProxyScorer(small, torch.optim.SGD(small.parameters(), lr=0.1), bag_of_tokens_loss, **options)


def test_a_proxy_scores_the_candidates_in_the_models_place(tmp_path):
    proxy = make_proxy()
    trainer = make_trainer(tmp_path, Selector(TopK(K), seed=0), 5, scorer=proxy)
    model_before = [p.detach().clone() for p in trainer.model.parameters()]
    proxy_before = proxy.model.weight.detach().clone()
    trainer.train()
    assert trainer.scoring_forwards() == []  # the model ran no scoring forward
    stats = proxy.stats()
    assert stats["pools"] == 5 and stats["steps"] == 5 and stats["train_rows"] == 5 * K
    assert 0 < stats["correlated_steps"] <= 5 and not torch.equal(proxy_before, proxy.model.weight)
    assert any(not torch.equal(a, b) for a, b in zip(model_before, trainer.model.parameters()))
    for step in trainer.steps:
        assert step["positions"] == top(step["scores"], K)  # chosen by the proxy's scores
    assert np.isfinite(trainer.evaluate(TokenDataset())["eval_loss"]) and proxy.stats()["pools"] == 5  # untouched


def test_a_proxy_with_a_pool_and_with_a_switch(tmp_path):
    proxy = make_proxy(train_on="pool")  # trains on the pool: no importance weights passed
    trainer = make_trainer(tmp_path / "pool", make_pool(), 6, scorer=proxy)
    trainer.train()
    assert trainer.scoring_forwards() == [] and proxy.stats()["pools"] == 2 and proxy.stats()["steps"] == 6
    proxy, switch = make_proxy(), make_switch()
    trainer = make_trainer(tmp_path / "switch", switch, 6, scorer=proxy)
    trainer.train()
    assert proxy.stats()["pools"] == switch.stats()["selecting_steps"] < 6  # uniform steps score nothing
    assert proxy.stats()["steps"] == 6  # the proxy learns from every step's rows


# ----------------------------------------------------------------------------- refused
def test_bad_combinations_are_refused_with_the_reason(tmp_path):
    with pytest.raises(TypeError, match="scorer must score candidates in the model's place"):
        make_trainer(tmp_path, Selector(TopK(K)), 2, scorer=object())
    with pytest.raises(ValueError, match=r"steps x k \(m \* n_b\) = 5 x 2 = 10 exceeds the candidate batch size"):
        make_trainer(tmp_path, ReusedPool(Selector(TopK(K)), steps=5), 2)

    class Both(ReusedPool):  # the members of a SelectionSwitch too (SwitchLike; a member set to None is absent)
        selecting = True

        def uniform(self, candidates, *, rows=None):
            raise AssertionError("never called")

        def step_done(self, losses=None, *, indices=None, seconds=None):
            raise AssertionError("never called")

    with pytest.raises(TypeError, match="looks like both a ReusedPool .* and a SelectionSwitch"):
        make_trainer(tmp_path, Both(Selector(TopK(K)), steps=2), 2)
    with pytest.raises(TypeError, match="a ReusedPool"):
        PooledCandidateBatchSampler(PrioritizedSampler(N, POOL), Selector(TopK(K)))


def test_a_pool_trainer_refuses_a_state_that_is_not_its_own_and_changes_nothing(tmp_path):
    plain = make_trainer(tmp_path / "plain", Selector(TopK(K), seed=0), 2)
    pooled = make_trainer(tmp_path / "pooled", make_pool(), 2)
    before = pooled.batch_sampler.state_dict()
    with pytest.raises(InvalidState, match="no 'pool_steps' entry"):
        pooled.batch_sampler.load_state_dict(plain.batch_sampler.state_dict())
    bad = {**before, "pending": before["pending"] + [before["pending"][0]] if before["pending"] else
           [{"indices": np.arange(POOL), "weights": np.ones(POOL), "probabilities": np.ones(POOL) / N, "epoch": 0,
             "step": 0}], "pool_steps": np.array([[3, 3]])}
    with pytest.raises(InvalidState, match=r"must be \[step, steps\] with 0 <= step < steps <= m = 3"):
        pooled.batch_sampler.load_state_dict(bad)
    after = pooled.batch_sampler.state_dict()
    assert after["pending"] == before["pending"] and after["pool_steps"].tolist() == before["pool_steps"].tolist()
    with pytest.raises(InvalidState):  # a plain Selector refuses a ReusedPool's state
        plain.batch_sampler.load_state_dict(before)


# ----------------------------------------------------------------------------- the docs' blocks
def run_block(page, after, capsys):
    from tests.docs_blocks import block

    exec(compile(block(page, after), f"{page}: {after}", "exec"), {})
    return capsys.readouterr().out.split("\n")


def test_the_where_each_part_runs_example_resumes_a_reused_pool_mid_pool(capsys):
    assert run_block("docs/selection.md", "## Where each part runs", capsys)[-2] == "3 9 1.33"


def test_the_hugging_face_proxy_example_scores_every_pool_with_the_proxy(capsys):
    """docs/scoring.md, "**With the Hugging Face Trainer:** pass the proxy": 6 steps, each pool scored by the
    proxy, which learns the 4 rows of every step."""
    assert run_block("docs/scoring.md", "**With the Hugging Face Trainer:** pass the proxy", capsys)[-2] == "6 6 24"

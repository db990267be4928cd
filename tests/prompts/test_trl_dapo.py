"""DynamicSamplingGRPOTrainer: TRL's GRPOTrainer with DAPO's dynamic sampling. Every generation batch that reaches
the loss holds exactly its groups with reward variance, every generated group is counted, the re-padded batch keeps
every kept token, resume restores the draw stream, and bad input is named."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from replayloader.distributed import state_digest  # noqa: E402
from replayloader.prompts import DynamicSampling, DynamicSamplingGRPOTrainer  # noqa: E402
from replayloader.prompts.trl_dapo import _joined, _rows  # noqa: E402

from . import tiny_grpo as tiny  # noqa: E402
from .tiny_grpo import one_thread  # noqa: E402,F401 (autouse: one torch thread per test)


class Recording(DynamicSamplingGRPOTrainer):
    """Keeps every generation batch handed to the loss (instrumentation of the test only)."""

    def _generate_and_score_completions(self, inputs):
        batch = super()._generate_and_score_completions(inputs)
        if self.model.training:
            self.batches = [*getattr(self, "batches", []), batch]
        return batch


class ThirdUnsolved:
    """Every third prompt fails all its completions (a zero-variance group); the others alternate 0/1 within their
    group. Records each call's ``prompt_index`` list."""

    __name__ = "third_unsolved"

    def __init__(self) -> None:
        self.calls = []

    def __call__(self, completions, prompt_index, **kwargs):
        self.calls.append([int(i) for i in prompt_index])
        return [0.0 if i % 3 == 0 else float(k % 2) for k, i in enumerate(prompt_index)]


def with_index(n: int = 40):
    data = tiny.prompts(n)
    return data.add_column("prompt_index", np.arange(n))


def trainer(out, reward, *, dynamic=None, cls=Recording, **options) -> DynamicSamplingGRPOTrainer:
    return cls(model=tiny.model(), reward_funcs=reward, args=tiny.config(out, **options), train_dataset=with_index(),
               processing_class=tiny.tokenizer(), dynamic_sampling=dynamic)


def test_the_loss_sees_only_groups_with_variance_and_every_generated_group_is_counted(tmp_path):
    reward = ThirdUnsolved()
    dynamic = DynamicSampling(40, 2, oversample=1.5, group_size=4, seed=3)
    run = trainer(tmp_path, reward, dynamic=dynamic, max_steps=5)
    run.train()
    generated = [i for call in reward.calls for i in call[::4]]  # one prompt per group, in generation order
    for call in reward.calls:
        assert all(call[k:k + 4] == [call[k]] * 4 for k in range(0, len(call), 4))
    stats = dynamic.stats()
    assert stats["groups"] == len(generated) > 10 and stats["kept"] == 10 and stats["batches"] == 4
    assert stats["dropped"] == sum(i % 3 == 0 for i in generated) > 0
    assert stats["dropped"] + stats["trimmed"] + stats["kept"] == stats["groups"]
    assert len(run.batches) == 5
    for batch in run.batches:
        assert batch["completion_ids"].shape[0] == 8  # 2 groups x 4 completions, as TRL's own batch
        groups = batch["advantages"].view(2, 4)
        assert (groups.abs().sum(dim=1) > 0).all()  # each kept group has reward variance, so nonzero advantages
        assert int(batch["num_items_in_batch"]) == int(batch["completion_mask"].sum())
    logged = [h for h in run.state.log_history if "loss" in h]
    assert all(h["dynamic/rounds"] >= 1 for h in logged) and any(h["dynamic/frac_dropped"] > 0 for h in logged)


def test_rejoined_rounds_keep_every_kept_token_padded_as_trl_pads():
    def part(prompt_len, completion_len, rows, first):
        ids = torch.arange(first, first + rows * completion_len).view(rows, completion_len)
        return {"prompt_ids": torch.full((rows, prompt_len), 7), "prompt_mask": torch.ones(rows, prompt_len, dtype=torch.long),
                "completion_ids": ids, "completion_mask": torch.ones(rows, completion_len, dtype=torch.long),
                "advantages": torch.arange(rows, dtype=torch.float) + first, "num_items_in_batch": torch.tensor(0)}

    a, b = part(3, 2, 4, 100), part(5, 4, 4, 200)
    kept = _joined([_rows(a, np.array([True, True, False, False])), _rows(b, np.array([False, True, True, True]))],
                   pad_id=0)
    assert kept["prompt_ids"].shape == (5, 5) and kept["completion_ids"].shape == (5, 4)
    assert kept["prompt_ids"][0].tolist() == [0, 0, 7, 7, 7] and kept["prompt_mask"][0].tolist() == [0, 0, 1, 1, 1]
    assert kept["completion_ids"][1].tolist() == [102, 103, 0, 0] and kept["completion_mask"][1].tolist() == [1, 1, 0, 0]
    assert kept["advantages"].tolist() == [100, 101, 201, 202, 203]
    assert int(kept["num_items_in_batch"]) == 2 * 2 + 3 * 4
    with pytest.raises(ValueError, match="text batches.*pixel_values"):
        _rows({**a, "pixel_values": torch.zeros(4, 3)}, np.ones(4, bool))


def test_resuming_a_trainer_checkpoint_continues_the_identical_draws(tmp_path):
    make = lambda out, reward: trainer(out, reward, dynamic=DynamicSampling(40, 2, oversample=2.0, group_size=4,
                                                                            seed=5),
                                       max_steps=6, save_strategy="steps", save_steps=3)
    whole = tiny.CompletionReward()  # depends on the completions: matches only if sampling resumes exactly
    first = make(tmp_path / "a", whole)
    first.train()
    assert (tmp_path / "a" / "checkpoint-3" / "dynamic_sampling.npz").is_file()
    resumed_reward = tiny.CompletionReward()
    resumed = make(tmp_path / "b", resumed_reward)
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-3"))
    tail = len(resumed_reward.calls)  # the rounds of steps 4-6 (at least one a step)
    assert 3 <= tail < len(whole.calls)
    assert resumed_reward.calls == whole.calls[-tail:] and resumed_reward.completions == whole.completions[-tail:]
    assert state_digest(resumed.dynamic_sampling.state_dict()) == state_digest(first.dynamic_sampling.state_dict())


def test_a_batch_that_never_fills_raises_as_dapos_reference_does(tmp_path):
    def solved(completions, **kwargs):
        return [1.0] * len(completions)

    run = trainer(tmp_path, solved, dynamic=DynamicSampling(40, 2, max_rounds=3, group_size=4), max_steps=1)
    with pytest.raises(RuntimeError, match="kept 0 of 2 groups in 3 rounds"):
        run.train()
    assert run.dynamic_sampling.stats()["dropped"] == 6


def test_bad_trainer_arguments_are_named(tmp_path):
    reward = tiny.StreamReward(group=4)
    with pytest.raises(ValueError, match="dynamic_sampling.batch_size is 3 but a generation batch holds 2"):
        trainer(tmp_path, reward, dynamic=DynamicSampling(40, 3, group_size=4))
    with pytest.raises(ValueError, match="dynamic_sampling.num_prompts is 50 but train_dataset has 40"):
        trainer(tmp_path, reward, dynamic=DynamicSampling(50, 2, group_size=4))
    with pytest.raises(ValueError, match="dynamic_sampling.group_size is 2 but num_generations is 4"):
        trainer(tmp_path, reward, dynamic=DynamicSampling(40, 2, group_size=2))
    with pytest.raises(TypeError, match="dynamic_sampling must be a DynamicSampling, got dict"):
        trainer(tmp_path, reward, dynamic={})
    with pytest.raises(ValueError, match="feedback_reward"):
        DynamicSamplingGRPOTrainer(model=tiny.model(), reward_funcs=reward, args=tiny.config(tmp_path),
                                   train_dataset=with_index(), processing_class=tiny.tokenizer(),
                                   feedback_reward="nope")
    default = trainer(tmp_path, reward, dynamic=None)
    assert default.dynamic_sampling.batch_size == 2 and default.dynamic_sampling.oversample == 1.0


def test_the_docstring_example_runs():
    import doctest

    from replayloader.prompts import trl_dapo

    result = doctest.testmod(trl_dapo, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 10 and result.failed == 0


def test_a_batch_without_max_rounds_warns_while_it_cannot_fill(tmp_path, monkeypatch):
    from replayloader.prompts import trl_dapo

    monkeypatch.setattr(trl_dapo, "WARN_EVERY", 3)
    calls = []

    def unsolved_then_mixed(completions, **kwargs):  # 6 rounds of all-failed groups, then groups with variance
        calls.append(1)
        return [float(len(calls) > 6 and k % 2) for k in range(len(completions))]

    run = trainer(tmp_path, unsolved_then_mixed, dynamic=DynamicSampling(40, 2, group_size=4), max_steps=1)
    with pytest.warns(RuntimeWarning, match="6 rounds for one batch and 0 of 2 groups") as caught:
        run.train()
    assert [str(w.message)[:40] for w in caught if "rounds for one batch" in str(w.message)] == [
        "dynamic sampling: 3 rounds for one batch", "dynamic sampling: 6 rounds for one batch"]


def test_resuming_inside_a_generation_cycle_warns(tmp_path):
    make = lambda out: trainer(out, ThirdUnsolved(), dynamic=DynamicSampling(40, 1, group_size=4, seed=1),
                               per_device_train_batch_size=2, steps_per_generation=2, max_steps=4,
                               save_strategy="steps", save_steps=3)
    make(tmp_path / "a").train()
    with pytest.warns(RuntimeWarning, match="saved at step 3, inside a generation cycle of 2 steps"):
        make(tmp_path / "b").train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-3"))

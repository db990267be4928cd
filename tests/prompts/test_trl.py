"""PrioritizedGRPOTrainer in one process: TRL's GRPOTrainer drawing prompts from the sampler in its layout, the rewards
reaching the sampler once per generation batch, the sampler's logs, an exact resume from a Trainer checkpoint, and
bad input at the trainer level. (Two processes: test_trl_distributed.py.)"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from replayloader.distributed import state_digest  # noqa: E402
from replayloader.prompts import PrioritizedGRPOTrainer, PromptSampler, RewardSpread  # noqa: E402

from . import tiny_grpo as tiny  # noqa: E402
from .tiny_grpo import one_thread  # noqa: E402,F401 (autouse: one torch thread per test)


def trainer(out, reward, *, sampler=None, feedback_reward=None, **options) -> PrioritizedGRPOTrainer:
    return PrioritizedGRPOTrainer(model=tiny.model(), reward_funcs=reward, args=tiny.config(out, **options),
                                  train_dataset=tiny.prompts(), processing_class=tiny.tokenizer(),
                                  prompt_sampler=sampler, feedback_reward=feedback_reward)


def test_rewards_reach_the_sampler_once_per_generation_batch_in_trls_layout(tmp_path):
    # 2 prompts x 4 completions a generation batch, sliced over 2 steps, each generation used twice: a chunk is
    # handed out 4 times, and generated (and fed back) once
    reward = tiny.StreamReward(group=4)
    sampler = PromptSampler(40, 2, group_size=4, seed=0)
    run = trainer(tmp_path, reward, sampler=sampler, per_device_train_batch_size=4, steps_per_generation=2,
                  num_iterations=2, max_steps=12)
    assert run._get_train_sampler() is run.prompt_sampler and run.prompt_sampler.repeat_count == 4
    run.train()
    assert len(reward.calls) == 3  # 12 steps / (2 slices x 2 iterations)
    for call in reward.calls:
        assert len(call) == 8 and call[:4] == [call[0]] * 4 and call[4:] == [call[4]] * 4 and call[0] != call[4]
    stats = run.prompt_sampler.stats()
    assert stats["feedback_calls"] == 3 and stats["groups"] == 6 and stats["measured"] == len(
        {i for call in reward.calls for i in call})
    assert stats["max_lag_seen"] == 0  # each chunk is reused before the next is drawn: its feedback is in
    fed = {i: rate for i, rate in enumerate(sampler.pass_rates()) if not np.isnan(rate)}
    assert set(fed) == {i for call in reward.calls for i in call}
    logged = [h for h in run.state.log_history if "loss" in h]
    assert len(logged) == 12 and all("frac_reward_zero_std" in h or "prompts/measured" in h for h in logged)
    with_feedback = [h for h in logged if "prompts/frac_zero_variance" in h]
    assert len(with_feedback) == 3 and all(h["prompts/frac_zero_variance"] == h["frac_reward_zero_std"]
                                           for h in with_feedback)
    assert logged[-1]["prompts/groups"] == 6.0 and "prompts/judged" in logged[-1]


def test_default_sampler_and_trls_defaults_draw_one_batch_ahead(tmp_path):
    reward = tiny.StreamReward(group=4)
    run = trainer(tmp_path, reward, max_steps=3)
    assert run.prompt_sampler.prompts.batch_size == 2 and run.prompt_sampler.prompts.seed == 0
    run.train()
    stats = run.prompt_sampler.stats()
    assert stats["feedback_calls"] == 3 and stats["chunks_drawn"] == 4 and stats["max_lag_seen"] == 1
    assert stats["policy_step"] == 2  # the clock is the trainer's global step at generation


def test_resuming_a_trainer_checkpoint_continues_the_identical_prompt_stream(tmp_path):
    # the reward depends on the completions, so the prompt stream after the checkpoint depends on the model's
    # sampling too: it matches only if the resumed run generates what the uninterrupted one did (transformers
    # restores the RNG before the DataLoader's first batch draws its seed when ignore_data_skip is set; the
    # trainer restores it after that batch instead, as transformers does when it skips batches)
    make = lambda out, reward: trainer(out, reward, sampler=PromptSampler(40, 2, group_size=4, retest_every=2,
                                                                          seed=5), max_steps=6,
                                       save_strategy="steps", save_steps=3)
    whole = tiny.CompletionReward()
    first = make(tmp_path / "a", whole)
    first.train()
    assert (tmp_path / "a" / "checkpoint-3" / "prompt_sampler.npz").is_file()
    resumed_reward = tiny.CompletionReward()
    resumed = make(tmp_path / "b", resumed_reward)
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-3"))
    assert len(whole.calls) == 6 and len({c for call in whole.completions for c in call}) > 4  # varied samples
    assert resumed_reward.completions == whole.completions[3:]
    assert resumed_reward.calls == whole.calls[3:]
    assert state_digest(resumed.prompt_sampler.state_dict()) == state_digest(first.prompt_sampler.state_dict())
    assert resumed.args.ignore_data_skip


def test_a_checkpoint_from_another_trainer_is_refused(tmp_path):
    (tmp_path / "checkpoint-1").mkdir()
    run = trainer(tmp_path, tiny.StreamReward(group=4), max_steps=1)
    with pytest.raises(FileNotFoundError, match="prompt_sampler.npz is missing"):
        run.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))


def test_feedback_reward_picks_one_function_and_graded_rewards_need_a_graded_rule(tmp_path):
    def correct(completions, **kwargs):
        return [float(c.startswith("1")) for c in completions]

    def length(completions, **kwargs):
        return [0.1 * len(c) for c in completions]

    run = trainer(tmp_path / "a", [correct, length], feedback_reward="correct", max_steps=2)
    run.train()
    assert run.prompt_sampler.stats()["feedback_calls"] == 2
    run = trainer(tmp_path / "b", [correct, length], max_steps=1)  # the sum is graded: Learnability refuses it
    with pytest.raises(ValueError, match=r"the prompt sampler refused the rewards of the weighted sum of reward_funcs "
                                         r"\['correct', 'length'\]: rewards must be 0 or 1 for Learnability"):
        run.train()
    assert run.prompt_sampler.stats()["feedback_calls"] == 0 and run.prompt_sampler.stats()["measured"] == 0
    graded = PromptSampler(40, 2, rule=RewardSpread(), group_size=4, seed=0)
    run = trainer(tmp_path / "c", [correct, length], sampler=graded, max_steps=1)
    run.train()
    assert graded.stats()["groups"] == 2


def test_a_reward_function_returning_none_or_nan_is_named(tmp_path):
    def sometimes_none(completions, **kwargs):
        return [None if j == 3 else 1.0 for j in range(len(completions))]

    def nan(completions, **kwargs):
        return [float("nan")] * len(completions)

    run = trainer(tmp_path / "a", sometimes_none, max_steps=1)
    with pytest.raises(ValueError, match=r"reward_funcs\[0\] \('sometimes_none'\) returned nan \(None is read as "
                                         r"nan\) for completion 3 of this generation batch"):
        run.train()
    assert run.prompt_sampler.stats()["feedback_calls"] == 0
    run = trainer(tmp_path / "b", [lambda completions, **kw: [1.0] * len(completions), nan], max_steps=1)
    with pytest.raises(ValueError, match=r"reward_funcs\[1\] \('nan'\) returned nan .* feedback_reward=<name>"):
        run.train()


def test_bad_trainer_arguments_are_named(tmp_path):
    reward = tiny.StreamReward(group=4)
    with pytest.raises(ValueError, match=r"prompt_sampler.batch_size is 3 but a generation batch holds 2 prompts "
                                         r"\(generation_batch_size 8 // num_generations 4\)"):
        trainer(tmp_path, reward, sampler=PromptSampler(40, 3, group_size=4))
    with pytest.raises(ValueError, match="prompt_sampler.num_prompts is 30 but train_dataset has 40 rows"):
        trainer(tmp_path, reward, sampler=PromptSampler(30, 2, group_size=4))
    with pytest.raises(ValueError, match="group_size is 2 but num_generations=4"):
        trainer(tmp_path, reward, sampler=PromptSampler(40, 2, group_size=2))
    with pytest.raises(TypeError, match="prompt_sampler must be a PromptSampler, got dict"):
        trainer(tmp_path, reward, sampler={})
    with pytest.raises(ValueError, match=r"feedback_reward must be one of \('stream_reward',\), got 'correct'"):
        trainer(tmp_path, reward, feedback_reward="correct")
    with pytest.raises(ValueError, match=r"feedback_reward must be an integer in \[0, 0\] \(a position in "
                                         r"reward_funcs, whose names are \['stream_reward'\]\), got 1"):
        trainer(tmp_path, reward, feedback_reward=1)
    with pytest.raises(ValueError, match="train_dataset already has a column 'prompt_index'"):
        PrioritizedGRPOTrainer(model=tiny.model(), reward_funcs=reward, args=tiny.config(tmp_path),
                               train_dataset=tiny.prompts().add_column("prompt_index", list(range(40))),
                               processing_class=tiny.tokenizer())
    with pytest.raises(TypeError, match="train_dataset must be a datasets.Dataset"):
        PrioritizedGRPOTrainer(model=tiny.model(), reward_funcs=reward, args=tiny.config(tmp_path),
                               train_dataset=[{"prompt": "1+1="}], processing_class=tiny.tokenizer())


def test_the_docstring_example_runs():
    import doctest

    from replayloader.prompts import trl as module

    result = doctest.testmod(module)
    assert result.attempted and not result.failed


def test_positional_arguments_and_remove_unused_columns_keep_the_index(tmp_path):
    reward = tiny.StreamReward(group=4)
    run = PrioritizedGRPOTrainer(tiny.model(), reward, tiny.config(tmp_path, max_steps=2, remove_unused_columns=True),
                                 tiny.prompts(), processing_class=tiny.tokenizer())
    assert "prompt_index" in run.train_dataset.column_names
    run.train()
    assert len(reward.calls) == 2 and run.prompt_sampler.stats()["groups"] == 4

"""Bad feedback and bad options: each a ValueError that names the argument and the value, and the sampler's
state is unchanged (compared field by field with its state_dict before the call)."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from replayloader.prompts import DynamicSampling, OnlineFilter, PromptSampler, RewardSpread
from replayloader.state import InvalidState

from ..core.helpers import assert_state_equal


def drawn_sampler(**options):
    sampler = PromptSampler(20, 4, group_size=4, seed=0, **options)
    batch = sampler.next_batch()
    rewards = np.array([[1, 0, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0], [0, 1, 1, 1]], float)
    sampler.feedback(batch.indices, rewards=rewards)
    return sampler, sampler.next_batch().indices


def never_drawn(sampler):
    return int(np.flatnonzero(sampler.last_drawn < 0)[0])


NAN = np.ones((4, 4))
NAN[1, 2] = np.nan

CASES = {
    "rows do not match the prompts": (lambda s, ids: (ids, np.ones((3, 4))), {},
                                      r"rewards must have one row per prompt, shape \(4, G\) for 4 prompt_indices, "
                                      r"got \(3, 4\)"),
    "three dimensions": (lambda s, ids: (ids, np.ones((4, 4, 1))), {},
                         r"rewards must have shape \(prompts, G\) or \(completions,\), got \(4, 4, 1\)"),
    "NaN": (lambda s, ids: (ids, NAN), {}, r"rewards must be finite; rewards\[1, 2\] = nan"),
    "infinite, per completion": (lambda s, ids: (np.repeat(ids, 4), np.r_[np.zeros(15), np.inf]), {},
                                 r"rewards must be finite; rewards\[15\] = inf"),
    "never drawn": (lambda s, ids: (np.r_[ids[:3], never_drawn(s)], np.ones((4, 4))), {},
                    r"prompt_indices\[3\] = \d+ was never drawn by this sampler"),
    "out of range": (lambda s, ids: (np.r_[ids[:3], 20], np.ones((4, 4))), {},
                     r"prompt_indices must lie in \[0, 20\); prompt_indices\[3\] = 20"),
    "not integers": (lambda s, ids: (ids.astype(float), np.ones((4, 4))), {},
                     r"prompt_indices must be a non-empty 1-D integer array, got dtype float64"),
    "group size mismatch": (lambda s, ids: (ids, np.ones((4, 3))), {},
                            r"rewards has groups of 3 completions but group_size=4"),
    "completions not a multiple": (lambda s, ids: (np.repeat(ids, 4)[:14], np.ones(14)), {},
                                   r"rewards holds 14 completions, not a multiple of group_size=4"),
    "a group split across prompts": (lambda s, ids: (np.repeat(ids, 4)[[0, 1, 2, 4, *range(4, 16)]][:16],
                                                     np.ones(16)), {},
                                     r"prompt_indices must repeat each prompt group_size=4 times in a row; "
                                     r"prompt_indices\[3\] = \d+ differs from prompt_indices\[2\]"),
    "completion level, lengths differ": (lambda s, ids: (np.repeat(ids, 4), np.ones(12)), {},
                                         r"rewards must have one value per completion, shape \(16,\)"),
    "a graded reward for p(1-p)": (lambda s, ids: (ids, np.full((4, 4), 0.5)), {},
                                   r"rewards must be 0 or 1 for Learnability \(a pass rate\); rewards\[0, 0\] = 0.5"),
    "the policy step goes back": (lambda s, ids: (ids, np.ones((4, 4))), {"policy_step": 0},
                                  r"policy_step must be an integer >= 1 \(the last feedback was at policy step 1\), "
                                  r"got 0"),
    "strings": (lambda s, ids: (ids, np.array([["a"] * 4] * 4)), {}, r"rewards must be numbers, got dtype <U1"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_feedback_is_refused_and_changes_nothing(case):
    make, extra, message = CASES[case]
    sampler, ids = drawn_sampler()
    before, priorities = copy.deepcopy(sampler.state_dict()), sampler.priorities()
    indices, rewards = make(sampler, ids)
    with pytest.raises(ValueError, match=message):
        sampler.feedback(indices, rewards=rewards, **extra)
    assert_state_equal(sampler.state_dict(), before)
    np.testing.assert_array_equal(sampler.priorities(), priorities)  # the trees too


def test_a_prompt_twice_in_one_call_is_refused_and_changes_nothing():
    sampler, ids = drawn_sampler()
    before = copy.deepcopy(sampler.state_dict())
    with pytest.raises(ValueError, match=rf"prompt_indices names prompt {ids[1]} in groups 1 and 3 of this call"):
        sampler.feedback(np.r_[ids[:3], ids[1]], rewards=np.ones((4, 4)))
    flat = np.r_[np.repeat(ids[:2], 4), np.repeat(ids[0], 4)]  # G in a row, but prompt ids[0] in two runs
    with pytest.raises(ValueError, match=rf"prompt_indices names prompt {ids[0]} in groups 0 and 2"):
        sampler.feedback(flat, rewards=np.ones(12))
    assert_state_equal(sampler.state_dict(), before)


def test_feedback_given_twice_for_one_batch_counts_twice():
    # documented: feedback is not matched to draws; a second call is taken as new groups of those prompts
    sampler, ids = drawn_sampler()
    groups = sampler.groups[ids].copy()
    sampler.feedback(ids, rewards=np.ones((4, 4)))
    sampler.feedback(ids, rewards=np.ones((4, 4)))
    assert (sampler.groups[ids] == groups + 2).all() and sampler.clock == 3


def test_next_batch_with_fewer_active_prompts_than_batch_size_names_both():
    sampler = PromptSampler(4, 2, group_size=2, retire_after=1, seed=0)
    for _ in range(2):
        sampler.feedback(batch := sampler.next_batch().indices, rewards=np.ones((2, 2)))
    assert sampler.stats()["active"] == 0
    with pytest.raises(RuntimeError, match=r"next_batch needs batch_size=2 distinct active prompts but only 0 of 4 "
                                           r"are active"):
        sampler.next_batch()
    assert len(batch) == 2


def test_a_group_of_one_and_an_unknown_group_size_are_refused():
    sampler = PromptSampler(5, 2, seed=0)
    ids = sampler.next_batch().indices
    with pytest.raises(ValueError, match="at least 2 completions per group"):
        sampler.feedback(ids, rewards=np.ones((2, 1)))
    with pytest.raises(ValueError, match="the group size must be known: build the sampler with group_size=G"):
        sampler.feedback(np.repeat(ids, 2), rewards=np.ones(4))


def test_a_rule_returning_bad_signals_is_refused():
    class Broken(RewardSpread):
        def signals(self, rewards):
            return -np.ones(len(rewards))

    sampler = PromptSampler(5, 2, rule=Broken(), seed=0)
    ids = sampler.next_batch().indices
    before = copy.deepcopy(sampler.state_dict())
    with pytest.raises(ValueError, match=r"Broken.signals must return 2 finite values >= 0"):
        sampler.feedback(ids, rewards=np.ones((2, 3)))
    assert_state_equal(sampler.state_dict(), before)


@pytest.mark.parametrize("options, message", [
    ({"num_prompts": 0}, r"num_prompts must be an integer >= 1, got 0"),
    ({"batch_size": 11}, r"batch_size must be an integer in \[1, 10\] \(the prompts of a batch are distinct\)"),
    ({"prior_strength": 0.0}, r"prior_strength must be a finite number > 0.0, got 0.0"),
    ({"prior_memory": 1.0}, r"prior_memory must be < 1"),
    ({"exploration": 1.5}, r"exploration must be a finite number >= 0.0 and <= 1.0, got 1.5"),
    ({"labels": [0, 1]}, r"labels must be a 10-long 1-D integer array \(one integer per prompt\)"),
    ({"group_size": 1}, r"group_size must be None or an integer >= 2, got 1"),
    ({"rule": object()}, r"rule must be a PriorityRule"),
    ({"rule": RewardSpread}, r"rule must be a PriorityRule instance, got the class RewardSpread: pass "
                             r"rule=RewardSpread\(\)"),
    ({"retest_size": 3}, r"retest_size must be an integer in \[1, 2\] \(retests take places of a batch of "
                         r"batch_size=2\), got 3"),
])
def test_bad_options_are_refused(options, message):
    arguments = {"num_prompts": 10, "batch_size": 2, **options}
    with pytest.raises((ValueError, TypeError), match=message):
        PromptSampler(arguments.pop("num_prompts"), arguments.pop("batch_size"), **arguments)


def test_a_bad_state_is_refused_and_changes_nothing():
    sampler, _ = drawn_sampler()
    before = copy.deepcopy(sampler.state_dict())
    for change, message in (({"groups": np.full(20, -1.0)}, r"\['groups'\]\[0\] = -1.0 must be finite and >= 0"),
                            ({"last_drawn": np.full(20, 9)}, r"\['last_drawn'\] must lie in \[-1, 1\]"),
                            ({"retired": np.zeros(3, bool)}, r"\['retired'\] must have shape \(20,\)"),
                            ({"config": {**before["config"], "seed": 1}}, r"checkpoint has seed=1 but this prompt "
                                                                           r"sampler has seed=0"),
                            ({"signal_sum": np.where(before["groups"] > 0, 1e6, 0.0)},
                             r"\['signal_sum'\]\[\d+\] = 1000000.0 exceeds what 1.0 groups \(prompt sampler "
                             r"state\['groups'\]\[\d+\]\) can give: Learnability gives at most 0.333333 per group"),
                            ({"bucket_sum": np.array([5.0])}, r"\['bucket_sum'\]\[0\] = 5.0 exceeds what 0.0 "
                                                              r"groups"),
                            ({"attempts": before["attempts"] + (before["groups"] > 0)},
                             r"\['attempts'\]\[\d+\] = 5.0 must be group_size=4 x prompt sampler state\['groups'\]"
                             r"\[\d+\] = 1.0 \(a damaged state\)"),
                            ({"retired": np.ones(20, bool)}, r"\['retired'\] marks 20 prompts retired, but "
                                                             r"retire_after=None retires none"),
                            ({"counters": {**before["counters"], "retired": 2}},
                             r"\['counters'\]\['retired'\] = 2 but prompt sampler state\['retired'\] marks 0 "
                             r"prompts")):
        with pytest.raises(InvalidState, match=message):
            sampler.load_state_dict({**copy.deepcopy(before), **change})
        assert_state_equal(sampler.state_dict(), before)


def test_the_baselines_refuse_bad_feedback_and_change_nothing():
    dynamic = DynamicSampling(10, 2, group_size=2, seed=0)
    ids = dynamic.next_batch().indices
    before = copy.deepcopy(dynamic.state_dict())
    other = int(np.setdiff1d(np.arange(10), ids)[0])
    with pytest.raises(ValueError, match=rf"prompt_indices\[1\] = {other} was never drawn"):
        dynamic.feedback([ids[0], other], rewards=np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"rewards must be finite; rewards\[0, 1\] = nan"):
        dynamic.feedback(ids, rewards=np.array([[1, np.nan], [0, 1]]))
    assert_state_equal(dynamic.state_dict(), before)
    online = OnlineFilter(group_size=2)
    with pytest.raises(ValueError, match=r"prompt_indices must lie >= 0; prompt_indices\[0\] = -1"):
        online.feedback([-1], rewards=np.ones((1, 2)))
    assert online.stats()["groups"] == 0


def test_sample_when_every_prompt_is_retired_says_so_whatever_k():
    sampler = PromptSampler(4, 2, group_size=2, retire_after=1, seed=0)
    for _ in range(2):
        sampler.feedback(sampler.next_batch().indices, rewards=np.ones((2, 2)))  # solved: retired at once
    assert sampler.stats()["active"] == 0
    for k in (1, 5):
        with pytest.raises(RuntimeError, match="every prompt is retired: nothing left to draw"):
            sampler.sample(k)

"""PromptSampler against the plain-numpy reference (tests/prompts/reference.py): records, priorities and the
draw distribution, property-tested with hypothesis; exact resume; retests, retirement, staleness, O(log N) draws."""
from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replayloader.prompts import Learnability, PromptSampler, RewardSpread, Uniform

from ..core.helpers import assert_state_equal
from .reference import Reference

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def scenarios(draw):
    n = draw(st.integers(2, 20))
    labels = draw(st.none() | st.lists(st.integers(0, 3), min_size=n, max_size=n))
    options = {"prior_strength": draw(st.sampled_from([0.5, 1.0, 3.0])),
               "prior_memory": draw(st.sampled_from([0.0, 0.5, 0.9])),
               "stale_after": draw(st.none() | st.integers(1, 3)),
               "retire_after": draw(st.none() | st.integers(1, 3)),
               "exploration": draw(st.sampled_from([0.0, 0.2])),
               "labels": labels}
    retest_every = draw(st.none() | st.integers(1, 3))
    calls = draw(st.lists(st.tuples(st.integers(0, 2**31 - 1), st.none() | st.integers(0, 4)), min_size=1,
                          max_size=10))
    return n, draw(st.integers(2, 5)), draw(st.integers(1, n)), options, retest_every, calls


def rewards_for(indices: np.ndarray, group: int, n: int, seed: int) -> np.ndarray:
    """0/1 rewards with a pass rate that rises with the index: prompt 0 never solved, the last always."""
    p = indices / max(1, n - 1)
    return (np.random.default_rng(seed).random((len(indices), group)) < p[:, None]).astype(float)


def run(sampler, reference, group, batch, calls, check=None):
    drawn = []
    for seed, jump in calls:
        active = int((~sampler.retired).sum())
        if active == 0:
            break
        got = sampler.sample(min(batch, active))
        drawn.append((got.indices.tolist(), got.retest.tolist()))
        rewards = rewards_for(got.indices, group, sampler.num_prompts, seed)
        step = None if jump is None else sampler.clock + jump
        sampler.feedback(got.indices, rewards=rewards, policy_step=step)
        if reference is not None:
            reference.feedback(got.indices, rewards, step)
        if check is not None:
            check()
    return drawn


@SETTINGS
@given(scenarios())
def test_records_priorities_and_probabilities_match_the_reference(scenario):
    n, group, batch, options, retest_every, calls = scenario
    sampler = PromptSampler(n, batch, group_size=group, retest_every=retest_every, seed=1, **options)
    reference = Reference(n, **options)

    def check():
        for name in ("groups", "attempts", "successes", "signal_sum", "measured_at", "streak", "retired"):
            np.testing.assert_array_equal(getattr(sampler, name), getattr(reference, name), err_msg=name)
        np.testing.assert_allclose(sampler.priorities(), reference.priorities(), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(sampler.probabilities(), reference.probabilities(), rtol=1e-9, atol=1e-15)
        np.testing.assert_array_equal(sampler.judged(), reference.judged())

    run(sampler, reference, group, batch, calls, check)


@SETTINGS
@given(scenarios(), st.integers(0, 10))
def test_a_state_dict_round_trip_continues_the_identical_draws(scenario, cut):
    n, group, batch, options, retest_every, calls = scenario
    cut = min(cut, len(calls))

    def make():
        return PromptSampler(n, batch, group_size=group, retest_every=retest_every, seed=3, **options)

    first = make()
    run(first, None, group, batch, calls[:cut])
    saved = copy.deepcopy(first.state_dict())
    rest = run(first, None, group, batch, calls[cut:])
    resumed = make()
    resumed.load_state_dict(saved)
    assert run(resumed, None, group, batch, calls[cut:]) == rest
    assert_state_equal(resumed.state_dict(), first.state_dict())
    np.testing.assert_array_equal(resumed.priorities(), first.priorities())  # the trees, rebuilt, bit for bit


def test_a_state_of_a_rule_with_unbounded_signals_loads_without_warnings():
    """RewardSpread does not bound a group's signal (graded rewards), so the load has no bound to check the
    signal sums against, and must not compute inf x 0 for prompts never measured."""
    sampler = PromptSampler(6, 2, rule=RewardSpread(), group_size=3, seed=0)
    batch = sampler.next_batch()
    sampler.feedback(batch.indices, rewards=np.array([[0.0, 0.5, 1.0], [0.2, 0.2, 0.9]]))
    resumed = PromptSampler(6, 2, rule=RewardSpread(), group_size=3, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resumed.load_state_dict(sampler.state_dict())
    assert resumed.next_batch().indices.tolist() == sampler.next_batch().indices.tolist()


def chi_square_p(counts: np.ndarray, probabilities: np.ndarray) -> float:
    from scipy import stats

    expected = probabilities * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0  # nothing is drawn where P = 0
    return stats.chisquare(counts[keep], expected[keep]).pvalue


@pytest.mark.parametrize("labels", [None, np.arange(30) % 3])
def test_single_draws_follow_the_stated_probabilities(labels):
    sampler = PromptSampler(30, 10, group_size=4, labels=labels, exploration=0.1, retire_after=2, seed=5)
    for seed in range(6):
        batch = sampler.next_batch()
        sampler.feedback(batch.indices, rewards=rewards_for(batch.indices, 4, 30, seed))
    assert sampler.retired.any() and sampler.judged().any()
    p = sampler.probabilities()
    counts = np.bincount(np.concatenate([sampler.sample(1).indices for _ in range(20_000)]), minlength=30)
    assert chi_square_p(counts, p) > 1e-3
    assert counts[sampler.retired].sum() == 0


def test_a_batch_holds_distinct_prompts_and_each_place_follows_the_mass_that_is_left():
    sampler = PromptSampler(5, 5, exploration=0.0, prior=1.0, seed=0)
    for _ in range(50):
        assert sorted(sampler.next_batch().indices) == [0, 1, 2, 3, 4]
    sampler = PromptSampler(4, 2, group_size=2, exploration=0.0, seed=0)
    sampler.sample(4)
    sampler.feedback([0, 1, 2, 3], rewards=np.array([[1, 0], [1, 1], [1, 1], [1, 1]]))
    # priorities (0.5 + 1/6) / 2 = 1/3 for prompt 0 (m = 1, prior 1/6) and 1/12 for the others
    first, second = np.zeros(4), np.zeros(4)
    for _ in range(4000):
        drawn = sampler.sample(2).indices
        first[drawn[0]] += 1
        second[drawn[1]] += 1
    p = sampler.probabilities()
    np.testing.assert_allclose(p, [4 / 7, 1 / 7, 1 / 7, 1 / 7])
    assert chi_square_p(first, p) > 1e-3
    # the second place is drawn from what the first left: P(j second) = sum over i != j of p_i p_j / (1 - p_i)
    expected = np.array([sum(p[i] * p[j] / (1 - p[i]) for i in range(4) if i != j) for j in range(4)])
    assert chi_square_p(second, expected) > 1e-3


def test_the_unbiased_group_variance_is_p_times_one_minus_p_on_average():
    rng = np.random.default_rng(0)
    for p in (0.1, 0.5, 0.8):
        for group in (2, 4, 16):
            rewards = (rng.random((40_000, group)) < p).astype(float)
            assert abs(Learnability().signals(rewards).mean() - p * (1 - p)) < 0.005
            plug_in = rewards.mean(1) * (1 - rewards.mean(1))
            assert plug_in.mean() < p * (1 - p) * (group - 1) / group + 0.005  # low by (G-1)/G


def test_rules_on_graded_rewards_and_the_uniform_baseline():
    rewards = np.array([[0.0, 0.5, 1.0], [0.3, 0.3, 0.3]])
    np.testing.assert_allclose(RewardSpread().signals(rewards), [0.5, 0.0])
    sampler = PromptSampler(6, 2, rule=RewardSpread(), seed=0)
    batch = sampler.next_batch()
    sampler.feedback(batch.indices, rewards=rewards * 4 - 1)  # any scale, negative too
    uniform = PromptSampler(6, 2, rule=Uniform(), seed=0)
    batch = uniform.next_batch()
    uniform.feedback(batch.indices, rewards=rewards)
    np.testing.assert_array_equal(uniform.probabilities(), np.full(6, 1 / 6))


def test_judged_prompts_are_retested_oldest_first_on_schedule():
    sampler = PromptSampler(10, 3, group_size=2, retest_every=2, retest_size=2, exploration=0.0, seed=0)
    solved = np.ones((3, 2))
    batch = sampler.next_batch()  # step 0: retests due, none judged yet
    assert not batch.retest.any()
    sampler.feedback(batch.indices, rewards=solved, policy_step=1)  # all three judged at step 1
    oldest = batch.indices
    batch = sampler.next_batch()  # step 1: not a retest batch
    assert not batch.retest.any()
    sampler.feedback(batch.indices, rewards=np.zeros((3, 2)), policy_step=2)  # three more judged at step 2
    judged = np.flatnonzero(sampler.judged())
    queue = judged[np.lexsort((judged, sampler.last_tested[judged]))]  # oldest test first, lowest index among ties
    assert sampler.last_tested[queue[0]] == 1 and set(oldest) & set(queue)
    batch = sampler.next_batch()  # step 2: the two oldest judged lead the batch
    assert batch.retest.tolist() == [True, True, False]
    assert batch.indices[:2].tolist() == queue[:2].tolist()
    assert (sampler.last_tested[queue[:2]] == sampler.clock).all()  # to the back of the queue
    assert sampler.stats()["retests"] == 2


def test_retirement_after_k_solved_groups_in_a_row():
    sampler = PromptSampler(3, 3, group_size=2, retire_after=2, exploration=0.0, seed=0)
    sampler.next_batch()
    sampler.feedback([0, 1, 2], rewards=np.array([[1, 1], [1, 1], [1, 0]]))
    sampler.next_batch()
    sampler.feedback([0, 1, 2], rewards=np.array([[1, 1], [0, 1], [1, 1]]))
    assert sampler.retired.tolist() == [True, False, False] and sampler.stats()["active"] == 2
    assert sampler.probabilities()[0] == 0
    with pytest.raises(RuntimeError, match=r"next_batch needs batch_size=3 distinct active prompts but only 2 of "
                                           r"3 are active \(the others were retired after retire_after=2"):
        sampler.next_batch()
    with pytest.raises(ValueError, match=r"k must be an integer in \[1, 2\] \(2 of 3 prompts are not retired"):
        sampler.sample(3)
    assert len(sampler.sample(2)) == 2


def test_a_stale_record_decays_toward_the_prior_and_is_forgotten():
    sampler = PromptSampler(4, 4, group_size=2, stale_after=2, exploration=0.0, seed=0)
    sampler.next_batch()
    sampler.feedback([0, 1, 2, 3], rewards=np.array([[1, 1], [1, 1], [1, 1], [1, 0]]), policy_step=0)
    prior = 1 / 6
    assert sampler.priorities()[0] == pytest.approx(prior / 2)  # (0 + 1 * prior) / (1 + 1)
    for step, weight in ((1, 1.0), (2, 0.5), (5, 0.25), (6, 0.125)):
        sampler.next_batch()
        sampler.feedback([3], rewards=np.array([[1, 0]]), policy_step=step)
        assert sampler.priorities()[0] == pytest.approx(prior / (weight + 1)), step
    sampler.next_batch()
    sampler.feedback([3], rewards=np.array([[1, 0]]), policy_step=60)
    assert sampler.priorities()[0] == prior and not sampler.judged()[0]  # forgotten: an unseen prompt again


def test_bucket_priors_are_running_means_of_group_signals_not_of_pass_rates():
    labels = np.array([0, 0, 1, 1])
    sampler = PromptSampler(4, 4, group_size=2, labels=labels, prior_memory=0.0, exploration=0.0, seed=0)
    sampler.next_batch()
    # bucket 0 split between solved and unsolved: pass rate 0.5, yet no group has signal
    sampler.feedback([0, 1, 2, 3], rewards=np.array([[1, 1], [0, 0], [1, 0], [0, 1]]))
    np.testing.assert_allclose(sampler.prior_values(), [0.0, 0.5])


def test_a_million_prompts_draw_distinct_batches_and_take_their_feedback():
    """At 10^6 prompts a draw and its feedback work as at any size (their speed is in bench/bench_prompts.py, not
    in a timed test)."""
    n = 1_000_000
    sampler = PromptSampler(n, 256, group_size=8, labels=np.arange(n) % 5, stale_after=50, retest_every=4, seed=0)
    rng = np.random.default_rng(0)
    for _ in range(3):
        batch = sampler.next_batch()
        assert len(np.unique(batch.indices)) == 256 and batch.indices.max() < n
        sampler.feedback(batch.indices, rewards=(rng.random((256, 8)) < 0.5).astype(float))
    assert sampler.stats()["feedback_calls"] == 3


def test_the_docstring_examples_run():
    import doctest

    from replayloader.prompts import baselines, rules, sampler

    for module in (rules, sampler, baselines):
        result = doctest.testmod(module)
        assert result.attempted and not result.failed, module.__name__


def test_a_group_of_equal_graded_rewards_has_exactly_no_spread():
    assert RewardSpread().signals(np.full((1, 3), 0.2))[0] == 0.0

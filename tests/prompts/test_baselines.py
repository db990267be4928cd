"""The baselines: DAPO's dynamic sampling (over-sample, drop zero-variance groups, refill) and the online filter."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from replayloader.prompts import DynamicSampling, OnlineFilter
from replayloader.state import InvalidState

from ..core.helpers import assert_state_equal


def pass_rate_rewards(indices, seed, group=4):
    """Prompt i passes with probability (i mod 5) / 4: a fifth never, a fifth always."""
    p = (np.asarray(indices) % 5) / 4
    return (np.random.default_rng(seed).random((len(indices), group)) < p[:, None]).astype(float)


def test_online_filter_keeps_groups_inside_the_band():
    rewards = np.array([[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 1]], float)
    np.testing.assert_array_equal(OnlineFilter().feedback(np.arange(4), rewards=rewards), [False, False, True, True])
    band = OnlineFilter(low=0.3, high=0.8, group_size=4)
    np.testing.assert_array_equal(band.feedback(np.repeat(np.arange(4), 4), rewards=rewards.reshape(-1)),
                                  [False, False, False, True])
    assert band.stats() == {"feedback_calls": 1, "groups": 4, "kept": 1, "frac_kept": 0.25}


def fill(dynamic, seed):
    kept, rounds = [], 0
    while rounds == 0 or not dynamic.full:  # a full batch's next draw starts a new one
        batch = dynamic.next_batch()
        assert len(set(batch.indices.tolist())) == len(batch)
        keep = dynamic.feedback(batch.indices, rewards=pass_rate_rewards(batch.indices, seed + rounds))
        kept.extend(batch.indices[keep].tolist())
        rounds += 1
    return kept, rounds


def test_dynamic_sampling_refills_until_the_batch_has_only_groups_with_signal():
    dynamic = DynamicSampling(100, 16, oversample=1.5, group_size=4, seed=0)
    kept, rounds = fill(dynamic, 0)
    assert len(kept) == 16 and rounds >= 2  # two fifths of the groups have no variance: one draw is not enough
    assert dynamic.kept == 16  # DAPO's trim: the last draw's surplus groups with signal are not kept
    stats = dynamic.stats()
    assert stats["kept"] + stats["dropped"] + stats["trimmed"] == stats["groups"] and stats["trimmed"] > 0
    assert all(i % 5 not in (0, 4) for i in kept)
    assert dynamic.stats()["dropped"] > 0 and dynamic.stats()["frac_zero_variance_total"] > 0.3
    first_round = dynamic.stats()["drawn"]
    assert first_round >= 24  # ceil(16 × 1.5) in the first draw, then only what is missing
    dynamic.next_batch()  # a new training batch starts
    assert dynamic.kept == 0 and dynamic.rounds == 1 and dynamic.stats()["batches"] == 1


def test_dynamic_sampling_draws_each_prompt_once_per_pass():
    dynamic = DynamicSampling(10, 3, seed=1)
    seen = []
    for _ in range(10):
        batch = dynamic.next_batch()
        seen.extend(batch.indices.tolist())
        dynamic.feedback(batch.indices, rewards=np.tile([[0.0, 1.0]], (len(batch), 1)))
    assert sorted(seen[:9]) == sorted(set(seen[:9]))  # the first 9 draws: no repeats within the first pass
    assert dynamic.stats()["passes"] == 2


def test_max_rounds_ends_a_batch_that_cannot_be_filled():
    dynamic = DynamicSampling(20, 4, max_rounds=3, group_size=2, seed=0)
    rounds = 0
    while not dynamic.full:
        batch = dynamic.next_batch()
        dynamic.feedback(batch.indices, rewards=np.ones((len(batch), 2)))
        rounds += 1
    assert rounds == 3 and dynamic.kept == 0


def test_dynamic_sampling_resumes_exactly():
    dynamic = DynamicSampling(30, 5, oversample=2.0, group_size=4, seed=2)
    fill(dynamic, 0)
    saved = copy.deepcopy(dynamic.state_dict())
    after = [fill(dynamic, 10 * k) for k in range(1, 4)]
    resumed = DynamicSampling(30, 5, oversample=2.0, group_size=4, seed=2)
    resumed.load_state_dict(saved)
    assert [fill(resumed, 10 * k) for k in range(1, 4)] == after
    assert all(rounds >= 1 and len(kept) == 5 for kept, rounds in after)
    assert_state_equal(resumed.state_dict(), dynamic.state_dict())


def test_each_draw_gets_exactly_one_feedback_for_all_its_prompts():
    dynamic = DynamicSampling(30, 4, group_size=2, seed=0)
    with pytest.raises(ValueError, match="no draw is waiting"):
        dynamic.feedback([0], rewards=np.array([[0.0, 1.0]]))
    batch = dynamic.next_batch()
    before = copy.deepcopy(dynamic.state_dict())
    with pytest.raises(RuntimeError, match="have had no feedback yet"):
        dynamic.next_batch()
    with pytest.raises(ValueError, match="must be the 4 prompts of the last next_batch"):
        dynamic.feedback(batch.indices[:1], rewards=np.array([[0.0, 1.0]]))
    assert_state_equal(dynamic.state_dict(), before)  # refused: nothing changed
    dynamic.feedback(batch.indices[::-1], rewards=np.tile([[0.0, 1.0]], (4, 1)))  # any order
    with pytest.raises(ValueError, match="no draw is waiting"):
        dynamic.feedback(batch.indices, rewards=np.tile([[0.0, 1.0]], (4, 1)))
    assert dynamic.stats()["groups"] == dynamic.stats()["drawn"] == 4


def test_a_checkpoint_with_a_draw_waiting_resumes_it_and_the_round_settings_may_change():
    dynamic = DynamicSampling(30, 4, oversample=1.5, max_rounds=2, group_size=2, seed=3)
    batch = dynamic.next_batch()
    saved = copy.deepcopy(dynamic.state_dict())
    resumed = DynamicSampling(30, 4, oversample=3.0, max_rounds=None, group_size=2, seed=3)
    resumed.load_state_dict(saved)  # oversample and max_rounds shape the rounds to come
    assert resumed.oversample == 3.0 and resumed.max_rounds is None
    resumed.feedback(batch.indices, rewards=np.ones((len(batch), 2)))  # the waiting draw's feedback
    assert len(resumed.next_batch()) == 12  # 3.0 x the 4 groups still missing
    with pytest.raises(InvalidState, match="checkpoint has seed=3 but this dynamic sampling has seed=4"):
        DynamicSampling(30, 4, group_size=2, seed=4).load_state_dict(saved)
    damaged = {**saved, "pending": saved["pending"][:1] + 1}
    with pytest.raises(InvalidState, match="pending"):
        DynamicSampling(30, 4, group_size=2, seed=3).load_state_dict(damaged)

"""PrioritizedReplayBuffer / PrioritizedDictReplayBuffer against a plain numpy reference of proportional PER."""
from __future__ import annotations

import copy

import pytest

pytest.importorskip("stable_baselines3")

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from stable_baselines3.common.type_aliases import (
    DictReplayBufferSamples,
    ReplayBufferSamples,
)

from replayloader import LinearSchedule
from replayloader.sb3 import (
    MissingFeedbackError,
    PrioritizedDictReplayBufferSamples,
    PrioritizedReplayBufferSamples,
)

from .helpers import dict_buffer, fill, flat_buffer, snapshot

EPS = 1e-6


def reference_draw(masses: np.ndarray, uniforms: np.ndarray):
    """Stratified proportional sampling, the textbook way: draw j at mass (j + u_j) * total / K of the cumsum."""
    k, total = len(uniforms), masses.sum()
    cumulative = np.cumsum(masses)
    targets = (np.arange(k) + uniforms) * total / k
    slots = np.searchsorted(cumulative, targets, side="right")
    near_edge = np.abs(targets[:, None] - cumulative[None, :]).min(axis=1) < 1e-9 * total
    return slots, near_edge


def reference_weights(masses: np.ndarray, slots: np.ndarray, beta: float) -> np.ndarray:
    """(N P(i))^-beta divided by its largest value over the stored transitions."""
    n = np.count_nonzero(masses)
    probabilities = masses / masses.sum()
    return (n * probabilities[slots]) ** -beta / (n * probabilities[masses > 0].min()) ** -beta


@settings(max_examples=60, deadline=None)
@given(priorities=st.lists(st.floats(0, 50), min_size=1, max_size=40),
       alpha=st.sampled_from([0.0, 0.5, 0.6, 1.0]), beta=st.floats(0, 1), n_envs=st.sampled_from([1, 2, 3]),
       batch=st.integers(1, 24), seed=st.integers(0, 2**16))
def test_sampling_and_weights_match_numpy_reference(priorities, alpha, beta, n_envs, batch, seed):
    rows = -(-len(priorities) // n_envs)
    buffer = flat_buffer(64, n_envs=n_envs, alpha=alpha, beta=beta, seed=seed)
    fill(buffer, rows)
    given_ = np.zeros(rows * n_envs)
    given_[:len(priorities)] = priorities
    buffer.update_priorities(np.arange(rows * n_envs), given_)
    masses = (given_ + EPS) ** alpha
    np.testing.assert_allclose(buffer.priorities(), masses, rtol=1e-12)
    assert buffer.max_priority == pytest.approx(max(1.0, given_.max() + EPS))

    uniforms = copy.deepcopy(buffer._rng).random(batch)
    got = buffer.sample(batch)
    want, near_edge = reference_draw(masses, uniforms)
    assert np.all((got.indices == want) | near_edge)  # only a float tie at a segment edge may differ
    np.testing.assert_allclose(got.weights.numpy().ravel(), reference_weights(masses, got.indices, beta),
                               rtol=1e-5)
    assert got.weights.shape == (batch, 1) and float(got.weights.max()) <= 1.0
    # the batch holds the rows it names: reward = flat slot
    np.testing.assert_array_equal(got.rewards.numpy().ravel(), got.indices)


def test_empirical_frequencies_follow_priorities():
    buffer = flat_buffer(16, n_envs=2, alpha=0.7, beta=1.0, require_feedback=False, seed=3)
    fill(buffer, 8)
    given_ = np.linspace(0, 3, 16) ** 2
    buffer.update_priorities(np.arange(16), given_)
    draws = np.concatenate([buffer.sample(32).indices for _ in range(3000)])
    p = (given_ + EPS) ** 0.7
    p /= p.sum()
    counts = np.bincount(draws, minlength=16)
    expected = p * len(draws)
    # stratified draws have less variance than multinomial ones: the multinomial bound is conservative
    assert np.all(np.abs(counts - expected) <= 5 * np.sqrt(expected * (1 - p)) + 1)


def test_samples_extend_sb3_fields():
    assert PrioritizedReplayBufferSamples._fields[:6] == ReplayBufferSamples._fields
    assert PrioritizedDictReplayBufferSamples._fields[:6] == DictReplayBufferSamples._fields
    assert PrioritizedReplayBufferSamples._fields[6:] == ("weights", "indices")


def test_new_transitions_get_the_largest_priority_seen():
    buffer = flat_buffer(32, alpha=0.5)
    fill(buffer, 4)
    np.testing.assert_allclose(buffer.priorities(), 1.0)  # nothing seen yet: PER's 1
    buffer.update_priorities(np.array([0, 1]), np.array([8.0, 0.5]))
    fill(buffer, 2)
    np.testing.assert_allclose(buffer.priorities()[4:], (8.0 + EPS) ** 0.5)
    buffer.update_priorities(np.array([2]), np.array([0.1]))  # lower values never lower the max
    fill(buffer, 1)
    assert buffer.priorities()[6] == pytest.approx((8.0 + EPS) ** 0.5)


BAD = [
    (np.array([0, 1]), np.array([1.0, np.nan]), r"priority must be finite and >= 0, got priority\[1\] = nan"),
    (np.array([0, 1]), np.array([np.inf, 1.0]), r"priority\[0\] = inf"),
    (np.array([0, 1]), np.array([1.0, -0.5]), r"priority\[1\] = -0.5"),
    (np.array([0, 1]), np.array([1.0, 1e308]), r"priority must be <= .* got priority\[1\] = 1e\+308"),
    (np.array([0, 99]), np.array([1.0, 1.0]), r"indices must lie in \[0, 12\).*got indices\[1\] = 99"),
    (np.array([-1]), np.array([1.0]), r"indices\[0\] = -1"),
    (np.array([0, 1]), np.array([1.0]), r"priority must have the shape of indices \(2,\), got shape \(1,\)"),
    (np.array([[0, 1]]), np.array([[1.0, 1.0]]), r"indices must be a 1-D array.*shape \(1, 2\)"),
    (np.array([0.0, 1.0]), np.array([1.0, 1.0]), r"indices must be integers, got dtype float64"),
    (np.array([0]), ["x"], r"priority must be an array of numbers"),
]


@pytest.mark.parametrize("indices, priorities, message", BAD)
def test_bad_feedback_names_the_value_and_changes_nothing(indices, priorities, message):
    buffer = flat_buffer(32, n_envs=2)
    fill(buffer, 6)
    batch = buffer.sample(4)
    buffer.update_priorities(batch.indices, np.arange(4.0))
    pending = buffer.sample(4)
    before = snapshot(buffer)
    with pytest.raises(ValueError, match=message):
        buffer.update_priorities(indices, priorities)
    assert snapshot(buffer) == before
    buffer.update_priorities(pending.indices, np.ones(4))  # still usable


def test_errors_name_feedbacks_keyword_also_through_the_alias():
    buffer = flat_buffer(32, n_envs=2)
    fill(buffer, 6)
    batch = buffer.sample(2)
    with pytest.raises(ValueError, match=r"priority must be finite and >= 0, got priority\[1\] = nan"):
        buffer.feedback(batch.indices, priority=np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match=r"priority must have the shape of indices \(2,\), got shape \(1,\)"):
        buffer.feedback(batch.indices, priority=np.array([1.0]))
    with pytest.raises(ValueError, match=r"priority must be finite and >= 0, got priority\[0\] = inf"):
        buffer.update_priorities(batch.indices, np.array([np.inf, 1.0]))


@settings(max_examples=40, deadline=None)
@given(where=st.integers(0, 7), bad=st.sampled_from([np.nan, np.inf, -np.inf, -1e-9, -3.0]))
def test_any_bad_priority_anywhere_is_refused_whole(where, bad):
    buffer = flat_buffer(16)
    fill(buffer, 8)
    before = snapshot(buffer)
    values = np.arange(8.0)
    values[where] = bad
    with pytest.raises(ValueError, match=rf"priority\[{where}\]"):
        buffer.update_priorities(np.arange(8), values)
    assert snapshot(buffer) == before


def test_bad_options_are_refused_by_name():
    for kwargs, message in [({"alpha": -1}, "alpha must be"), ({"beta": 1.5}, "beta must be"),
                            ({"priority_eps": 0}, "priority_eps must be"), ({"seed": -2}, "seed must be"),
                            ({"require_feedback": "yes"}, "require_feedback must be")]:
        with pytest.raises(ValueError, match=message):
            flat_buffer(8, **kwargs)
    buffer = flat_buffer(8)
    with pytest.raises(ValueError, match="cannot sample: the buffer holds no transition"):
        buffer.sample(2)
    fill(buffer, 2)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        buffer.sample(0)
    with pytest.raises(ValueError, match="progress must be"):
        buffer.progress = 1.2
    buffer.beta = lambda progress: 2.0
    with pytest.raises(ValueError, match="beta schedule must return .* got 2.0"):
        buffer.sample(2)


def test_feedback_is_the_verb_and_update_priorities_its_alias():
    """``feedback(indices, priority=...)`` as everywhere in the library; SB3's ``update_priorities(indices,
    priorities)`` stays (SB3 and cpprb users expect it) and is the very same write."""
    verb, alias = flat_buffer(32, alpha=0.5), flat_buffer(32, alpha=0.5)
    for buffer in (verb, alias):
        fill(buffer, 8)
    verb.feedback(verb.sample(4).indices, priority=np.array([8.0, 0.5, 2.0, 1.0]))
    alias.update_priorities(alias.sample(4).indices, np.array([8.0, 0.5, 2.0, 1.0]))
    np.testing.assert_array_equal(verb.priorities(), alias.priorities())
    with pytest.raises(TypeError):
        verb.feedback(np.array([0]), np.array([1.0]))  # the signal is named


def test_beta_follows_the_schedule_of_progress():
    buffer = flat_buffer(8)  # default: LinearSchedule(0.4, 1.0, steps=1)
    assert buffer.current_beta() == pytest.approx(0.4)
    buffer.progress = 0.5
    assert buffer.current_beta() == pytest.approx(0.7)
    buffer.progress = 1.0
    assert buffer.current_beta() == pytest.approx(1.0)
    assert flat_buffer(8, beta=LinearSchedule(0.0, 0.5, steps=2)).current_beta() == 0.0


def test_missing_feedback_is_an_error_until_fed_back():
    buffer = flat_buffer(16)
    fill(buffer, 4)
    batch = buffer.sample(2)
    with pytest.raises(MissingFeedbackError, match="got no update_priorities"):
        buffer.sample(2)
    buffer.update_priorities(batch.indices, np.array([0.3, 0.2]))
    buffer.sample(2)  # fed back: fine
    relaxed = flat_buffer(16, require_feedback=False)
    fill(relaxed, 4)
    relaxed.sample(2)
    relaxed.sample(2)  # opted out: fine
    assert relaxed.priorities().tolist() == [1.0] * 4


def test_several_envs_are_separate_sampling_units():
    buffer = flat_buffer(30, n_envs=3, alpha=1.0, require_feedback=False)  # SB3: 10 rows x 3 envs
    assert buffer.tree.capacity == 30
    fill(buffer, 5)
    assert buffer.stored_slots() == 15
    keep = np.array([4, 11])  # (row 1, env 1), (row 3, env 2)
    priorities = np.zeros(15)
    priorities[keep] = 1e6
    buffer.update_priorities(np.arange(15), priorities)
    seen = np.concatenate([buffer.sample(64).indices for _ in range(20)])
    assert set(np.unique(seen)) <= set(range(15)) and np.isin(seen, keep).mean() > 0.999
    batch = buffer.sample(64)
    np.testing.assert_array_equal(batch.rewards.numpy().ravel(), batch.indices)
    np.testing.assert_array_equal(batch.observations.numpy()[:, 0], batch.indices)
    np.testing.assert_array_equal(batch.actions.numpy().ravel(), batch.indices % 3)


def test_wraparound_overwrites_slot_with_new_max_priority():
    buffer = flat_buffer(4, n_envs=2, alpha=1.0)  # 2 rows
    fill(buffer, 2)
    buffer.update_priorities(np.arange(4), np.array([0.0, 0.0, 5.0, 5.0]))
    fill(buffer, 1)  # overwrites row 0
    np.testing.assert_allclose(buffer.priorities(), [5 + EPS] * 4)
    assert buffer.full and buffer.stored_slots() == 4


def test_timeouts_are_not_terminal_when_handled():
    for handle, want in [(True, 0.0), (False, 1.0)]:
        buffer = flat_buffer(16, handle_timeout_termination=handle, require_feedback=False)
        fill(buffer, 8, done_every=2, truncated=True)
        batch = buffer.sample(16)
        done = batch.dones.numpy().ravel()
        ended = batch.indices % 2 == 1
        assert np.all(done[~ended] == 0) and np.all(done[ended] == want)
    real = flat_buffer(16, require_feedback=False)
    fill(real, 8, done_every=2, truncated=False)
    batch = real.sample(16)
    np.testing.assert_array_equal(batch.dones.numpy().ravel(), batch.indices % 2 == 1)


def test_optimize_memory_usage_never_samples_the_overwritten_row():
    buffer = flat_buffer(8, n_envs=2, optimize_memory_usage=True, handle_timeout_termination=False,
                         require_feedback=False)
    fill(buffer, 11)  # full, pos = 3: row 3's observation now holds row 2's next observation
    assert buffer.full and buffer.pos == 3
    rows = np.concatenate([buffer.sample(32).indices for _ in range(50)]) // 2
    assert set(rows) == {0, 1, 2}  # 4 rows (8 // 2 envs); row 3 excluded
    batch = buffer.sample(32)
    rows, envs = np.divmod(batch.indices, 2)
    # the next observation is read from the next row: that row's own obs, or, after the newest row (2), the
    # next obs it was given (fill's next obs = obs + 1)
    expected = np.where(rows == 2, batch.indices + 1, (rows + 1) % 4 * 2 + envs)
    np.testing.assert_array_equal(batch.next_observations.numpy()[:, 0], expected)
    buffer.update_priorities(np.array([6, 7]), np.array([9.0, 9.0]))  # row 3: skipped, stays unsampleable
    assert buffer.priorities()[6:8].tolist() == [0.0, 0.0]


def test_dict_observations():
    buffer = dict_buffer(24, n_envs=2, alpha=1.0)
    fill(buffer, 6)
    batch = buffer.sample(8)
    assert isinstance(batch, PrioritizedDictReplayBufferSamples) and set(batch.observations) == {"vec", "tag"}
    np.testing.assert_array_equal(batch.observations["vec"].numpy()[:, 0], batch.indices)
    np.testing.assert_array_equal(batch.rewards.numpy().ravel(), batch.indices)
    buffer.update_priorities(batch.indices, np.full(8, 4.0))
    assert buffer.max_priority == pytest.approx(4.0 + EPS)
    with pytest.raises(AssertionError):  # SB3 refuses optimize_memory_usage for dict observations
        dict_buffer(8, optimize_memory_usage=True, handle_timeout_termination=False)


def test_reset_clears_priorities():
    buffer = flat_buffer(8)
    fill(buffer, 4)
    batch = buffer.sample(2)
    buffer.update_priorities(batch.indices, np.array([7.0, 7.0]))
    buffer.reset()
    assert buffer.tree.total == 0 and buffer.max_priority == 1.0 and buffer.stored_slots() == 0
    fill(buffer, 1)
    assert buffer.priorities().tolist() == [1.0]

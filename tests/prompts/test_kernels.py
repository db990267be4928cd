"""`PromptSampler`'s compiled draws and feedback (replayloader/kernels/prompts.py, kernels/calendar.py) against its
former per-place form (tests/prompts/former.py): for the same seed and calls, the same batches and the same
records, counters, generator state and priorities, bit for bit, so a study run with the former form reproduces.
Property-tested with hypothesis over the options that change what a call writes (labels, staleness with clock
jumps, retests, retirement, exploration, graded rewards), with batches fed back whole, in part or not at all."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replayloader.prompts import Learnability, PromptSampler, RewardSpread, Uniform

from .former import FormerSampler

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
RULES = {"learnability": Learnability(), "reward_spread": RewardSpread(), "uniform": Uniform()}
GROUP = 4


@st.composite
def configs(draw):
    n = draw(st.integers(1, 40))
    batch = draw(st.integers(1, min(n, 8)))
    rule = draw(st.sampled_from(sorted(RULES)))
    options = {"labels": draw(st.none() | st.lists(st.integers(0, 3), min_size=n, max_size=n)),
               "prior_strength": draw(st.sampled_from([0.5, 1.0, 3.0])),
               "prior_memory": draw(st.sampled_from([0.0, 0.9])),
               "exploration": draw(st.sampled_from([0.0, 0.3, 1.0])),
               "retest_every": draw(st.none() | st.integers(1, 3)),
               "retest_size": draw(st.integers(1, batch)),
               "stale_after": draw(st.none() | st.integers(1, 4)),
               "retire_after": draw(st.none() | st.integers(1, 3)),
               "solved_reward": 1.0 if RULES[rule].binary else 0.5}
    # each call: (draw k places or a whole batch, feed back all / a part / none, clock jump or None, reward seed)
    calls = draw(st.lists(st.tuples(st.integers(0, 8), st.sampled_from(["all", "part", "none"]),
                                    st.none() | st.integers(0, 12), st.integers(0, 2**31 - 1)),
                          min_size=1, max_size=25))
    return n, batch, rule, options, calls, draw(st.integers(0, 2**32 - 1))


def rewards_for(indices: np.ndarray, n: int, binary: bool, seed: int) -> np.ndarray:
    """Rewards whose pass rate rises with the index; graded ones rounded so that some groups are all equal."""
    rng = np.random.default_rng(seed)
    p = (indices + 0.5) / n
    if binary:
        return (rng.random((len(indices), GROUP)) < p[:, None]).astype(float)
    return np.round(rng.random((len(indices), GROUP)) * p[:, None] * 2, 1)


def assert_same(sampler: PromptSampler, former: FormerSampler) -> None:
    for name in ("groups", "attempts", "successes", "signal_sum", "measured_at", "last_tested", "last_drawn",
                 "streak", "retired", "bucket_sum", "bucket_weight", "rng"):
        ours = sampler.rng_state if name == "rng" else getattr(sampler, name)
        theirs = former.rng if name == "rng" else getattr(former, name)
        assert ours.tobytes() == theirs.tobytes(), name
    assert (sampler.clock, sampler.step) == (former.clock, former.step)
    assert {k: sampler.counters[k] for k in former.counters} == former.counters
    assert sampler.priorities().tobytes() == former.priorities().tobytes()
    judged = np.isfinite(former.active.keys[former.active.leaves:former.active.leaves + former.n])
    assert (sampler.judged() == judged).all()


@SETTINGS
@given(configs())
def test_the_compiled_sampler_draws_and_records_what_the_former_one_did(config):
    n, batch, rule, options, calls, seed = config
    sampler = PromptSampler(n, batch, rule=RULES[rule], group_size=GROUP, seed=seed, **options)
    labels = None if options["labels"] is None else np.asarray(options["labels"])
    former = FormerSampler(n, batch, signals=RULES[rule].signals, prior=RULES[rule].default_prior,
                           **{**options, "labels": labels}, seed=seed)
    for places, fed, jump, reward_seed in calls:
        active = int((~sampler.retired).sum())
        if active == 0:
            break
        k = min(places or batch, active)
        got = sampler.sample(k)
        indices, retest = former.sample(k)
        assert got.indices.tolist() == indices.tolist() and got.retest.tolist() == retest.tolist()
        if fed != "none":
            idx = got.indices if fed == "all" else got.indices[: max(1, k // 2)]
            rewards = rewards_for(idx, n, RULES[rule].binary, reward_seed)
            step = None if jump is None else sampler.clock + jump
            sampler.feedback(idx, rewards=rewards, policy_step=step)
            former.feedback(idx, rewards, step)
        if reward_seed % 3 == 0:  # reading the trees between calls changes nothing
            assert_same(sampler, former)
    assert_same(sampler, former)


@SETTINGS
@given(configs())
def test_a_resumed_compiled_sampler_continues_the_former_draws(config):
    """The calendar and the trees are rebuilt from a checkpoint's records: the draws continue unchanged."""
    n, batch, rule, options, calls, seed = config
    labels = None if options["labels"] is None else np.asarray(options["labels"])
    former = FormerSampler(n, batch, signals=RULES[rule].signals, prior=RULES[rule].default_prior,
                           **{**options, "labels": labels}, seed=seed)

    def make():
        return PromptSampler(n, batch, rule=RULES[rule], group_size=GROUP, seed=seed, **options)

    sampler = make()
    for number, (places, fed, jump, reward_seed) in enumerate(calls):
        if not (~sampler.retired).any():
            break
        k = min(places or batch, int((~sampler.retired).sum()))
        got, (indices, _) = sampler.sample(k), former.sample(k)
        assert got.indices.tolist() == indices.tolist()
        rewards = rewards_for(got.indices, n, RULES[rule].binary, reward_seed)
        step = None if jump is None else sampler.clock + jump
        sampler.feedback(got.indices, rewards=rewards, policy_step=step)
        former.feedback(got.indices, rewards, step)
        if number % 3 == 1:
            resumed = make()
            resumed.load_state_dict(sampler.state_dict())
            sampler = resumed
    assert_same(sampler, former)


def test_a_long_stale_run_with_a_full_calendar_matches_the_former_draws():
    """Hundreds of calls with staleness: records halve 30 times and are forgotten, the calendar fills, drops its
    spent entries and grows, and the clock jumps by more than a staleness period, as in a long GRPO run."""
    n, batch = 2000, 8  # a prompt is drawn about every 250 calls: most records are forgotten before
    options = {"labels": np.arange(n) % 3, "stale_after": 2, "retest_every": 2, "retest_size": 2,
               "exploration": 0.1}
    sampler = PromptSampler(n, batch, group_size=GROUP, seed=7, **options)
    former = FormerSampler(n, batch, signals=Learnability().signals, prior=Learnability().default_prior, seed=7,
                           **options)
    for call in range(500):
        got, (indices, _) = sampler.next_batch(), former.sample(batch)
        assert got.indices.tolist() == indices.tolist(), call
        rewards = rewards_for(got.indices, n, True, call)
        step = sampler.clock + 7 if call % 50 == 49 else None
        sampler.feedback(got.indices, rewards=rewards, policy_step=step)
        former.feedback(got.indices, rewards, step)
    assert_same(sampler, former)


def test_changing_a_batch_s_indices_in_place_changes_nothing_the_sampler_holds():
    """A drawn batch's leaves wait for the next feedback call (kernels/prompts.py), so the sampler keeps its own
    copy of the indices: a caller that reorders or overwrites ``batch.indices`` still gets the former draws."""
    n, batch = 50, 6
    options = {"labels": np.arange(n) % 2, "stale_after": 2, "retest_every": 2}
    sampler = PromptSampler(n, batch, group_size=GROUP, seed=1, **options)
    former = FormerSampler(n, batch, signals=Learnability().signals, prior=Learnability().default_prior, seed=1,
                           **options)
    for call in range(30):
        got, (indices, _) = sampler.next_batch(), former.sample(batch)
        assert got.indices.tolist() == indices.tolist()
        fed = got.indices.copy()
        got.indices[:] = 0
        rewards = rewards_for(fed, n, True, call)
        sampler.feedback(fed, rewards=rewards)
        former.feedback(fed, rewards)
    assert_same(sampler, former)

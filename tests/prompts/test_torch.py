"""GRPOPromptSampler in one process: TRL's RepeatSampler layout (against TRL's own class), feedback once per
generation batch, the measured and bounded lag, and exact resume mid-epoch and mid-chunk."""
from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from replayloader.prompts import GRPOPromptSampler, PromptSampler  # noqa: E402
from replayloader.state import InvalidState  # noqa: E402

from ..core.helpers import assert_state_equal  # noqa: E402
from . import scenario as sc  # noqa: E402


@pytest.mark.parametrize("num_prompts, batch, generations, repeats", [(12, 2, 3, 2), (10, 3, 2, 1), (17, 4, 4, 3),
                                                                      (8, 8, 2, 2), (9, 1, 5, 4)])
def test_the_layout_is_trl_repeat_samplers(num_prompts, batch, generations, repeats):
    trl_utils = pytest.importorskip("trl.trainer.utils")
    sampler = GRPOPromptSampler(PromptSampler(num_prompts, batch, group_size=generations, seed=0),
                                num_generations=generations, repeat_count=repeats, max_lag=None)
    theirs = trl_utils.RepeatSampler(list(range(num_prompts)), mini_repeat_count=generations, batch_size=batch,
                                     repeat_count=repeats, seed=0)
    for _ in range(2):  # two epochs
        ours = list(sampler)
        assert len(ours) == len(sampler) == len(theirs)
        # the chunks we drew, in order, laid out by TRL's own sampler (unshuffled, over their positions)
        chunk = batch * generations * repeats
        order = [i for start in range(0, len(ours), chunk) for i in ours[start:start + batch * generations:generations]]
        positions = trl_utils.RepeatSampler(list(range(len(order))), mini_repeat_count=generations, batch_size=batch,
                                            repeat_count=repeats, shuffle=False)
        assert ours == [order[p] for p in positions]
        for start in range(0, len(ours), chunk):
            assert len(set(ours[start:start + chunk])) == batch  # a chunk's prompts are distinct


def test_feedback_once_per_generation_batch_moves_the_draws():
    sampler = sc.make()
    seen = sc.train(sampler, 30)
    stats = sampler.stats()
    assert stats["feedback_calls"] == 30 and stats["groups"] == 30 * sc.B
    assert stats["lag"] == 1 and stats["max_lag_seen"] == 1  # drawn one generation batch ahead of its scoring
    assert [len(batch) for batch in seen] == [sc.B * sc.G] * 30
    measured = sampler.prompts.measured_at >= 0
    priorities = sampler.prompts.priorities()
    never, half = measured & (np.arange(sc.N) % 5 == 0), measured & (np.arange(sc.N) % 5 == 2)
    assert priorities[never].max() < priorities[half].min()  # never solved: no signal, below every p = 1/2 prompt


def test_prioritized_draws_waste_fewer_groups_than_uniform_ones():
    from replayloader.prompts import Uniform

    shares = {}
    for name, rule in (("learnability", None), ("uniform", Uniform())):
        prompts = PromptSampler(sc.N, sc.B, group_size=sc.G, rule=rule, seed=0)
        sampler = GRPOPromptSampler(prompts, num_generations=sc.G)
        sc.train(sampler, 150)
        shares[name] = sampler.stats()["frac_zero_variance_total"]
    assert shares["learnability"] < shares["uniform"] - 0.1, shares


def test_a_draw_further_ahead_than_max_lag_is_refused():
    sampler = sc.make(max_lag=0)
    batches = sc.generation_batches(sampler)
    next(batches)
    with pytest.raises(RuntimeError, match=r"1 generation batches drawn before this one still await feedback "
                                           r"\(max_lag=0\)"):
        next(batches)


def run_with_checkpoint(save_at: int, total: int):
    sampler, saved = sc.make(), {}

    def save(step, ahead):
        if step == save_at:
            saved.update(state=copy.deepcopy(sampler.state_dict()), ahead=list(ahead))

    uninterrupted = sc.train(sampler, total, on_step=save)
    return sampler, uninterrupted, saved


@pytest.mark.parametrize("save_at", [0, 4, 12, 13])  # 13 chunks an epoch: 12 and 13 straddle the epoch's end
def test_a_checkpoint_resumes_the_identical_sequence(save_at):
    sampler, uninterrupted, saved = run_with_checkpoint(save_at, 20)
    resumed = sc.make()
    resumed.load_state_dict(saved["state"])
    rest = sc.train(resumed, 20 - save_at - 1, start=save_at + 1, pending=saved["ahead"])
    assert rest == uninterrupted[save_at + 1:]
    assert_state_equal(resumed.state_dict(), sampler.state_dict())


def test_a_checkpoint_inside_a_chunk_resumes_at_the_next_index():
    sampler = GRPOPromptSampler(PromptSampler(30, 3, group_size=2, seed=4), num_generations=2, repeat_count=3,
                                max_lag=None)
    whole = list(itertools.islice(itertools.chain.from_iterable(itertools.repeat(sampler, 3)), 200))
    again = GRPOPromptSampler(PromptSampler(30, 3, group_size=2, seed=4), num_generations=2, repeat_count=3,
                              max_lag=None)
    first = list(itertools.islice(iter(again), 47))  # mid-chunk (a chunk is 18 indices)
    state = copy.deepcopy(again.state_dict())
    resumed = GRPOPromptSampler(PromptSampler(30, 3, group_size=2, seed=4), num_generations=2, repeat_count=3,
                                max_lag=None)
    resumed.load_state_dict(state)
    rest = list(itertools.islice(itertools.chain(resumed, resumed, resumed), 200 - 47))
    assert first + rest == whole


@pytest.mark.parametrize("taken, unconsumed", [(47, 0), (47, 11), (47, 47 - 36), (36, 18), (54, 18), (54, 0)])
def test_indices_read_ahead_are_handed_out_again_after_a_resume(taken, unconsumed):
    # a trainer received `taken - unconsumed` indices; the DataLoader read the rest ahead and they died with it
    make = lambda: GRPOPromptSampler(PromptSampler(30, 3, group_size=2, seed=4), num_generations=2,
                                     repeat_count=3, max_lag=None)  # chunks of 18 indices
    whole = list(itertools.islice(itertools.chain.from_iterable(itertools.repeat(make(), 3)), 120))
    sampler = make()
    order = iter(sampler)
    assert [next(order) for _ in range(taken)] == whole[:taken] and sampler.yielded == taken
    state = copy.deepcopy(sampler.state_dict(unconsumed=unconsumed))
    resumed = make()
    resumed.load_state_dict(state)
    assert resumed.yielded == taken - unconsumed
    assert list(itertools.islice(itertools.chain(resumed, resumed), 120 - taken + unconsumed)) == whole[
        taken - unconsumed:]
    assert resumed.stats()["chunks_drawn"] == 120 // 18 + 1  # the chunk read ahead was not drawn again


def test_read_ahead_before_the_current_chunk_cannot_be_handed_out_again():
    sampler = GRPOPromptSampler(PromptSampler(30, 3, group_size=2, seed=4), num_generations=2, repeat_count=3,
                                max_lag=None)
    order = iter(sampler)
    for _ in range(20):  # 2 indices into the second chunk
        next(order)
    before = copy.deepcopy(sampler.state_dict())
    with pytest.raises(ValueError, match=r"unconsumed must be an integer in \[0, 2\] \(only indices of the "
                                         r"current chunk can be handed out again\), got 3"):
        sampler.state_dict(unconsumed=3)
    assert_state_equal(sampler.state_dict(), before)
    assert GRPOPromptSampler(PromptSampler(30, 3, group_size=2), num_generations=2).state_dict(unconsumed=0)
    with pytest.raises(ValueError, match=r"unconsumed must be an integer in \[0, 0\]"):
        GRPOPromptSampler(PromptSampler(30, 3, group_size=2), num_generations=2).state_dict(unconsumed=1)


def test_bad_feedback_through_the_torch_sampler_changes_nothing():
    sampler = sc.make()
    batch = next(sc.generation_batches(sampler))
    before = copy.deepcopy(sampler.state_dict())
    rewards = sc.rewards_of(np.array(batch), 0)
    rewards[5] = np.nan
    with pytest.raises(ValueError, match=r"rewards must be finite; rewards\[5\] = nan"):
        sampler.feedback(batch, rewards=rewards)
    with pytest.raises(ValueError, match=r"rewards holds 10 completions, not a multiple of group_size=4"):
        sampler.feedback(batch[:10], rewards=np.ones(10))
    assert_state_equal(sampler.state_dict(), before)
    with pytest.raises(ValueError, match=r"group_size is 4 but num_generations=3"):
        GRPOPromptSampler(sampler.prompts, num_generations=3)


def test_a_bad_state_is_refused_and_changes_nothing():
    sampler = sc.make()
    sc.train(sampler, 3)
    before = copy.deepcopy(sampler.state_dict())
    for change, message in (({"offset": 5, "batch_indices": np.zeros(0, np.int64)},
                             r"\['offset'\] is 5 but no chunk is being handed out"),
                            ({"chunk": 99}, r"\['chunk'\] must be in \[0, 13\], got 99"),
                            ({"batch_retest": np.zeros(len(before["batch_indices"]) + 1, bool)},
                             r"\['batch_retest'\] must hold one retest flag per entry of 'batch_indices'"),
                            ({"prompts": {**before["prompts"], "clock": -1}}, r"\['clock'\] must be >= 0, got -1")):
        with pytest.raises(InvalidState, match=message):
            sampler.load_state_dict({**copy.deepcopy(before), **change})
        assert_state_equal(sampler.state_dict(), before)


def test_the_docstring_example_runs():
    import doctest

    from replayloader.prompts import torch as module

    result = doctest.testmod(module)
    assert result.attempted and not result.failed

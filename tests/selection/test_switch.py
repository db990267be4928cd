"""`SelectionSwitch` against a plain-Python reference of its rule (window rates by `np.polyfit`, probes, the
trend-cancelling comparison, the stop once the median reducible loss is <= 0), exact resume mid-window (an open
uniform step included), the DDP slices, and every misuse refused with the switch unchanged."""
import copy

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

from replayloader import InvalidState
from replayloader.selection import (ReducibleLoss, SelectionSwitch, SelectiveBackprop, Selector, TopK,
                                    TrainingLoss)
from replayloader.selection.switch import window_rate

from .helpers import assert_same_state

N, POOL, K = 64, 16, 4
IL = np.linspace(0.0, 0.6, N)
OFFSETS = np.linspace(-0.3, 0.3, POOL)  # per-row spread of the reducible loss around the level
SPREAD = OFFSETS[1::POOL // K]  # a uniform step's K rows: spread over the same range


class World:
    """A learner whose reducible loss falls by ``gain[mode]`` per step; a step costs ``seconds[mode]``. Every row's
    reducible loss is the level plus a spread that depends on the row's position, so the measurements do not
    depend on which rows a uniform step drew."""

    def __init__(self, level, gain, seconds):
        self.level, self.gain, self.seconds, self.t = level, gain, seconds, 0

    def pool(self):
        indices = (np.arange(POOL) * 5 + self.t * 3) % N
        return indices, self.level + OFFSETS + IL[indices]  # training losses: reducible + irreducible

    def trained_losses(self, indices):
        return self.level + SPREAD + IL[indices]

    def advance(self, mode):
        self.level -= self.gain[mode]
        self.t += 1


def make_switch(seed=0, **options):
    return SelectionSwitch(Selector(TopK(K), ReducibleLoss(IL), seed=seed), **options)


def step(switch, world, cost):
    """One training step of the loop in the module doc; returns the mode."""
    indices, losses = world.pool()
    seconds = world.seconds["select" if switch.selecting else "uniform"] if cost == "seconds" else None
    if switch.selecting:
        chosen = switch.choose(losses, indices)
        assert len(chosen) == K
        switch.step_done(seconds=seconds)
        mode = "select"
    else:
        chosen = switch.uniform(indices)
        assert set(chosen.indices) <= set(indices) and len(set(chosen.positions)) == K
        switch.step_done(world.trained_losses(chosen.indices), seconds=seconds)
        mode = "uniform"
    world.advance(mode)
    return mode


def reference(world, steps, window, probe_every, stop_at, cost, backward_cost, margin):
    """The switch's rule written out: (modes, stopped, switches, rates of the last windows, closest comparison)."""
    preferred, stopped, switches, rates, modes, closest = "select", False, 0, [], [], np.inf
    points, below, total, spent = [], 0, 0, 0.0
    for t in range(steps):
        j = t // window
        other = "uniform" if preferred == "select" else "select"
        mode = "uniform" if stopped else (other if j % probe_every == 1 else preferred)
        modes.append(mode)
        if mode == "select":
            scores = world.level + OFFSETS  # the pool: reducible losses of all candidates
            rows_cost = POOL + (1 + backward_cost) * K
        else:
            scores = world.level + SPREAD  # the trained rows
            rows_cost = (1 + backward_cost) * K
        points.append((spent, np.maximum(scores, 0).mean()))
        if stop_at is not None:
            below += int((scores <= stop_at).sum())
            total += len(scores)
        spent += world.seconds[mode] if cost == "seconds" else rows_cost
        world.advance(mode)
        if (t + 1) % window:
            continue
        c, y = np.array(points).T
        rates.append(-np.polyfit(c, y, 1)[0] if len(set(c)) > 1 else np.nan)
        if not stopped and stop_at is not None and 2 * below >= total:
            stopped, switches, preferred = True, switches + (preferred == "select"), "uniform"
        elif not stopped and j % probe_every == 2:
            before, probe, after = rates[-3:]
            around = (before + after) / 2
            closest = min(closest, abs(probe - around - margin * abs(around)) / max(abs(around), 1e-12))
            if probe > around + margin * abs(around):
                preferred, switches = other, switches + 1
        points, below, total = [], 0, 0
    return modes, stopped, switches, rates[-3:], closest


settings_ = settings(max_examples=40, deadline=None, derandomize=True)


@settings_
@given(st.integers(2, 6), st.integers(3, 5), st.integers(10, 90), st.sampled_from(["rows", "seconds"]),
       st.sampled_from([(0.004, 0.0011), (0.011, 0.0023), (0.002, 0.004)]), st.sampled_from([None, 0.0]),
       st.sampled_from([0.0, 0.25]), st.sampled_from([0.2, 1.0]))
def test_the_modes_follow_the_reference_rule(window, probe_every, steps, cost, gains, stop_at, margin, level):
    seconds = {"select": 0.013, "uniform": 0.0051}
    gain = dict(zip(("select", "uniform"), gains))
    expected, stopped, switches, rates, closest = reference(World(level, gain, seconds), steps, window, probe_every,
                                                            stop_at, cost, 2.0, margin)
    assume(closest > 1e-6)  # a comparison within rounding of a tie could go either way
    switch = make_switch(window=window, probe_every=probe_every, stop_at=stop_at, cost=cost, margin=margin)
    world = World(level, gain, seconds)
    modes = [step(switch, world, cost) for _ in range(steps)]
    assert modes == expected
    stats = switch.stats()
    assert stats["stopped"] == stopped and stats["switches"] == switches and stats["steps"] == steps
    assert stats["selecting_fraction"] == modes.count("select") / steps
    if len(rates) == 3:
        np.testing.assert_allclose(stats["window_rates"], rates, rtol=1e-7, atol=1e-12)
    selecting = modes.count("select")
    scored, trained = selecting * POOL, steps * K
    assert stats["scored_rows"] == scored and stats["forward_rows_per_trained_row"] == scored / trained
    if cost == "seconds":
        assert stats["seconds_per_selecting_step"] == pytest.approx(0.013 if selecting else 0.0)
        assert stats["seconds_uniform"] == pytest.approx(0.0051 * (steps - selecting))


def test_uniform_pays_more_per_row_unit_so_the_switch_turns_selection_off_and_says_why():
    switch, world = make_switch(window=5, probe_every=3), World(1.0, {"select": 0.004, "uniform": 0.003}, {})
    modes = [step(switch, world, "rows") for _ in range(40)]
    assert modes[:5] == ["select"] * 5 and modes[5:10] == ["uniform"] * 5  # a probe
    # windows 3.. prefer uniform; windows 4 and 7 (j mod 3 == 1) probe selection
    assert modes[15:] == ["uniform"] * 5 + ["select"] * 5 + ["uniform"] * 10 + ["select"] * 5
    stats = switch.stats()
    assert stats["preferred"] == "uniform" and "switched to uniform" in stats["reason"] and not stats["stopped"]
    assert stats["reason"].startswith("window 1: uniform probe")


def test_selection_stops_for_good_once_the_median_reducible_loss_reaches_zero():
    switch, world = make_switch(window=4, probe_every=3), World(0.25, {"select": 0.02, "uniform": 0.001}, {})
    modes = [step(switch, world, "rows") for _ in range(60)]
    stats = switch.stats()
    assert stats["stopped"] and "passed the irreducible-loss model, selection off for good" in stats["reason"]
    stopped_at = int(stats["reason"].split(":")[0].removeprefix("window "))  # the window whose median was <= 0
    assert "select" in modes[:4 * (stopped_at + 1)] and set(modes[4 * (stopped_at + 1):]) == {"uniform"}
    assert not switch.selecting and stats["preferred"] == "uniform" and stats["switches"] == 1
    # by then the learner's reducible loss (level + spread) is <= 0 on at least half the rows
    assert np.median(world.level + OFFSETS) <= 0


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.integers(1, 58), st.booleans(), st.sampled_from(["rows", "seconds"]))
def test_a_checkpoint_mid_window_resumes_with_the_same_decisions(stop, inside_uniform_step, cost):
    options = dict(window=5, probe_every=3, cost=cost)
    gain, seconds = {"select": 0.006, "uniform": 0.002}, {"select": 0.02, "uniform": 0.004}
    whole_switch, whole_world = make_switch(**options), World(1.0, gain, seconds)
    whole = [step(whole_switch, whole_world, cost) for _ in range(60)]
    switch, world = make_switch(**options), World(1.0, gain, seconds)
    head = [step(switch, world, cost) for _ in range(stop)]
    pending = None
    if inside_uniform_step and not switch.selecting:  # checkpoint between uniform() and step_done()
        pending = switch.uniform(world.pool()[0])
    state = copy.deepcopy(switch.state_dict())
    resumed = make_switch(seed=5, **options)  # another seed: the state decides
    resumed.load_state_dict(state)
    if pending is not None:
        with pytest.raises(RuntimeError, match="a step is still open"):
            resumed.selecting
        resumed.step_done(world.trained_losses(pending.indices),
                          seconds=seconds["uniform"] if cost == "seconds" else None)
        world.advance("uniform")
        head.append("uniform")
    tail = [step(resumed, world, cost) for _ in range(60 - len(head))]
    assert head + tail == whole
    assert_same_state(resumed.state_dict(), whole_switch.state_dict())


def test_two_ranks_fed_the_same_gathered_numbers_keep_identical_switches():
    """Under DDP `DistributedScoreThenSelect` calls choose_split with every rank's slice on every rank; a uniform
    step hands each rank rows of its own slice and every rank passes the gathered losses to step_done."""
    ranks = [make_switch(window=3, probe_every=3) for _ in range(2)]
    world = World(1.0, {"select": 0.004, "uniform": 0.003}, {})
    for _ in range(30):
        indices, losses = world.pool()
        halves = [np.arange(r, POOL, 2) for r in (0, 1)]  # share_positions: rank, rank + W, ...
        assert ranks[0].selecting == ranks[1].selecting
        if ranks[0].selecting:
            for switch in ranks:
                chosen = switch.choose_split([losses[h] for h in halves], [indices[h] for h in halves])
                assert [len(c) for c in chosen] == [K // 2] * 2
            world.advance("select")
        else:
            picked = [switch.uniform(indices[h], rows=K // 2) for switch, h in zip(ranks, halves)]
            gathered = np.concatenate([p.indices for p in picked])
            assert all(set(p.indices) <= set(indices[h]) for p, h in zip(picked, halves))
            for switch in ranks:
                switch.step_done(world.trained_losses(gathered), indices=gathered)
            world.advance("uniform")
    assert_same_state(ranks[0].state_dict(), ranks[1].state_dict())
    assert ranks[0].stats()["switches"] >= 1


def test_misuse_raises_and_leaves_the_switch_unchanged():
    switch, world = make_switch(window=2, probe_every=3), World(1.0, {"select": 0.01, "uniform": 0.0}, {})
    indices, losses = world.pool()
    before = copy.deepcopy(switch.state_dict())
    for call, error, message in [
        (lambda: switch.uniform(indices), ValueError, "this step selects: score the candidates and call choose"),
        (lambda: switch.step_done(losses), ValueError, "no step is open"),
        (lambda: switch.choose(losses[:3], indices[:3]), ValueError, r"k \(n_b\) = 4 exceeds"),
        (lambda: switch.choose(np.r_[np.nan, losses[1:]], indices), ValueError, "losses must be finite"),
    ]:
        with pytest.raises(error, match=message):
            call()
        assert_same_state(switch.state_dict(), before)
    for _ in range(2):
        step(switch, world, "rows")
    assert not switch.selecting  # window 1: the uniform probe
    chosen = switch.uniform(indices)
    opened = copy.deepcopy(switch.state_dict())
    for call, error, message in [
        (lambda: switch.choose(losses, indices), ValueError, "the previous uniform step is still open"),
        (lambda: switch.uniform(indices), ValueError, "the previous uniform step is still open"),
        (lambda: switch.step_done(), ValueError, "losses are required after uniform"),
        (lambda: switch.step_done(np.ones(3)), ValueError, r"losses must have shape \(4,\), one per trained row"),
        (lambda: switch.step_done(np.r_[np.inf, 1, 1, 1]), ValueError, r"losses must be finite; losses\[0\] = inf"),
        (lambda: switch.step_done(np.ones(4), indices=np.full(4, 99)), ValueError, r"indices must lie in \[0, 64\)"),
        (lambda: switch.step_done(np.ones(4), seconds=1.0), ValueError, "seconds was given but this switch counts"),
        (lambda: switch.selecting, RuntimeError, "a step is still open"),
    ]:
        with pytest.raises(error, match=message):
            call()
        assert_same_state(switch.state_dict(), opened)
    switch.step_done(world.trained_losses(chosen.indices))
    timed = make_switch(cost="seconds")
    timed.choose(losses, indices)
    with pytest.raises(ValueError, match="seconds is required: this switch measures cost='seconds'"):
        timed.step_done()
    with pytest.raises(ValueError, match="the previous step is still open: end it with step_done.seconds"):
        timed.choose(losses, indices)
    with pytest.raises(ValueError, match="seconds must be a finite number >= 0.0, got -1"):
        timed.step_done(seconds=-1)


@pytest.mark.parametrize("build, message", [
    (lambda: make_switch(window=1), "window must be an integer >= 2, got 1"),
    (lambda: make_switch(probe_every=2), "probe_every must be an integer >= 3, got 2"),
    (lambda: make_switch(cost="time"), "cost must be 'rows' or 'seconds', got 'time'"),
    (lambda: make_switch(stop_at=float("nan")), "stop_at must be a finite number, got nan"),
    (lambda: make_switch(margin=-0.1), "margin must be a finite number >= 0.0, got -0.1"),
    (lambda: SelectionSwitch(Selector(SelectiveBackprop())), "SelectionSwitch needs a rule that picks a fixed k"),
])
def test_bad_construction_is_refused_naming_the_argument(build, message):
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize("key, value", [
    ("steps", 3), ("preferred", "maybe"), ("stopped", "no"), ("acc", np.zeros(3)), ("rates", np.full(3, np.inf)),
    ("open_mode", "x"), ("open_uniform", True), ("counters", {"steps": 0}), ("config", {"window": 3}),
    ("reason", 5), ("cum_cost", -1.0),
])
def test_a_refused_switch_state_raises_invalid_state_and_changes_nothing(key, value):
    switch, world = make_switch(window=3, probe_every=3), World(1.0, {"select": 0.01, "uniform": 0.002}, {})
    for _ in range(7):
        step(switch, world, "rows")
    state = copy.deepcopy(switch.state_dict())
    state["switch"][key] = value
    before = copy.deepcopy(switch.state_dict())
    with pytest.raises(InvalidState):
        switch.load_state_dict(state)
    assert_same_state(switch.state_dict(), before)


def test_in_a_uniform_window_a_scored_pool_gives_uniform_rows_and_counts_the_scoring():
    """Where the loop scores every pool anyway (SelectingTrainer), choose() in a uniform window draws uniform rows."""
    switch = SelectionSwitch(Selector(TopK(K), TrainingLoss(), seed=0), window=2, probe_every=3, stop_at=None)
    world = World(1.0, {"select": 0.01, "uniform": 0.0}, {})
    for _ in range(2):
        step(switch, world, "rows")
    indices, losses = world.pool()
    chosen = switch.choose(losses, indices, np.full(POOL, 0.5))
    assert len(chosen) == K and len(set(chosen.positions)) == K and chosen.weights.tolist() == [0.5] * K
    assert chosen.positions.tolist() != np.argsort(-losses, kind="stable")[:K].tolist()  # not the top rows
    assert switch.stats()["scored_rows"] == 3 * POOL and switch.stats()["selecting_steps"] == 2


def test_window_rate_is_minus_the_least_squares_slope():
    c, y = np.array([0.0, 1.0, 2.5, 4.0]), np.array([1.0, 0.9, 0.7, 0.65])
    assert window_rate(c, y) == pytest.approx(-np.polyfit(c, y, 1)[0])
    assert np.isnan(window_rate([1.0], [2.0])) and np.isnan(window_rate([1.0, 1.0], [2.0, 3.0]))

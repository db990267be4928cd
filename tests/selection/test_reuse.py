"""`ReusedPool` against plain-numpy references: the pool's top m·n_b rows handed out n_b at a time (or re-ranked
among the remaining rows each step), scoring counted once per pool, exact resume mid-pool, the per-rank slices of
DDP, and bad input refused with the pool unchanged."""
import copy

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from replayloader import InvalidState, PrioritizedSampler
from replayloader.kernels.rng import seed_state, uniforms
from replayloader.selection import (Proportional, ReducibleLoss, ReusedPool, ScoreThenSelect, SelectiveBackprop,
                                    Selector, TopK)
from replayloader.state.checks import InvalidState as SharedInvalidState

from .helpers import assert_same_state, stream_of

pools = st.lists(st.integers(0, 6), min_size=4, max_size=24).map(lambda v: np.array(v, float) / 3 - 0.5)


def reference_chunks(scores, k, m, weights):
    """TopK once over m·k, stable on ties, cut into steps of k."""
    order = sorted(range(len(scores)), key=lambda j: (-scores[j], j))[:m * k]
    return [(order[i:i + k], [weights[j] for j in order[i:i + k]]) for i in range(0, len(order), k)]


def reference_proportional(scores, k, rng, alpha, beta):
    """k draws with replacement, P ∝ max(s, 0)^alpha (uniform when none > 0), weights (P_min / P)^beta."""
    mass = np.maximum(np.asarray(scores, float), 0.0) ** alpha
    p = mass / mass.sum() if mass.sum() > 0 else np.full(len(scores), 1 / len(scores))
    cdf = np.cumsum(p)
    picks = [min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), int(np.flatnonzero(p > 0)[-1]))
             for u in uniforms(rng, k)]
    return picks, [(p[p > 0].min() / p[j]) ** beta for j in picks]


def reference_rerank(scores, k, m, weights, seed):
    """Each step the rule over the rows not handed out yet (positions mapped back), weights times the rows' own."""
    rng, remaining, steps = seed_state(seed), list(range(len(scores))), []
    for _ in range(min(m, -(-len(scores) // k))):
        picks, rule = reference_proportional([scores[j] for j in remaining], min(k, len(remaining)), rng, 1.0, 0.5)
        positions = [remaining[j] for j in picks]
        steps.append((positions, [w * weights[j] for w, j in zip(rule, positions)]))
        remaining = [j for j in remaining if j not in set(positions)]
    return steps


@settings(max_examples=60, deadline=None, derandomize=True)
@given(pools, st.integers(1, 4), st.integers(1, 4), st.booleans())
def test_top_k_hands_out_the_pools_best_m_nb_rows_n_b_at_a_time_and_reranking_gives_the_same(scores, k, m, rerank):
    m = max(1, min(m, len(scores) // k))
    weights = np.linspace(0.5, 1.0, len(scores))
    pool = ReusedPool(Selector(TopK(k), seed=0), steps=m, rerank=rerank)
    indices = np.arange(len(scores)) + 100
    got = [(s.positions.tolist(), s.weights.tolist(), s.indices.tolist())
           for s in pool.steps(pool.choose(scores, indices, weights))]
    expected = reference_chunks(scores.tolist(), k, m, weights.tolist())
    assert [(p, w) for p, w, _ in got] == expected
    assert all(i == [j + 100 for j in p] for p, _, i in got)
    stats = pool.stats()
    assert stats["scored"] == len(scores) and stats["selected"] == m * k and stats["batches"] == 1
    assert stats["forward_rows_per_trained_row"] == len(scores) / (m * k) and stats["pending_steps"] == 0


@settings(max_examples=40, deadline=None, derandomize=True)
@given(pools, st.integers(1, 3), st.integers(1, 4), st.integers(0, 5))
def test_proportional_reranked_each_step_draws_among_the_remaining_rows(scores, k, m, seed):
    m = max(1, min(m, len(scores) // k))
    weights = np.linspace(1.0, 0.5, len(scores))
    pool = ReusedPool(Selector(Proportional(k, alpha=1.0, beta=0.5), seed=seed), steps=m, rerank=True)
    got = [(s.positions.tolist(), s.weights.tolist()) for s in pool.steps(pool.choose(scores, None, weights))]
    expected = reference_rerank(scores.tolist(), k, m, weights.tolist(), seed)
    assert [p for p, _ in got] == [p for p, _ in expected]
    np.testing.assert_allclose(np.concatenate([w for _, w in got]), np.concatenate([w for _, w in expected]),
                               rtol=1e-12)


def test_proportional_without_rerank_is_one_draw_of_m_nb_rows():
    scores, weights = np.array([0.5, 2.0, 0.0, 1.0, 3.0, 0.25]), np.ones(6)
    pool = ReusedPool(Selector(Proportional(2, alpha=1.0, beta=0.5), seed=3), steps=3)
    got = [s.positions.tolist() for s in pool.steps(pool.choose(scores, None, weights))]
    picks, _ = reference_proportional(scores, 6, seed_state(3), 1.0, 0.5)
    assert got == [picks[0:2], picks[2:4], picks[4:6]]


@pytest.mark.parametrize("rerank", [False, True])
def test_the_short_last_pool_of_a_pass_hands_out_all_its_rows_n_b_per_step_the_last_step_short(rerank):
    # issue 45: 37 rows left for the pass's last pool, m = 4, n_b = 32. The documented choice: the pool hands out
    # what it holds, n_b rows per step in ceil(37 / 32) = 2 steps, the last one holding the 5 rows left; it is
    # neither refused (every shuffled pass would end in an error) nor padded with rows of another pool
    irreducible = np.linspace(0.0, 0.3, 357)
    pool = ReusedPool(Selector(TopK(32), ReducibleLoss(irreducible), seed=0), steps=4, rerank=rerank)
    select = ScoreThenSelect(PrioritizedSampler(357, 320, alpha=0.0, seed=0), pool)
    sizes, short_rows = [], []
    for number in range(2):  # the warm-up pass: 320 candidates, then the 37 left
        candidates = select.next_candidates()
        losses = stream_of(candidates.indices, number)
        steps = list(pool.steps(select.choose(candidates, losses)))
        sizes.append([len(chosen) for chosen in steps])
        if number == 1:
            scores = losses - irreducible[candidates.indices]
            short_rows = [chosen.positions.tolist() for chosen in steps]
    assert len(candidates) == 37
    assert sizes == [[32, 32, 32, 32], [32, 5]]
    order = sorted(range(37), key=lambda j: (-scores[j], j))  # TopK: best first, ties to the earlier candidate
    assert short_rows == [order[:32], order[32:]]
    assert pool.stats()["pools"] == 2 and pool.stats()["steps_handed"] == 6 and pool.stats()["selected"] == 128 + 37


def run_pools(select, pool, pools_count, start=0, first_pending=None):
    """``pools_count`` pools through `ScoreThenSelect`; per step (candidates, positions, weights)."""
    out = []
    if first_pending is not None:
        out += [(first_pending, s.positions.tolist(), s.weights.tolist()) for s in pool.steps()]
    for number in range(start, start + pools_count):
        candidates = select.next_candidates()
        losses = stream_of(candidates.indices, number)
        for chosen in pool.steps(select.choose(candidates, losses)):
            out.append((candidates.indices.tolist(), chosen.positions.tolist(), chosen.weights.tolist()))
    return out


def make_select(seed=0, rerank=True, rule=None):
    sampler = PrioritizedSampler(40, 12, alpha=1.0, beta=0.5, uniform_fraction=0.1, seed=seed)
    pool = ReusedPool(Selector(rule or Proportional(3, alpha=1.0, beta=0.5), ReducibleLoss(np.linspace(0, 0.4, 40)),
                               seed=seed), steps=3, rerank=rerank)
    return ScoreThenSelect(sampler, pool), pool


def test_through_score_then_select_each_pool_is_scored_and_refreshed_once():
    select, pool = make_select()
    refreshed = []
    original = select.sampler.feedback
    select.sampler.feedback = lambda batch, **kw: refreshed.append(len(kw["loss"])) or original(batch, **kw)
    steps = run_pools(select, pool, 6)
    # one refresh per pool, with every candidate's score; the warm-up pass's 4th pool is its short last batch of
    # 40 - 3 x 12 = 4 candidates: a pool of ceil(4 / 3) = 2 steps
    assert refreshed == [12, 12, 12, 4, 12, 12] and len(steps) == 5 * 3 + 2
    trained = sum(len(positions) for _, positions, _ in steps)
    assert pool.stats()["scored"] == 64 and pool.stats()["selected"] == trained and trained >= 5 * 9 + 4
    assert pool.stats()["forward_rows_per_trained_row"] == 64 / trained and pool.stats()["pools"] == 6


@settings(max_examples=20, deadline=None, derandomize=True)
@given(st.integers(1, 17), st.booleans())
def test_a_checkpoint_mid_pool_resumes_exactly(stop, rerank):
    whole_select, whole_pool = make_select(rerank=rerank)
    whole = run_pools(whole_select, whole_pool, 6)
    select, pool = make_select(rerank=rerank)
    head, number = [], 0
    while len(head) < stop:  # stop inside a pool: take steps one by one
        candidates = select.next_candidates()
        steps = pool.steps(select.choose(candidates, stream_of(candidates.indices, number)))
        number += 1
        for chosen in steps:
            head.append((candidates.indices.tolist(), chosen.positions.tolist(), chosen.weights.tolist()))
            if len(head) == stop:
                break
    state = copy.deepcopy(select.state_dict())
    resumed_select, resumed_pool = make_select(seed=7, rerank=rerank)  # another seed: the state decides
    resumed_select.load_state_dict(state)
    pending = resumed_pool.candidate_indices().tolist() if resumed_pool.pending_steps else None
    assert pending is None or pending == head[-1][0]  # the rows to fetch again are the pool's candidates
    tail = run_pools(resumed_select, resumed_pool, 6 - number, start=number, first_pending=pending)
    assert head + tail == whole


def test_slices_of_a_ddp_pool_compose_rank_by_rank_and_the_state_between_pools_is_world_size_free():
    """2 slices (ranks) of TopK(4): each rank's steps are a one-slice pool of TopK(2) over its own slice."""
    rng = np.random.default_rng(0)
    scores = [rng.random(8), rng.random(8)]
    split = ReusedPool(Selector(TopK(4), seed=0), steps=3)
    first = split.choose_split(scores, [np.arange(8), np.arange(8, 16)])
    per_rank = {rank: [first[rank].positions.tolist()] for rank in (0, 1)}
    for _ in range(2):
        for rank in (0, 1):  # every rank advances the shared pool state, alike
            state = copy.deepcopy(split.state_dict())
            per_rank[rank].append(split.next_step(rank=rank, world_size=2).positions.tolist())
            if rank == 0:
                split.load_state_dict(state)  # rank 1 is another process: it starts from the same state
    for rank in (0, 1):
        alone = ReusedPool(Selector(TopK(2), seed=0), steps=3)
        assert per_rank[rank] == [s.positions.tolist() for s in alone.steps(alone.choose(scores[rank]))]
    one = ReusedPool(Selector(TopK(4), seed=0), steps=3)
    for _ in one.steps(one.choose(np.concatenate(scores), np.arange(16))):
        pass
    assert split.pending_steps == one.pending_steps == 0
    assert_same_state(split.state_dict(), one.state_dict())  # between pools: nothing depends on the world size
    mid = ReusedPool(Selector(TopK(4), seed=0), steps=3)
    mid.choose_split(scores)
    with pytest.raises(ValueError, match="the pool was scored in 2 slices .ranks. but world_size is 1"):
        mid.next_step()
    with pytest.raises(ValueError, match=r"rank must be an integer in \[0, 1\], got 2"):
        mid.next_step(rank=2, world_size=2)


@pytest.mark.parametrize("build, message", [
    (lambda: ReusedPool(Selector(TopK(2)), steps=0), "steps must be an integer >= 1, got 0"),
    (lambda: ReusedPool(Selector(TopK(2)), steps=2, rerank="yes"), "rerank must be True or False"),
    (lambda: ReusedPool(Selector(SelectiveBackprop()), steps=2), "ReusedPool needs a rule that picks a fixed k"),
    (lambda: ReusedPool(TopK(2), steps=2), "selector must be a Selector, got TopK"),
    (lambda: ReusedPool(ReusedPool(Selector(TopK(2)), steps=2), steps=2), "wrappers do not nest"),
    (lambda: ScoreThenSelect(PrioritizedSampler(40, 12), ReusedPool(Selector(TopK(5)), steps=3)),
     r"steps x k \(m \* n_b\) = 3 x 5 = 15 exceeds the candidate batch size \(n_B\) = 12"),
])
def test_bad_construction_is_refused_naming_the_argument(build, message):
    with pytest.raises((ValueError, TypeError), match=message):
        build()


def test_bad_calls_raise_and_leave_the_pool_unchanged():
    pool = ReusedPool(Selector(Proportional(2), seed=0), steps=3, rerank=True)
    with pytest.raises(ValueError, match="no step is left in the pool"):
        pool.next_step()
    with pytest.raises(ValueError, match="there is no current pool"):
        pool.candidate_indices()
    first = pool.choose(np.linspace(0, 1, 8), np.arange(8))
    before = copy.deepcopy(pool.state_dict())
    for call, message in [
        (lambda: pool.choose(np.ones(8)), "the current pool still has 2 of its 3 steps"),
        (lambda: pool.choose_split([np.ones(4), np.ones(4)]), "the current pool still has 2 of its 3 steps"),
        (lambda: pool.next_step(world_size=2), "the pool was scored in 1 slices"),
        (lambda: pool.next_step(world_size=0), "world_size must be an integer >= 1, got 0"),
    ]:
        with pytest.raises(ValueError, match=message):
            call()
        assert_same_state(pool.state_dict(), before)
    assert len(first) == 2 and pool.candidate_indices().tolist() == list(range(8))
    fresh = ReusedPool(Selector(Proportional(2), seed=0), steps=3)
    with pytest.raises(ValueError, match=r"losses must be finite; losses\[1\] = nan"):
        fresh.choose(np.r_[0.0, np.nan, 1, 1, 1, 1])
    with pytest.raises(ValueError, match=r"steps x k \(m \* n_b\) = 3 x 2 = 6 exceeds the candidate batch size"):
        fresh.choose(np.ones(5))
    assert fresh.stats()["batches"] == 0 and fresh.pending_steps == 0


def corrupt(state, path, value):
    state = copy.deepcopy(state)
    node = state
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return state


@pytest.mark.parametrize("path, value", [
    (("pool", "steps"), 4), (("pool", "rerank"), False), (("pool", "handed"), 9), (("pool", "slices"), []),
    (("pool", "slices", 0, "plan"), np.array([0, 99])), (("pool", "slices", 0, "scores"), np.array([np.nan] * 8)),
    (("pool", "slices", 0, "indices"), np.arange(3)), (("pool", "counters"), {"pools": -1, "steps_handed": 0}),
    (("selector", "rng"), np.zeros(4, np.uint64)), (("version",), 2), (("pool",), KeyError),
])
def test_a_refused_pool_state_raises_invalid_state_and_changes_nothing(path, value):
    pool = ReusedPool(Selector(Proportional(2), seed=0), steps=3, rerank=True)
    pool.choose(np.linspace(0, 1, 8), np.arange(8))
    good = copy.deepcopy(pool.state_dict())
    pool.next_step()
    before = copy.deepcopy(pool.state_dict())
    with pytest.raises(SharedInvalidState):
        pool.load_state_dict(corrupt(good, path, value))
    assert_same_state(pool.state_dict(), before)
    assert InvalidState is SharedInvalidState


def test_a_plain_selector_and_a_pool_refuse_each_others_state():
    plain, pool = Selector(TopK(2), seed=0), ReusedPool(Selector(TopK(2), seed=0), steps=2)
    with pytest.raises(InvalidState, match="has no 'pool' entry"):
        pool.load_state_dict(plain.state_dict())
    with pytest.raises(InvalidState, match="has no 'rule' entry"):
        plain.load_state_dict(pool.state_dict())

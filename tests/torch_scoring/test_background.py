"""BackgroundScorer: the weights that score each pool follow the refresh schedule exactly, whatever the timing;
staleness is counted as documented; a checkpoint resumes exactly; bad input changes nothing; no thread (or
process) outlives close(), the with-block or garbage collection."""
from __future__ import annotations

import copy
import gc
import threading

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from replayloader import InvalidState, PrioritizedSampler, WorkerError
from replayloader.selection import Selector, TopK
from replayloader.torch import CandidateBatchSampler, take_rows
from replayloader.torch.scoring import BackgroundScorer
from tests.torch_scoring.common import (cross_entropy_rows, eval_scores, mlp, new_threads_after, pools, problem,
                                        running_threads, sleepy_rows, train_on_top)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # scorer and reference on one thread: equal bits


def scorer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "replayloader-scorer"]


def background_run(steps: int, refresh_every: int, *, score_fn=cross_entropy_rows, mode="thread", lookahead=1,
                   stop_at=None, scorer=None, model=None, optimizer=None, start=0, snapshots=None):
    """Train on the top 8 of each pool by the background scores, pool t+lookahead submitted before pool t is
    taken. Returns (losses per pool, snapshots[s] = the model after s steps, stats, scorer, model, optimizer)."""
    data = pools(steps + lookahead)
    model = mlp() if model is None else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5) if optimizer is None else optimizer
    snapshots = [copy.deepcopy(model)] if snapshots is None else snapshots
    own = scorer is None
    scorer = BackgroundScorer(model, score_fn, refresh_every=refresh_every, mode=mode) if own else scorer
    got = []
    try:
        if start == 0:
            for pool in data[:lookahead]:
                scorer.submit(pool)
        for t in range(start, steps if stop_at is None else stop_at):
            scorer.submit(data[t + lookahead])
            losses = scorer.result()
            got.append(losses)
            train_on_top(model, optimizer, data[t], losses)
            scorer.step(model)
            snapshots.append(copy.deepcopy(model))
        stats = scorer.stats()
    finally:
        if own and stop_at is None:
            scorer.close()
    return got, snapshots, stats, scorer, model, optimizer


def expected(snapshots, steps, refresh_every, lookahead=1):
    """Synchronous scoring of pool t with the model of step r*floor(s/r), s the steps taken when it was
    submitted (max(0, t - lookahead))."""
    data = pools(steps + lookahead)
    out = []
    for t in range(steps):
        submitted = max(0, t - lookahead)
        out.append(eval_scores(snapshots[submitted - submitted % refresh_every], data[t]))
    return out


def test_refresh_every_step_equals_synchronous_scoring_with_the_model_of_the_previous_step():
    got, snapshots, stats, *_ = background_run(8, 1)
    want = expected(snapshots, 8, 1)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert torch.equal(got[3], eval_scores(snapshots[2], pools(9)[3]))  # pool 3 trained at step 3: model of step 2
    assert stats["refreshes"] == 8 and stats["staleness_max"] == 0 and stats["score_age_max"] == 1


@pytest.mark.parametrize("refresh_every, lookahead", [(3, 1), (4, 2)])
def test_refresh_every_r_scores_with_the_copy_of_the_last_refresh(refresh_every, lookahead):
    got, snapshots, stats, *_ = background_run(10, refresh_every, lookahead=lookahead)
    want = expected(snapshots, 10, refresh_every, lookahead)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    # and not with the newest model: a pool submitted between refreshes scores differently
    data = pools(10 + lookahead)
    assert not torch.equal(got[refresh_every + lookahead], eval_scores(snapshots[refresh_every + 1],
                                                                       data[refresh_every + lookahead]))


def test_results_do_not_depend_on_the_scorers_timing():
    fast, fast_models, *_ = background_run(8, 2)
    slow, slow_models, *_ = background_run(8, 2, score_fn=sleepy_rows)  # a worker that lags by 0-4 ms a pool
    assert all(torch.equal(a, b) for a, b in zip(fast, slow))
    assert all(torch.equal(p, q) for p, q in zip(fast_models[-1].parameters(), slow_models[-1].parameters()))


def test_staleness_and_costs_are_counted_as_documented():
    steps, r = 7, 3
    _, _, stats, *_ = background_run(steps, r)
    submitted = [max(0, t - 1) for t in range(steps)]  # pool t submitted after max(0, t - 1) steps
    staleness = [s % r for s in submitted]
    age = [t - (s - s % r) for t, s in zip(range(steps), submitted)]  # pool t is taken after t steps
    assert stats["steps"] == steps and stats["refreshes"] == steps // r and stats["pools"] == steps
    assert stats["pending"] == 1 and stats["scored_rows"] == 32 * steps
    assert stats["staleness_max"] == max(staleness) and stats["staleness_last"] == staleness[-1]
    assert stats["staleness_mean"] == pytest.approx(np.mean(staleness))
    assert stats["score_age_mean"] == pytest.approx(np.mean(age)) and stats["score_age_max"] == max(age)
    assert 0 <= stats["behind"] <= steps
    for key in ("wait_s", "score_s", "load_s", "snapshot_s"):
        assert stats[key] >= 0.0
    assert stats["score_s"] > 0.0 and stats["load_s"] > 0.0


def test_a_checkpoint_with_a_pool_in_flight_resumes_exactly():
    whole, whole_models, *_ = background_run(9, 3)
    head, snapshots, _, scorer, model, optimizer = background_run(9, 3, stop_at=4)  # mid refresh period
    state = {"scorer": scorer.state_dict(), "model": copy.deepcopy(model.state_dict()),
             "optimizer": copy.deepcopy(optimizer.state_dict())}
    assert state["scorer"]["steps"] == 4 and state["scorer"]["refreshed_at"] == 3
    assert len(state["scorer"]["pending"]) == 1  # pool 4, scored with the weights of step 3
    scorer.close()
    model = mlp(seed=5)  # another start: the checkpoint decides
    model.load_state_dict(state["model"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    optimizer.load_state_dict(state["optimizer"])
    with BackgroundScorer(model, cross_entropy_rows, refresh_every=3) as resumed:  # its copy: the newest model
        resumed.load_state_dict(state["scorer"])  # ... until the checkpoint's weights of step 3 replace it
        tail, *_ = background_run(9, 3, scorer=resumed, model=model, optimizer=optimizer, start=4,
                                  snapshots=snapshots)
        assert resumed.stats()["pools"] == 9 and resumed.stats()["refreshes"] == 3
    assert all(torch.equal(a, b) for a, b in zip(head + tail, whole))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), whole_models[-1].parameters()))


def test_bad_arguments_name_themselves():
    model = mlp()
    with pytest.raises(TypeError, match="model"):
        BackgroundScorer("not a model", cross_entropy_rows)
    with pytest.raises(TypeError, match="score_fn"):
        BackgroundScorer(model, None)
    for kwargs, name in (({"refresh_every": 0}, "refresh_every"), ({"refresh_every": 1.5}, "refresh_every"),
                         ({"mode": "fiber"}, "mode"), ({"mode": "stream"}, "stream"), ({"threads": 0}, "threads"),
                         ({"device": "no-such-device"}, "device"), ({"start_timeout_s": 0}, "start_timeout_s")):
        with pytest.raises(ValueError, match=name):
            BackgroundScorer(model, cross_entropy_rows, **kwargs)
    if not torch.cuda.is_available():
        assert not scorer_threads()  # a refused construction starts nothing


def test_bad_calls_raise_and_change_nothing():
    model = mlp()
    data = pools(3)
    with BackgroundScorer(model, cross_entropy_rows, refresh_every=2) as scorer:
        with pytest.raises(RuntimeError, match="submit"):
            scorer.result()
        with pytest.raises(ValueError, match="candidates"):
            scorer.submit((torch.empty(0, 8), torch.empty(0, dtype=torch.long)))
        scorer.step(model)
        with pytest.raises(ValueError, match="model"):  # the 2nd step refreshes: the layout must match
            scorer.step(torch.nn.Linear(8, 3))
        with pytest.raises(TypeError, match="model"):
            scorer.step("model")
        assert scorer.stats()["steps"] == 1 and scorer.stats()["refreshes"] == 0
        scorer.submit(data[0])
        with pytest.raises(ValueError, match="timeout"):
            scorer.result(timeout=-1)
        assert torch.equal(scorer.result(), eval_scores(model, data[0]))  # the refused call left it pending
        before = scorer.state_dict()
        for broken, error in (({**before, "config": {"refresh_every": 3}}, "refresh_every"),
                              ({**before, "steps": 5}, "schedule"),
                              ({**before, "weights": {"0.weight": torch.zeros(2, 2)}}, "weights"),
                              ({**before, "pending": [{"losses": torch.zeros(2, 2)}]}, "pending")):
            with pytest.raises(InvalidState, match=error):
                scorer.load_state_dict(broken)
        assert scorer.stats()["steps"] == 1
        scorer.submit(data[1])
        with pytest.raises(RuntimeError, match="pending"):
            scorer.load_state_dict(before)
        assert torch.equal(scorer.result(), eval_scores(model, data[1]))


def test_a_failing_score_fn_reports_its_error_and_the_scorer_goes_on():
    model = mlp()
    bad_shape = lambda m, batch: cross_entropy_rows(m, batch)[:-1]  # noqa: E731
    data = pools(2)
    with BackgroundScorer(model, lambda m, b: bad_shape(m, b) if len(b[0]) == 32 else cross_entropy_rows(m, b)) \
            as scorer:
        scorer.submit(data[0])
        scorer.submit((data[1][0][:16], data[1][1][:16]))
        with pytest.raises(WorkerError, match=r"score_fn must return one floating-point loss per candidate, "
                                              r"shape \(32,\)"):
            scorer.result()
        assert torch.equal(scorer.result(), eval_scores(model, (data[1][0][:16], data[1][1][:16])))


def test_no_thread_outlives_close_the_with_block_or_garbage_collection():
    before = running_threads()
    model = mlp()
    data = pools(2)
    scorer = BackgroundScorer(model, sleepy_rows)
    scorer.submit(data[0])
    scorer.submit(data[1])  # in flight when closed
    assert len(scorer_threads()) == 1
    scorer.close()
    scorer.close()  # idempotent
    assert not new_threads_after(before) and scorer.closed
    with pytest.raises(RuntimeError, match="closed"):
        scorer.submit(data[0])
    with BackgroundScorer(model, cross_entropy_rows) as scorer:
        scorer.submit(data[0])
    assert not new_threads_after(before)
    scorer = BackgroundScorer(model, sleepy_rows)
    scorer.submit(data[0])
    del scorer
    gc.collect()
    assert not new_threads_after(before)


def test_a_worker_that_fails_to_start_raises_and_leaves_no_thread(monkeypatch):
    before = running_threads()
    real = torch.set_num_threads

    def refuse_on_the_worker(count):
        if threading.current_thread().name == "replayloader-scorer":
            raise RuntimeError("no threads for you")
        real(count)

    monkeypatch.setattr(torch, "set_num_threads", refuse_on_the_worker)
    with pytest.raises(WorkerError, match="failed to start(.|\n)*no threads for you"):
        BackgroundScorer(mlp(), cross_entropy_rows, threads=1)
    assert not new_threads_after(before)


def test_the_scorer_thread_runs_its_own_torch_threads_and_leaves_the_trainers_alone():
    torch.set_num_threads(2)  # the trainer's (one_torch_thread restores its own setting afterwards)
    seen = []

    def score(model, batch):
        seen.append(torch.get_num_threads())
        return cross_entropy_rows(model, batch)

    with BackgroundScorer(mlp(), score, threads=1) as scorer:
        scorer.submit(pools(1)[0])
        scorer.result()
        assert torch.get_num_threads() == 2 and seen == [1]
        later = []
        thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        thread.start()
        thread.join()
        assert later == [2]  # threads started later get the trainer's default, not the scorer's
    torch.set_num_threads(1)


def test_a_plain_loop_with_candidate_batches_and_top_k_matches_scoring_with_the_same_stale_weights():
    """DataLoader workers fetch pool t+1 while the scorer scores it and the trainer trains on pool t's top 8: the
    selections and the final weights equal a synchronous loop that scores each pool with the model of the step
    before the one that trains on it."""
    x, y = problem(n=256)

    def run(background: bool):
        model = mlp()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        sampler = PrioritizedSampler(256, batch_size=32, alpha=0.0, seed=0)
        batches = CandidateBatchSampler(sampler, Selector(TopK(8), seed=0))
        loader = DataLoader(TensorDataset(x, y), batch_sampler=batches, num_workers=2)
        chosen_indices, previous = [], copy.deepcopy(model)
        scorer = BackgroundScorer(model, cross_entropy_rows, refresh_every=1) if background else None
        try:
            stream = iter(loader)
            pool, info = next(stream), batches.next_batch_info()
            if background:
                scorer.submit(pool)
            for _ in range(7):  # one shuffled pass is 8 pools
                following = next(stream)
                following_info = batches.next_batch_info()
                if background:
                    scorer.submit(following)
                    losses = scorer.result()
                else:
                    losses = eval_scores(previous, pool)  # the model before the last step
                    previous = copy.deepcopy(model)
                chosen = batches.choose(info, losses)
                chosen_indices.append(chosen.indices.tolist())
                xs, ys = take_rows(pool, chosen.positions)
                loss = cross_entropy_rows(model, (xs, ys)).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if background:
                    scorer.step(model)
                pool, info = following, following_info
            stats = scorer.stats() if background else None
        finally:
            if background:
                scorer.close()
        return chosen_indices, model, stats

    background, model, stats = run(True)
    synchronous, reference, _ = run(False)
    assert background == synchronous and len(background) == 7
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), reference.parameters()))
    assert stats["pools"] == 7 and stats["score_age_max"] == 1


def test_process_mode_gives_the_thread_modes_scores_and_leaves_nothing_running():
    import multiprocessing

    before = running_threads()
    threaded, _, thread_stats, *_ = background_run(5, 2)
    in_process, _, process_stats, *_ = background_run(5, 2, mode="process")
    assert all(torch.equal(a, b) for a, b in zip(threaded, in_process))
    for key in ("refreshes", "pools", "staleness_mean", "score_age_mean", "scored_rows"):
        assert thread_stats[key] == process_stats[key]
    assert not new_threads_after(before) and not multiprocessing.active_children()
    with pytest.raises(ValueError, match="pickle"):
        BackgroundScorer(mlp(), lambda m, b: cross_entropy_rows(m, b), mode="process")


def test_a_killed_worker_process_is_reported_and_cleaned_up():
    import multiprocessing

    before = running_threads()
    scorer = BackgroundScorer(mlp(), sleepy_rows, mode="process")
    scorer.submit(pools(1)[0])
    scorer._handles.worker.kill()  # as the OOM killer would
    with pytest.raises(WorkerError, match="died"):
        scorer.result()
    with pytest.raises(WorkerError, match="broken"):
        scorer.submit(pools(1)[0])
    scorer.close()
    assert not new_threads_after(before) and not multiprocessing.active_children()

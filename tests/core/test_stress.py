"""Threads against one buffer: 4 producer threads and a learner, about 10^5 buffer calls.

Checks that every inserted example is stored or counted as evicted, none is stored twice, every stored row is
the one its id was given for, stale feedback is counted exactly, and the buffer invariants hold; then the same
under a rate limiter, whose achieved samples-per-insert must stay within its tolerance.
"""
import threading

import numpy as np

from replayloader import ReplayBuffer
from replayloader.buffer.locked import LockedBuffer
from replayloader.loader.rate_limiter import RateLimiter
from replayloader.strategies import by_name

from .invariants import check_buffer_invariants

PRODUCERS, ADDS, BATCH, K, CAPACITY = 4, 10000, 4, 8, 512


def run(limiter=None, samples=30000):
    shared = LockedBuffer(ReplayBuffer(CAPACITY, alpha=0.7, beta=0.5, strategy=by_name("loss_diff"), seed=0))
    issued = [dict() for _ in range(PRODUCERS)]  # per producer: id -> tag of the row it was given for
    errors, stale_expected = [], [0]

    def produce(p):
        try:
            for j in range(ADDS):
                tags = (p * ADDS + j) * BATCH + np.arange(BATCH)
                if limiter is not None:
                    limiter.acquire_insert(BATCH)
                ids = shared.add({"tag": tags.astype(np.int64), "v": np.ones((BATCH, 3), np.float32)})
                issued[p].update(zip(ids.tolist(), tags.tolist()))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def learn():
        try:
            rng = np.random.default_rng(1)
            pending = []
            for i in range(samples):
                if limiter is not None and not limiter.acquire_sample(K):
                    break
                s = shared.sample(K)
                pending.append(s.ids)
                if len(pending) > 3:  # feedback lags a few samples, so producers evict some meanwhile
                    ids = pending.pop(0)
                    with shared.lock:
                        buf = shared.buffer
                        expect = int((buf.slot_serial[ids % CAPACITY] != ids // CAPACITY).sum())
                        before = buf.counters["stale_feedback"]
                        shared.feedback(ids, loss=rng.random(K))
                        assert buf.counters["stale_feedback"] - before == expect
                        stale_expected[0] += expect
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(PRODUCERS)]
    threads.append(threading.Thread(target=learn))
    if limiter is None:  # the learner needs something to sample from
        shared.add({"tag": np.array([-1], np.int64), "v": np.ones((1, 3), np.float32)})
    for t in threads:
        t.start()
    for i, t in enumerate(threads):
        if i == PRODUCERS and limiter is not None:
            limiter.finish_inserts()
        t.join(120)
    assert not errors, errors
    buf = shared.buffer
    check_buffer_invariants(buf)
    all_issued = {k: v for d in issued for k, v in d.items()}
    assert len(all_issued) == PRODUCERS * ADDS * BATCH  # no id given twice
    live = np.arange(len(buf))
    ids = buf.slot_serial[live] * CAPACITY + live
    tags = buf.storage.fields["tag"][live]
    known = tags >= 0
    assert all(all_issued[i] == t for i, t in zip(ids[known].tolist(), tags[known].tolist())), "torn rows"
    assert len(np.unique(tags)) == len(tags)
    assert buf.counters["added"] - buf.counters["evicted"] == len(buf) == CAPACITY
    assert buf.counters["stale_feedback"] == stale_expected[0] > 0
    return buf


def test_four_producers_and_a_learner_keep_the_buffer_consistent():
    buf = run()
    assert buf.counters["sample_calls"] == 30000  # with 40,000 adds and ~30,000 updates: ~1e5 calls


def test_under_a_rate_limiter_the_ratio_holds():
    limiter = RateLimiter(samples_per_insert=0.5, min_size=256, error_buffer=64, timeout=60)
    run(limiter, samples=10**9)
    s = limiter.stats()
    assert s["inserts"] == PRODUCERS * ADDS * BATCH
    assert limiter.min_diff <= s["diff_min"] and s["diff_max"] <= limiter.max_diff
    achieved = s["samples"] / (s["inserts"] - 256)
    assert abs(achieved - 0.5) <= 64 / (s["inserts"] - 256) + 1e-9

"""ReplayDataLoader with background producers: batch counts, item order, errors, shutdown, checkpoints, stats."""
import gc
import multiprocessing
import threading
import time

import numpy as np
import pytest

from replayloader import ReplayBuffer, ReplayDataLoader
from replayloader.loader.rate_limiter import LimiterConfigError, RateLimiter, RateLimitTimeout
from replayloader.strategies import FIFO, MeanWeight, SetWeight, Strategy, by_name
from replayloader.loader.workers import WorkerError

from .helpers import assert_state_equal


def rows_of(item):
    """A deterministic producer: item i gives 4 examples tagged 4i .. 4i+3 (module level: picklable)."""
    return {"x": np.arange(4 * item, 4 * item + 4, dtype=np.int64)}, {"item": item}


def fails_on_item_3(item):
    if item == 3:
        raise ValueError("bad item 3")
    return rows_of(item)


def fifo_buffer(capacity=64):
    return ReplayBuffer(capacity, seed=0, strategy=Strategy(MeanWeight(), SetWeight(), FIFO()))


def our_threads():
    return [t for t in threading.enumerate() if t.name.startswith("replayloader-")]


def settle(check, seconds=5.0):
    """Wait until check() is true (threads end asynchronously after a join timeout at worst)."""
    deadline = time.monotonic() + seconds
    while not check() and time.monotonic() < deadline:
        time.sleep(0.01)
    return check()


@pytest.mark.parametrize("ratio", [2, 0.5])
def test_same_batches_and_buffer_as_without_workers(ratio):
    runs = {}
    for workers in (0, 3):
        loader = ReplayDataLoader(rows_of, fifo_buffer(), batch_size=4, replay_ratio=ratio, source=range(40),
                                  workers=workers)
        runs[workers] = (len(list(loader)), loader.buffer)
    assert runs[0][0] == runs[3][0] == 40 * ratio
    # results enter in item order, so the buffers hold the same rows in the same slots
    np.testing.assert_array_equal(runs[0][1].storage.fields["x"], runs[3][1].storage.fields["x"])
    np.testing.assert_array_equal(runs[0][1].slot_serial, runs[3][1].slot_serial)
    assert settle(lambda: not our_threads())


def test_batches_carry_latest_aux_and_fresh_mask():
    loader = ReplayDataLoader(rows_of, ReplayBuffer(256, seed=0), batch_size=8, source=range(30), workers=2)
    for batch in loader:
        latest = batch.aux["item"]
        assert batch.produced == latest + 1
        np.testing.assert_array_equal(batch.fresh, batch.data["x"] // 4 == latest)
        assert (batch.data["x"] // 4 <= latest).all()  # nothing sampled that was not yet added


def test_worker_exception_is_reraised_with_its_traceback():
    loader = ReplayDataLoader(fails_on_item_3, fifo_buffer(), batch_size=2, source=range(10), workers=2)
    with pytest.raises(WorkerError, match="bad item 3") as info:
        list(loader)
    assert "fails_on_item_3" in str(info.value)  # the worker's traceback is in the message
    assert isinstance(info.value.__cause__, ValueError)
    assert settle(lambda: not our_threads())


def test_bad_producer_output_in_a_worker_is_reraised():
    loader = ReplayDataLoader(lambda: [1, 2], fifo_buffer(), batch_size=2, steps=5, workers=1)
    with pytest.raises(WorkerError, match="producer must return a mapping"):
        list(loader)


@pytest.mark.parametrize("how", ["break", "keyboard_interrupt", "garbage_collection"])
def test_every_way_out_stops_the_workers(how):
    def slow(item):
        time.sleep(0.002)
        return rows_of(item)

    loader = ReplayDataLoader(slow, fifo_buffer(), batch_size=2, source=range(10**6), workers=3)
    if how == "break":
        for i, _ in enumerate(loader):
            if i == 5:
                break
    elif how == "keyboard_interrupt":
        with pytest.raises(KeyboardInterrupt):
            for i, _ in enumerate(loader):
                if i == 5:
                    raise KeyboardInterrupt
    else:
        batches = iter(loader)
        next(batches)
        assert our_threads()
        del batches
        gc.collect()
    assert settle(lambda: not our_threads()), our_threads()


def test_process_workers_add_in_order_reraise_and_leave_no_process():
    loader = ReplayDataLoader(fails_on_item_3, fifo_buffer(), batch_size=4, source=range(10), workers=2,
                              worker_kind="process")
    seen = []
    with pytest.raises(WorkerError, match="ValueError: bad item 3"):
        for batch in loader:
            seen.append(batch.aux["item"])
    assert len(seen) == 3 and seen == sorted(seen) and set(seen) <= {0, 1, 2}  # items before the failure count
    np.testing.assert_array_equal(loader.buffer.storage.fields["x"][:12], np.arange(12))
    assert settle(lambda: not multiprocessing.active_children())


def test_checkpoint_mid_pass_resumes_at_the_last_added_batch():
    def run(checkpoint_at=None, state=None):
        loader = ReplayDataLoader(rows_of, fifo_buffer(32), batch_size=4, source=range(50), workers=3)
        if state is not None:
            loader.load_state_dict(state)
        saved, count = None, 0
        for i, batch in enumerate(loader):
            count += 1
            if i == checkpoint_at:
                saved = loader.state_dict()
                # consistent: the snapshot holds exactly the batches added before it, in order
                buf = saved["buffer"]
                assert buf["next_serial"] == 4 * saved["step"] == 4 * saved["consumed"]
        return loader, saved, count

    full, saved, _ = run(checkpoint_at=10)
    resumed, _, count = run(state=saved)
    # every item after the checkpoint was produced again and added in order: same final buffer
    np.testing.assert_array_equal(resumed.buffer.storage.fields["x"], full.buffer.storage.fields["x"])
    np.testing.assert_array_equal(resumed.buffer.slot_serial, full.buffer.slot_serial)
    assert 11 + count == 50  # replay_ratio 1: one batch per produced batch over the two halves


def test_rate_limiter_holds_the_ratio_and_stats_add_up():
    limiter = RateLimiter(samples_per_insert=2.0, min_size=16, error_buffer=16, timeout=10)
    loader = ReplayDataLoader(rows_of, ReplayBuffer(64, seed=0, strategy=by_name("loss_diff")), batch_size=4,
                              source=range(200), workers=2, rate_limiter=limiter)
    for batch in loader:
        loader.feedback(batch, loss=np.random.default_rng(0).random(4))
    s = limiter.stats()
    assert s["inserts"] == 800
    assert limiter.min_diff <= s["diff_min"] and s["diff_max"] <= limiter.max_diff
    assert abs(s["samples"] - 2.0 * (s["inserts"] - 16)) <= 16 + 4
    stats = loader.stats()
    assert stats["inserted"] == 800 and stats["sampled"] == s["samples"]
    assert stats["inserts_per_s"] > 0 and stats["samples_per_s"] > 0
    assert stats["learner_wait_s"] >= 0 and stats["producer_wait_s"] >= 0


def test_a_stalled_producer_times_out_clearly():
    def stuck():
        time.sleep(1)
        return rows_of(0)

    loader = ReplayDataLoader(stuck, fifo_buffer(), batch_size=2, steps=3, workers=1, timeout=0.3)
    with pytest.raises(RateLimitTimeout, match=r"the learner waited 0.3 s to sample 1 batch: inserts=0, "
                                               r"samples=-?0 \(batches\)"):
        list(loader)


def test_timeout_bounds_the_wait_while_a_producer_call_still_runs():
    release = threading.Event()

    def hangs_on_item_2(item):
        if item == 2:
            release.wait(60)
        return rows_of(item)

    warm = fifo_buffer()  # kernels loaded before the clock starts
    warm.add(rows_of(0)[0]), warm.sample(2)
    loader = ReplayDataLoader(hangs_on_item_2, fifo_buffer(), batch_size=2, source=range(5), workers=1,
                              timeout=0.5)
    received = []
    began = time.monotonic()
    try:
        with pytest.raises(RateLimitTimeout, match="the learner waited 0.5 s"):
            for batch in loader:
                received.append(batch)
        waited = time.monotonic() - began
    finally:
        release.set()  # let the worker thread finish its call and exit
    assert len(received) == 2  # one per batch produced before item 2
    assert waited < 3.0  # 0.5 s, plus scheduling on a loaded machine; the call itself would take 60 s
    assert settle(lambda: not our_threads())


def test_bad_worker_arguments():
    buf = fifo_buffer()
    with pytest.raises(ValueError, match="workers"):
        ReplayDataLoader(rows_of, buf, batch_size=2, steps=1, workers=-1)
    with pytest.raises(ValueError, match="worker_kind"):
        ReplayDataLoader(rows_of, buf, batch_size=2, steps=1, workers=1, worker_kind="fiber")
    with pytest.raises(ValueError, match="window"):
        ReplayDataLoader(rows_of, buf, batch_size=2, steps=1, workers=1, window=0)


@pytest.mark.parametrize("workers", [0, 1])
def test_an_error_buffer_too_small_for_the_batch_size_is_refused_when_the_loader_is_built(workers):
    tight = RateLimiter(1.0, min_size=4, error_buffer=2.0, timeout=5)
    with pytest.raises(LimiterConfigError, match=r"error_buffer=2 is too small for inserts of 1 and samples of 4"):
        ReplayDataLoader(rows_of, fifo_buffer(), batch_size=4, source=range(5), workers=workers,
                         rate_limiter=tight)


@pytest.mark.parametrize("workers", [0, 1])
def test_an_error_buffer_too_small_for_the_produced_batches_is_refused_at_the_first_one(workers):
    tight = RateLimiter(1.0, min_size=4, error_buffer=3.0, timeout=5)  # fits 1 example per insert, not 4
    loader = ReplayDataLoader(rows_of, fifo_buffer(), batch_size=4, source=range(5), workers=workers,
                              rate_limiter=tight)
    with pytest.raises(LimiterConfigError, match=r"error_buffer=3 is too small for inserts of 4 and samples of 4"):
        list(loader)  # the error itself, not a WorkerError around it
    assert len(loader.buffer) == 0 and tight.inserts == 0


def test_a_rate_limiter_without_workers_yields_what_it_admits_as_with_workers():
    counts = {}
    for workers in (0, 1):
        limiter = RateLimiter(samples_per_insert=2.0, min_size=16, error_buffer=16, timeout=10)
        loader = ReplayDataLoader(rows_of, fifo_buffer(), batch_size=4, source=range(50), workers=workers,
                                  rate_limiter=limiter)
        counts[workers] = sum(1 for _ in loader)
        assert limiter.inserts == 200 and limiter.samples == 4 * counts[workers]
        assert limiter.min_diff <= limiter.diff < limiter.min_diff + 4  # every admissible sample was taken
    # diff ends in [min_diff, min_diff + 4): 2 * 200 - 4 * count with min_diff = 2 * 16 - 16
    assert counts[0] == counts[1] == (2 * 200 - 16) // 4


def test_state_of_an_idle_loader_equals_its_buffer_state():
    loader = ReplayDataLoader(rows_of, fifo_buffer(), batch_size=4, source=range(5), workers=2)
    list(loader)
    assert_state_equal(loader.state_dict()["buffer"], loader.buffer.state_dict())


class SeekableSource:
    """A source with state_dict / load_state_dict, like torchdata's StatefulDataLoader."""

    def __init__(self, n):
        self.n, self.position = n, 0

    def __iter__(self):
        while self.position < self.n:
            self.position += 1
            yield self.position - 1

    def __len__(self):
        return self.n

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def test_a_stateful_source_resumes_at_the_last_added_item_not_the_last_dispatched():
    source = SeekableSource(40)
    loader = ReplayDataLoader(rows_of, fifo_buffer(256), batch_size=4, source=source, workers=3, window=6)
    for i, _ in enumerate(loader):
        if i == 10:
            state = loader.state_dict()
            break
    assert state["source"]["position"] == state["step"] == state["buffer"]["next_serial"] // 4
    resumed = ReplayDataLoader(rows_of, fifo_buffer(256), batch_size=4, source=SeekableSource(40), workers=2)
    resumed.load_state_dict(state)
    batches = list(resumed)  # batches still owed at the checkpoint come first, before any new item (aux None)
    assert len(batches) + 11 == 40 and batches[-1].aux["item"] == 39
    np.testing.assert_array_equal(resumed.buffer.storage.fields["x"][:160], np.arange(160))


def test_feedback_for_examples_evicted_by_a_worker_meanwhile_is_ignored_and_counted():
    buffer = ReplayBuffer(16, seed=0, strategy=by_name("loss_diff"))
    loader = ReplayDataLoader(rows_of, buffer, batch_size=8, source=range(300), workers=2)
    expected, held = 0, []
    for batch in loader:
        held.append(batch)
        if len(held) > 2:  # feedback two batches late: workers have evicted some of these examples since
            late = held.pop(0)
            with loader.lock:
                evicted = buffer.slot_serial[late.ids % 16] != late.ids // 16
                expected += int(evicted.sum())
                changed = loader.feedback(late, loss=np.ones(8))
                assert changed <= len(np.unique(late.ids[~evicted]))
    assert buffer.counters["stale_feedback"] == expected > 0


def test_without_a_limiter_producers_stay_within_the_window_of_the_loop():
    loader = ReplayDataLoader(rows_of, fifo_buffer(), batch_size=2, source=range(60), workers=2, window=3)
    for taken, batch in enumerate(loader, 1):
        time.sleep(0.002)  # a slow training step: producers would otherwise race ahead
        assert loader.step - taken <= 3 + 1  # the learner's credit never exceeds window + 1 batches
    assert taken == 60


def test_queue_size_is_the_old_name_of_window_and_still_works_with_a_warning():
    """One name for batches in flight across both loaders (issue 33): 0.1's queue_size= is served for a release."""
    with pytest.warns(DeprecationWarning, match=r"queue_size=\.\.\.\) is now window="):
        loader = ReplayDataLoader(rows_of, fifo_buffer(), batch_size=2, source=range(4), workers=1, queue_size=5)
    assert loader.window == 5
    with pytest.raises(ValueError, match="give window= only"):
        ReplayDataLoader(rows_of, fifo_buffer(), batch_size=2, source=range(4), workers=1, queue_size=5, window=5)

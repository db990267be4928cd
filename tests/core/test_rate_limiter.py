"""RateLimiter: Reverb's admission rules, blocking with a clear timeout, shutdown, checkpoints."""
import threading

import pytest

from replayloader.loader.rate_limiter import LimiterClosed, RateLimiter, RateLimitTimeout


def test_min_size_then_ratio_within_the_error_buffer():
    lim = RateLimiter(samples_per_insert=2.0, min_size=3, error_buffer=4.0, timeout=1)
    assert not lim.can_sample(1)  # nothing before min_size inserts
    for _ in range(3):
        assert lim.can_insert(1)
        lim.acquire_insert(1)
    # diff = 3 * 2 - 0 = 6 = offset; inserts may run ahead until diff reaches offset + 4
    assert lim.can_insert(2) and not lim.can_insert(3)
    # samples may run ahead until diff falls to offset - 4
    assert lim.can_sample(4) and not lim.can_sample(5)
    lim.acquire_sample(4)
    assert lim.stats()["samples"] == 4 and lim.diff == 2.0


def test_the_side_ahead_times_out_with_a_clear_error():
    lim = RateLimiter(1.0, min_size=2, error_buffer=1.0, timeout=0.05)
    with pytest.raises(RateLimitTimeout, match=r"the learner waited 0.05 s to sample 1 .*inserts=0, samples=0"):
        lim.acquire_sample(1)
    lim.acquire_insert(2)
    lim.acquire_insert(1)
    with pytest.raises(RateLimitTimeout, match="a producer waited"):
        lim.acquire_insert(1)
    assert lim.inserts == 3  # a refused insert counts nothing


def test_a_blocked_learner_is_released_by_an_insert_and_by_finish_or_close():
    lim = RateLimiter(1.0, min_size=1, error_buffer=2.0, timeout=5)
    results = []
    waiter = threading.Thread(target=lambda: results.append(lim.acquire_sample(1)))
    waiter.start()
    lim.acquire_insert(1)
    waiter.join(5)
    assert results == [True]
    lim.acquire_sample(1)  # diff now 1 - 2 = -1 = min_diff: the next sample must wait
    waiter = threading.Thread(target=lambda: results.append(lim.acquire_sample(1)))
    waiter.start()
    lim.finish_inserts()
    waiter.join(5)
    assert results == [True, False]  # producers done: a refused sample ends instead of waiting
    lim.reopen()

    def wait_closed():
        with pytest.raises(LimiterClosed):
            lim.acquire_sample(1)
        results.append("closed")

    waiter = threading.Thread(target=wait_closed)
    waiter.start()
    lim.close()
    waiter.join(5)
    assert results[-1] == "closed"


def test_progress_check_and_bad_arguments():
    lim = RateLimiter(2.0, min_size=1, error_buffer=5.0)
    lim.check_progress(2, 6)  # 2 * 2 + 6 = 10 = 2 * 5
    with pytest.raises(ValueError, match="error_buffer=5 is too small.*use error_buffer >= 5.5"):
        lim.check_progress(2, 7)
    for kwargs, name in [({"samples_per_insert": 0}, "samples_per_insert"), ({"min_size": 0}, "min_size"),
                         ({"error_buffer": 0}, "error_buffer"), ({"timeout": float("inf")}, "timeout"),
                         ({"samples_per_insert": float("nan")}, "samples_per_insert")]:
        args = {"samples_per_insert": 1.0, **kwargs}
        with pytest.raises(ValueError, match=name):
            RateLimiter(**args)


def test_state_round_trip():
    lim = RateLimiter(1.0, min_size=1, error_buffer=3.0)
    lim.acquire_insert(3)
    lim.acquire_sample(2)
    other = RateLimiter(1.0, min_size=1, error_buffer=3.0)
    other.load_state_dict(lim.state_dict())
    assert (other.inserts, other.samples, other.diff) == (3, 2, 1.0)

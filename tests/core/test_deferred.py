"""Deferred feedback gives the synchronous path's results exactly; only where an invalid value is reported moves."""
from __future__ import annotations

import numpy as np
import pytest

from replayloader import ReplayBuffer, ReplayDataLoader
from replayloader.loader.deferred import DeferredFeedback
from replayloader.strategies import by_name

from .helpers import assert_state_equal


def _run(strategy: str, defer: bool, steps: int = 30, workers: int = 0):
    rng = np.random.default_rng(0)

    def producer():
        return {"x": rng.normal(size=(8, 3))}

    buffer = ReplayBuffer(64, alpha=0.8, beta=0.5, strategy=by_name(strategy), seed=3)
    loader = ReplayDataLoader(producer, buffer, batch_size=8, steps=steps, defer_feedback=defer, workers=workers)
    key = "weight" if strategy == "per" else "loss"
    seen = []
    for batch in loader:
        seen.append((batch.ids.copy(), batch.probabilities.copy(), batch.weights.copy()))
        values = np.abs(batch.data["x"]).sum(axis=1)  # a deterministic function of the example
        loader.feedback(batch, **{key: values})
    return seen, loader.state_dict()


@pytest.mark.parametrize("strategy", ["loss_diff", "per", "loss"])
def test_deferred_feedback_gives_the_synchronous_stream_and_state(strategy):
    sync_seen, sync_state = _run(strategy, defer=False)
    deferred_seen, deferred_state = _run(strategy, defer=True)
    assert len(sync_seen) == len(deferred_seen) == 30
    for a, b in zip(sync_seen, deferred_seen):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    assert_state_equal(sync_state, deferred_state)  # state_dict flushes the last step's feedback first


def test_an_invalid_value_is_reported_at_the_next_flush_naming_the_keyword():
    buffer = ReplayBuffer(32, seed=0)
    loader = ReplayDataLoader(lambda: {"x": np.zeros((4, 1))}, buffer, batch_size=4, steps=5, defer_feedback=True)
    batches = iter(loader)
    batch = next(batches)
    assert loader.feedback(batch, loss=np.array([1.0, np.nan, 1.0, 1.0])) == 0  # accepted for now
    with pytest.raises(ValueError, match="loss"):
        next(batches)


def test_push_snapshots_tensors_and_checks_ids():
    torch = pytest.importorskip("torch")
    buffer = ReplayBuffer(16, strategy=by_name("loss"), seed=0)
    ids = buffer.add({"x": np.zeros((8, 1))})
    deferred = DeferredFeedback(buffer.feedback)
    loss = torch.full((8,), 2.0)
    deferred.push(torch.as_tensor(ids), loss=loss)
    loss.fill_(5.0)  # the caller reuses its tensor before the flush
    assert len(deferred) == 1 and deferred.flush() == 8
    np.testing.assert_array_equal(buffer.weights[:8], 2.0)
    with pytest.raises(ValueError, match="ids"):
        deferred.push(np.zeros((2, 2), np.int64), loss=np.ones(4))
    with pytest.raises(TypeError, match="keyword"):
        deferred.push(ids)


def test_a_refused_call_keeps_the_earlier_ones_applied():
    buffer = ReplayBuffer(16, strategy=by_name("loss"), seed=0)
    ids = buffer.add({"x": np.zeros((8, 1))})
    deferred = DeferredFeedback(buffer.feedback)
    deferred.push(ids[:4], loss=np.full(4, 3.0))
    deferred.push(ids[4:], loss=np.full(4, -1.0))
    with pytest.raises(ValueError, match="loss"):
        deferred.flush()
    np.testing.assert_array_equal(buffer.weights[:4], 3.0)
    assert len(deferred) == 0


def test_the_host_transfer_guard_counts_blocking_copies_only():
    torch = pytest.importorskip("torch")
    from replayloader.loader.host_sync import count_host_transfers

    t = torch.arange(4.0)
    with count_host_transfers() as counts:
        t.sum().item()
        float(t[0])
        t.tolist()
        t.cpu()
        t.to("cpu")  # already on the host: no move, not counted
        t.to(torch.float64)  # not a move to the host
    assert dict(counts) == {"item": 1, "__float__": 1, "tolist": 1, "cpu": 1}
    assert "item" not in vars(torch.Tensor)  # the patches are gone
    with count_host_transfers(device_type="cuda") as counts:
        t.sum().item()  # a CPU tensor: not watched
    assert not counts


def test_feedback_costs_host_copies_unless_deferred():
    torch = pytest.importorskip("torch")
    from replayloader.loader.host_sync import count_host_transfers

    def run(defer):
        buffer = ReplayBuffer(32, strategy=by_name("loss"), seed=0)
        loader = ReplayDataLoader(lambda: {"x": torch.zeros(4, 1)}, buffer, batch_size=4, steps=6,
                                  defer_feedback=defer)
        with count_host_transfers() as counts:
            for batch in loader:
                loader.feedback(batch, loss=torch.ones(4))
            loader.flush_feedback()
        return sum(counts.values())

    assert run(defer=False) >= 6  # at least one blocking copy per step's feedback
    assert run(defer=True) == 0


def test_a_move_to_the_host_waits_unless_non_blocking_is_set_in_any_signature():
    torch = pytest.importorskip("torch")
    from replayloader.loader.host_sync import _to_host

    assert _to_host(("cpu",), {}) and _to_host(("cpu", torch.float32, False, True), {})  # copy=True still waits
    assert not _to_host(("cpu",), {"non_blocking": True})
    assert not _to_host(("cpu", torch.float32, True), {})  # to(device, dtype, non_blocking)
    assert not _to_host((torch.zeros(1), True), {})  # to(other, non_blocking)

"""Invariants every ReplayBuffer must satisfy between calls, whatever happened before (shared by the fuzz and
stress tests)."""
import numpy as np


def check_buffer_invariants(buf) -> None:
    size, cap = len(buf), buf.capacity
    serial = buf.slot_serial
    counters = buf.counters
    assert 0 <= size <= cap
    assert size == counters["added"] - counters["evicted"], "an example is neither stored nor counted as evicted"
    assert (serial[:size] >= 0).all() and (serial[size:] == -1).all()
    assert len(np.unique(serial[:size])) == size, "an example is stored twice"
    assert (serial[:size] < buf.next_serial).all() and buf.next_serial == counters["added"]
    assert (buf.weights[:size] >= 0).all() and np.isfinite(buf.weights[:size]).all()
    live = buf.weights[:size]
    alpha = buf.alpha
    expected = np.where(live > 0, live ** alpha if alpha else 1.0, 0.0) if alpha != 1.0 else live
    leaves = buf.tree.get(np.arange(cap))
    assert np.allclose(leaves[:size], expected, rtol=1e-12, atol=0), (leaves[:size], expected)
    assert not leaves[size:].any(), "an empty slot has mass in the tree"
    assert np.isclose(buf.tree.total, expected.sum(), rtol=1e-9, atol=1e-300), (buf.tree.total, expected.sum())

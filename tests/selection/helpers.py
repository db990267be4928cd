"""What the selection tests share: exact state comparison and a deterministic loss stream."""
import numpy as np


def assert_same_state(a, b):
    """Two nested state dicts are equal (arrays compared exactly, NaN equal to NaN)."""
    assert type(a) is type(b) or (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple))), (type(a), type(b))
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same_state(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_state(x, y)
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, float) and np.isnan(a):
        assert np.isnan(b)
    else:
        assert a == b


def stream_of(indices, step):
    """A per-example loss that depends on the index and the step (deterministic, some below 0.4)."""
    return ((np.asarray(indices) * 37 + step * 11) % 101) / 101 + 0.05

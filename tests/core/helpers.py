"""Shared test helpers: deep comparison of buffer states."""
import numpy as np


def assert_state_equal(a, b, path="state"):
    """Recursively compare two state dicts (numpy arrays and tensors by value)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{path}: keys differ {set(a) ^ set(b)}"
        for k in a:
            assert_state_equal(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_state_equal(x, y, f"{path}[{i}]")
    elif hasattr(a, "shape"):
        x = a.detach().cpu().numpy() if hasattr(a, "detach") else np.asarray(a)
        y = b.detach().cpu().numpy() if hasattr(b, "detach") else np.asarray(b)
        np.testing.assert_array_equal(x, y, err_msg=path)
    else:
        assert a == b or (a != a and b != b), f"{path}: {a!r} != {b!r}"

"""One torch thread for every SB3 test: their networks are tiny, and on a shared 2-core machine torch's
default thread pool made a 600-step DQN run about 10x slower (measured: 8.7 s vs 0.6 s)."""
import pytest


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread):  # tests/conftest.py
    yield

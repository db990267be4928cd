"""One torch thread for the SB3 tests: their networks are tiny, and on a shared 2-core machine torch's
default thread pool made a 600-step DQN run about 10x slower (measured: 8.7 s vs 0.6 s)."""
import pytest


@pytest.fixture(autouse=True)
def one_torch_thread():
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

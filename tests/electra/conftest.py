"""Fixtures shared by the ELECTRA integration tests."""
import pytest


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models run much faster on one thread, above all on a busy 2-core machine."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

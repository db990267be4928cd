"""examples/ray_replay.py runs on the session's local cluster (``--no-init``: Ray is already initialised)."""
import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("ray")
torch = pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ray_replay.py"


def test_ray_example_trains_from_two_producer_actors(ray_cluster, capsys):
    spec = importlib.util.spec_from_file_location("ray_replay", EXAMPLE)
    example = importlib.util.module_from_spec(spec)  # not in sys.modules: Ray pickles its actor class by value
    spec.loader.exec_module(example)
    threads = torch.get_num_threads()
    try:
        result = example.main(["--calls", "20", "--no-init"])
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    assert ray_cluster.is_initialized()  # the example left the session's cluster alone
    assert result["inserted"] == 20 * 32 and result["buffer_size"] == 640  # every call of both actors arrived
    assert result["updates"] > 0 and "2 producer actors, 20 calls:" in printed
    assert "0 producer restarts" in printed

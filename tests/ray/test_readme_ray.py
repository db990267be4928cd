"""The docs' Ray example runs as written on the local cluster."""
import pytest

pytest.importorskip("ray")

from tests.docs_blocks import block  # noqa: E402


def test_ray_example_runs(ray_cluster, capsys):
    exec(compile(block("docs/ray.md", "# Replay across machines"), "docs Ray example", "exec"), {})
    size, inserts, restarts = capsys.readouterr().out.split()
    assert int(size) == int(inserts) == 800 and int(restarts) == 0

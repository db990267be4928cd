"""The README's Ray example runs as written on the local cluster."""
import re
from pathlib import Path

import pytest

pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[2]


def test_ray_example_runs(ray_cluster, capsys):
    text = (ROOT / "README.md").read_text()
    block = re.search(r"### Replay across machines \(Ray\).*?```python\n(.*?)```", text, re.S).group(1)
    exec(compile(block, "README Ray example", "exec"), {})
    size, inserts, restarts = capsys.readouterr().out.split()
    assert int(size) == int(inserts) == 800 and int(restarts) == 0

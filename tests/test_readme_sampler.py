"""The README's PrioritizedSampler example runs as written (2 DataLoader workers, 5 epochs of a linear model)."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_sampler_example_runs(capsys):
    pytest.importorskip("torch")
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Prioritized sampling over a fixed dataset"):]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(block, "README sampler example", "exec"), {})
    steps, epoch, never_visited = capsys.readouterr().out.split()
    assert int(steps) == 32 and int(epoch) == 5 and float(never_visited) == 0.0

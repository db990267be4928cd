"""The README's quickstart runs as written and its commands match .ci/run."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quickstart_runs(capsys):
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Quickstart\s+```python\n(.*?)```", text, re.S).group(1)
    assert len(block.strip().splitlines()) <= 16
    exec(compile(block, "README quickstart", "exec"), {})
    size, spread, visits = capsys.readouterr().out.split()
    assert int(size) == 1000 and float(spread) > 0 and float(visits) > 0


def test_background_producers_example_runs(capsys):
    text = (ROOT / "README.md").read_text()
    block = re.search(r"### Background producers.*?```python\n(.*?)```", text, re.S).group(1)
    exec(compile(block, "README background producers", "exec"), {})
    inserts, ratio, inserted = capsys.readouterr().out.split()
    assert int(inserts) == int(inserted) == 4000
    assert abs(float(ratio) - 4.0 * (4000 - 64) / 4000) <= 64 / 4000 + 1e-9  # within the error buffer


def test_stateful_producer_example_runs(capsys):
    text = (ROOT / "README.md").read_text()
    block = re.search(r"### Stateful producers.*?```python\n(.*?)```", text, re.S).group(1)
    exec(compile(block, "README stateful producers", "exec"), {})  # the block asserts the exact resume
    assert capsys.readouterr().out.strip() == "[0, 1, 3] [6, 9, 12, 15, 18]"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"Run the tests:\s+(.+)", readme).group(1).strip()
    ci = (ROOT / ".ci" / "run").read_text()
    assert command.replace("pip install ", "pip install -q ", 1) in ci


def test_custom_strategy_part_example_runs():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"Optional speed hook:.*?```python\n(.*?)```", text, re.S).group(1)
    namespace = {}
    exec(compile(block, "README custom strategy part", "exec"), namespace)  # the block asserts its results
    assert namespace["HalfLoss"]().fused_step() is None


def test_state_files_example_runs(capsys):
    text = (ROOT / "README.md").read_text()
    block = re.search(r"### State files.*?```python\n(.*?)```", text, re.S).group(1)
    exec(compile(block, "README state files", "exec"), {})  # the block asserts the buffer is unchanged
    assert "buffer state['size'] must be in [0, 64], got 1000" in capsys.readouterr().out

"""The README's quickstart and the buffer pages' examples run as written, and the README's commands match .ci/run."""
import re
from pathlib import Path

from tests.docs_blocks import block

ROOT = Path(__file__).resolve().parents[1]


def test_quickstart_runs(capsys):
    code = block("README.md", "## Quickstart")
    assert len(code.strip().splitlines()) <= 16
    exec(compile(code, "README quickstart", "exec"), {})
    size, spread, visits = capsys.readouterr().out.split()
    assert int(size) == 1000 and float(spread) > 0 and float(visits) > 0


def test_background_producers_example_runs(capsys):
    exec(compile(block("docs/loader.md", "## Background producers"), "docs background producers", "exec"), {})
    inserts, ratio, inserted = capsys.readouterr().out.split()
    assert int(inserts) == int(inserted) == 4000
    assert abs(float(ratio) - 4.0 * (4000 - 64) / 4000) <= 64 / 4000 + 1e-9  # within the error buffer


def test_stateful_producer_example_runs(capsys):
    code = block("docs/loader.md", "## Stateful producers")
    exec(compile(code, "docs stateful producers", "exec"), {})  # the block asserts the exact resume
    assert capsys.readouterr().out.strip() == "[0, 1, 3] [6, 9, 12, 15, 18]"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"Run the tests:\s+(.+)", readme).group(1).strip()
    ci = (ROOT / ".ci" / "run").read_text()
    assert command.replace("pip install ", "pip install -q ", 1) in ci


def test_custom_strategy_part_example_runs():
    namespace = {}
    code = block("docs/strategies.md", "Optional speed hook:")
    exec(compile(code, "docs custom strategy part", "exec"), namespace)  # the block asserts its results
    assert namespace["HalfLoss"]().fused_step() is None


def test_state_files_example_runs(capsys):
    code = block("docs/state.md", "# State files")
    exec(compile(code, "docs state files", "exec"), {})  # the block asserts the buffer is unchanged
    assert "buffer state['size'] must be in [0, 64], got 1000" in capsys.readouterr().out


def test_sb3_example_runs(capsys):
    import pytest

    pytest.importorskip("stable_baselines3")
    code = block("README.md", "**Stable-Baselines3**")
    assert len(code.strip().splitlines()) <= 15
    exec(compile(code, "README sb3", "exec"), {})
    size, beta, largest_weight = capsys.readouterr().out.split()
    assert int(size) == 1000 and float(beta) > 0.99  # annealed from 0.4 to 1 over learn()
    assert 0 < float(largest_weight) <= 1.0  # weights are normalised by the largest possible one

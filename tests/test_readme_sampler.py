"""The docs' PrioritizedSampler example runs as written (2 DataLoader workers, 5 epochs of a linear model)."""
import pytest

from tests.docs_blocks import block


def test_sampler_example_runs(capsys):
    pytest.importorskip("torch")
    exec(compile(block("docs/sampler.md", "# A fixed dataset"), "docs sampler example", "exec"), {})
    steps, epoch, never_visited = capsys.readouterr().out.split()
    assert int(steps) == 32 and int(epoch) == 5 and float(never_visited) == 0.0

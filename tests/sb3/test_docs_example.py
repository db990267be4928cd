"""docs/sb3.md's example runs as written: PrioritizedDQN learns on CartPole with its prioritized buffer."""
import pytest

pytest.importorskip("stable_baselines3")

from tests.docs_blocks import block  # noqa: E402


def test_the_docs_example_trains_with_priorities_fed_back(capsys):
    exec(compile(block("docs/sb3.md", "# Prioritized replay for Stable-Baselines3"), "docs sb3 example", "exec"), {})
    size, beta = capsys.readouterr().out.split()
    assert int(size) == 1000  # every environment step stored (one env)
    assert 0.4 < float(beta) <= 1.0  # annealed from 0.4 as training progressed

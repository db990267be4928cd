"""experiments/dqn_cartpole_ray.py runs end to end on the local cluster (a few hundred environment steps)."""
import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")
pytest.importorskip("gymnasium")


def test_dqn_cartpole_on_ray_runs_briefly(ray_cluster):
    from experiments import dqn_cartpole_ray

    run = dqn_cartpole_ray.main(["--env-steps", "600", "--actors", "2"])
    assert run["inserted"] == 600  # every transition of every actor reached the buffer
    assert run["updates"] > 0 and run["episodes"]

"""The MinAtar DQN experiment (experiments/minatar_*.py): exact resume, PER's priorities and importance weights
against a numpy reference, the driver's job list, the summary on synthetic records."""
import gzip
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("minatar")
torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments import minatar_driver, minatar_dqn, minatar_summary  # noqa: E402

TINY = minatar_dqn.Config(frames=900, chunk=300, replay_start=200, capacity=500, eps_frames=300, target_every=100,
                          eval_every=300, eval_episodes=2, eval_max_frames=200)


def without_clock(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("cpu_s", "wall_s")} for r in records]


@pytest.mark.parametrize("arm", ["per", "uniform"])
def test_a_run_stopped_at_a_chunk_boundary_and_resumed_equals_the_uninterrupted_one(tmp_path, arm):
    whole = minatar_dqn.train(TINY, "breakout", arm, 3, tmp_path / "whole")
    minatar_dqn.train(TINY, "breakout", arm, 3, tmp_path / "parts", max_chunks=1)
    assert not (tmp_path / "parts" / "summary.json").exists()
    assert [p.name for p in (tmp_path / "parts" / "checkpoints").iterdir()] == ["step-000000300"]
    resumed = minatar_dqn.train(TINY, "breakout", arm, 3, tmp_path / "parts")  # a new process would do the same
    assert resumed.frame == whole.frame == TINY.frames and resumed.updates == whole.updates > 0
    assert without_clock(resumed.records) == without_clock(whole.records)
    assert any(r["kind"] == "episode" for r in whole.records) and sum(r["kind"] == "eval" for r in whole.records) == 3
    for a, b in zip(resumed.q.state_dict().values(), whole.q.state_dict().values()):
        assert torch.equal(a, b)
    np.testing.assert_array_equal(resumed.buffer.weights, whole.buffer.weights)
    lines = gzip.decompress((tmp_path / "parts" / "records.jsonl.gz").read_bytes()).decode().splitlines()
    assert json.loads(lines[0])["kind"] == "run" and len(lines) == 1 + len(whole.records)


def test_per_writes_td_priorities_and_weights_the_loss_by_annealed_importance_weights():
    """One learn() on a filled buffer against a numpy reference of P(i), (P_min / P_i)^beta, the weighted Huber
    loss and the new priorities |TD| + eps."""
    cfg = minatar_dqn.Config(frames=1000, replay_start=0, capacity=64, batch=8)
    run = minatar_dqn.new_run(cfg, "breakout", "per", 0)
    rng = np.random.default_rng(0)
    for _ in range(40):
        run.step()
    run.updates = 30  # beta part-way through its annealing
    run.buffer.feedback(np.arange(40), weight=rng.uniform(0.1, 2.0, 40))  # distinct priorities
    priorities = run.buffer.weights[:40].copy()
    state = run.buffer.state_dict()
    sample = run.buffer.sample(cfg.batch)  # the draw learn() is about to make
    run.buffer.load_state_dict(state)
    slots = sample.ids % cfg.capacity
    p = priorities ** 0.6 / (priorities ** 0.6).sum()
    np.testing.assert_allclose(sample.probabilities, p[slots], rtol=1e-9)
    beta = cfg.beta_start + (1 - cfg.beta_start) * 30 / ((cfg.frames - cfg.replay_start) // cfg.update_every)
    is_weights = (p.min() / p[slots]) ** beta
    data = minatar_dqn.as_tensors(sample.data, run.q.conv.in_channels)
    with torch.no_grad():
        q_sa = run.q(data["obs"]).numpy()[np.arange(cfg.batch), sample.data["action"]]
        y = sample.data["reward"] + cfg.gamma * (1 - sample.data["done"]) * run.target(data["next_obs"]).numpy().max(1)
    td = np.abs(y - q_sa)
    huber = np.where(td < 1, 0.5 * td ** 2, td - 0.5)
    assert run.learn() == pytest.approx(float((is_weights * huber).mean()), rel=1e-5)
    assert run.updates == 31
    np.testing.assert_allclose(run.buffer.weights[slots], td + cfg.priority_eps, rtol=1e-5)
    untouched = np.setdiff1d(np.arange(40), slots)
    np.testing.assert_array_equal(run.buffer.weights[untouched], priorities[untouched])


def test_uniform_arm_samples_uniformly_with_unit_weights():
    run = minatar_dqn.new_run(minatar_dqn.Config(replay_start=0, capacity=64), "breakout", "uniform", 0)
    for _ in range(40):
        run.step()
    run.buffer.feedback(np.arange(40), weight=np.linspace(0.1, 5, 40))
    sample = run.buffer.sample(16)
    np.testing.assert_allclose(sample.probabilities, 1 / 40)
    np.testing.assert_allclose(sample.weights, 1.0)


def test_bad_arm_or_game_is_refused_by_name():
    with pytest.raises(ValueError, match="arm must be one of"):
        minatar_dqn.new_run(TINY, "breakout", "rank", 0)
    with pytest.raises(ValueError, match="game must be one of"):
        minatar_dqn.new_run(TINY, "pong", "per", 0)


def test_driver_lists_the_grid_in_pair_order_with_each_status(tmp_path, capsys):
    runs = tmp_path / "runs"
    (runs / "breakout_uniform_seed0").mkdir(parents=True)
    (runs / "breakout_uniform_seed0" / "summary.json").write_text("{}")
    (runs / "breakout_per_seed0" / "checkpoints" / "step-000050000").mkdir(parents=True)
    minatar_driver.main(["--list", "--runs", str(runs), "--seeds", "0", "1", "--nice", "7"])
    lines = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [(name, status) for name, status, _ in lines] == [
        ("breakout_uniform_seed0", "done"), ("breakout_per_seed0", "partial"),
        ("breakout_uniform_seed1", "new"), ("breakout_per_seed1", "new")]
    assert lines[3][2].startswith("nice -n 7 ") and lines[3][2].endswith(
        f"--game breakout --arm per --seed 1 --run-dir {runs / 'breakout_per_seed1'}")


def synthetic_run(folder: Path, arm: str, seed: int, base: float, cpu_per_frame: float) -> None:
    """100 frames, an episode every 10 frames with return base + frame / 100, one evaluation at the end."""
    config = {"frames": 100}
    lines = [{"kind": "run", "game": "breakout", "arm": arm, "seed": seed, "config": config, "frames": 100,
              "episodes": 10, "cpu_s": 100 * cpu_per_frame, "wall_s": 200 * cpu_per_frame}]
    lines += [{"game": "breakout", "arm": arm, "seed": seed, "kind": "episode", "frame": f, "return": base + f / 100,
               "cpu_s": f * cpu_per_frame} for f in range(10, 101, 10)]
    lines += [{"game": "breakout", "arm": arm, "seed": seed, "kind": "eval", "frame": 100, "returns": [base, base + 2]}]
    text = "\n".join(json.dumps(line) for line in lines) + "\n"
    (folder / f"breakout_{arm}_seed{seed}.jsonl.gz").write_bytes(gzip.compress(text.encode()))


def test_summary_pairs_seeds_and_computes_each_endpoint(tmp_path):
    for seed, (u, p) in enumerate([(1.0, 3.0), (2.0, 5.0)]):
        synthetic_run(tmp_path, "uniform", seed, u, 1.0)
        synthetic_run(tmp_path, "per", seed, p, 2.0)  # PER twice as slow per frame
    synthetic_run(tmp_path, "uniform", 2, 7.0, 1.0)  # no partner: in the arm's row, not in the pairs
    runs = minatar_summary.load_runs(tmp_path)
    assert minatar_summary.endpoints(runs["breakout", "per", 0]) == {
        "last_return": pytest.approx(4.0), "final_eval": pytest.approx(4.0),
        "auc": pytest.approx(3.0 + np.mean(np.arange(10, 101, 10)) / 100)}
    # equal CPU time: T = 100 s (the uniform run); PER's episodes up to frame 50, its last 10% is frame 50 only
    assert minatar_summary.equal_time(runs["breakout", "per", 0], runs["breakout", "uniform", 0]) == (
        pytest.approx(3.5), pytest.approx(2.0), 100.0)
    text = minatar_summary.render(runs, tmp_path)
    # last-10% returns: per 4, 6; uniform 2, 3 -> differences 2, 3; t(0.975, 1) * 0.7071 / sqrt(2) = 6.353
    assert "partial: 2 of 5 pairs, not a verdict" in text and "**+2.50 [-3.85, +8.85], p = " in text
    assert "| uniform | 3 | 4.33 ± 3.21 |" in text  # last-10% returns 2, 3, 8
    minatar_summary.plot(runs, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 0

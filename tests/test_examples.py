"""Every script in examples/ runs end to end with tiny arguments, as a user would run it (the entry-point examples
in tests/test_user_examples.py and beside it; the main job and the SB3 example here), and so do the comparisons
that moved to experiments/ (their full-size figures live in results/)."""
import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
EXPERIMENTS = ROOT / "experiments"


def load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_example_has_a_test_here():
    tested = {"electra_tmr.py", "sb3_per_dqn.py", "sb3_per_sac.py",  # here
              "replay_loader.py", "dataloader_sampler.py", "hf_trainer.py", "rho_loss.py", "lightning_sampler.py",
              "dqn_per.py",  # tests/test_user_examples.py
              "ddp_sampler.py",  # tests/distributed/test_example_ddp.py (torchrun)
              "ray_replay.py",  # tests/ray/test_user_example.py (needs ray)
              "mixing_dataloader.py", "grpo_prompts.py"}  # here
    assert {p.name for p in EXAMPLES.iterdir() if p.is_file()} == tested


def test_digits_example_writes_a_table(tmp_path):
    digits = load(EXPERIMENTS / "prioritized_digits.py")
    (tmp_path / "out dir").mkdir()
    out = tmp_path / "out dir" / "digits.md"  # a space: the report's command line must quote it to rerun
    argv = ["--seeds", "0", "1", "--steps", "40", "--eval-every", "20", "--table-steps", "20", "40", "--out", str(out)]
    digits.main(argv)
    text = out.read_text()
    assert f"Command: `python -m experiments.prioritized_digits {shlex.join(argv)}`" in text
    for variant in ("uniform", "replacement", "loss", "loss_diff", "grad_bound"):
        assert f"| {variant} |" in text
    assert "| variant | step 20 | step 40 |" in text and "Command: `python -m experiments.prioritized_digits" in text


def test_dqn_example_trains_inline_and_with_a_worker(tmp_path, capsys):
    dqn = load(EXPERIMENTS / "dqn_cartpole.py")
    out = tmp_path / "dqn.md"
    dqn.main(["--seeds", "0", "--env-steps", "200", "--warmup", "64", "--bins", "2", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "workers=0 seed=0:" in printed and "workers=1 seed=0:" in printed
    text = out.read_text()
    assert "| workers=0 seed=0 |" in text and "| workers=1 seed=0 |" in text and "--warmup 64" in text
    assert out.with_suffix(".png").stat().st_size > 0


def test_sb3_example_trains_both_arms(capsys):
    pytest.importorskip("stable_baselines3")
    import torch

    threads = torch.get_num_threads()  # the example sets one torch thread for the process
    try:
        returns = load(EXAMPLES / "sb3_per_dqn.py").main(
            ["--total-timesteps", "600", "--learning-starts", "100", "--eval-episodes", "2"])
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    assert set(returns) == {"uniform", "prioritized"}
    assert "prioritized: greedy return" in printed and "prioritized buffer: 768 transitions" in printed


@pytest.mark.parametrize("n_steps, buffer", [("1", "PrioritizedReplayBuffer"), ("3", "PrioritizedNStepReplayBuffer")])
def test_sb3_sac_example_trains_both_arms(capsys, n_steps, buffer):
    pytest.importorskip("stable_baselines3")
    import torch

    threads = torch.get_num_threads()
    try:
        returns = load(EXAMPLES / "sb3_per_sac.py").main(
            ["--total-timesteps", "300", "--learning-starts", "100", "--eval-episodes", "1", "--n-steps", n_steps])
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    assert set(returns) == {"uniform", "prioritized"}
    assert f"prioritized buffer ({buffer}): 300 transitions" in printed


def test_mixing_example_trains_on_a_learned_mixture_and_logs_the_weights(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    path = EXAMPLES / "mixing_dataloader.py"
    text = path.read_text()
    assert len(text.splitlines()) <= 150 and "sys.path" not in text and "examples/mixing_dataloader.py" in text
    threads = torch.get_num_threads()  # the example sets one torch thread for the process
    try:
        result = load(path).main(["--steps", "60", "--log", str(tmp_path / "weights.jsonl")])
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    assert "rule odm, num_workers=0: 60 steps of 64" in printed and "held-out accuracy: easy" in printed
    assert result["steps"] == 60 and sum(result["drawn"].values()) == 60 * 64
    assert abs(sum(result["weights"].values()) - 1) < 1e-2  # rounded to 3 digits each
    assert len((tmp_path / "weights.jsonl").read_text().splitlines()) == 6  # steps 0, 10, ..., 50


def test_main_job_runs_from_another_directory(tmp_path):
    """The main job's script with tiny settings on an embedded corpus, started outside the checkout."""
    out = tmp_path / "runs"
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "electra_tmr.py"), "--corpus", "python-topics", "--max-lines", "300",
         "--steps", "2", "--vocab-size", "300", "--max-len", "32", "--batch-size", "4", "--buffer-size", "8",
         "--threads", "1", "--no-finetune", "--no-progress", "--output-dir", str(out)],
        cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| electra | tmr-loss_diff |" in (out / "summary.md").read_text()
    for variant in ("electra", "tmr-loss_diff"):
        assert (out / variant / "discriminator" / "config.json").is_file()


def test_grpo_example_trains_both_arms_and_plots_pass_rates(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    pytest.importorskip("trl")
    path = EXAMPLES / "grpo_prompts.py"
    text = path.read_text()
    assert len(text.splitlines()) <= 150 and "sys.path" not in text and "examples/grpo_prompts.py" in text
    threads = torch.get_num_threads()  # the example sets one torch thread for the process
    try:
        results = load(path).main(["--steps", "6", "--plot", str(tmp_path / "pass_rates.png")])
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    assert "uniform: zero-variance groups" in printed and "learnability: zero-variance groups" in printed
    assert set(results) == {"uniform", "learnability"}
    for zero, held_out in results.values():
        assert 0.0 <= zero <= 1.0 and set(held_out) == {1, 2, 3}
    assert (tmp_path / "pass_rates.png").stat().st_size > 0

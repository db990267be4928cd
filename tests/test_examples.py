"""Every script in examples/ runs end to end with tiny arguments, as a user would run it, and prints what it
measured: the short entry-point examples a user copies (short, public names only, how to run in the docstring),
the SB3, mixing and GRPO examples and the main job; the DDP one runs under torchrun in
tests/distributed/test_example_ddp.py and the Ray one on the session's cluster in tests/ray/test_user_example.py
(their markers and fixtures live there). The comparisons that moved to experiments/ run here too, briefly (their
full-size figures live in results/)."""
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
    """A script as a module (not registered in sys.modules, as a user's script would not be); a bare name is an
    example's."""
    path = EXAMPLES / f"{path}.py" if isinstance(path, str) else path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def torch_threads(request):
    """The examples set one torch thread for their process; give the suite its setting back. Every example needs
    torch: without it their tests skip (the listing of examples/ still runs)."""
    if request.node.name == "test_every_example_has_a_test_here":
        yield
        return
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_every_user_example_is_short_and_imports_only_public_names():
    for name in ("replay_loader", "dataloader_sampler", "hf_trainer", "rho_loss", "ddp_sampler",
                 "lightning_sampler", "ray_replay", "dqn_per"):
        text = (EXAMPLES / f"{name}.py").read_text()
        assert len(text.splitlines()) <= 150, name
        assert "sys.path" not in text, name
        imported = [line.split()[1] for line in text.splitlines()
                    if line.startswith(("from replayloader", "import replayloader"))]
        assert imported and all(not part.startswith("_") for m in imported for part in m.split(".")), name
        assert text.startswith('"""') and f"examples/{name}.py" in text.split('"""')[1], name  # how to run it


@pytest.mark.parametrize("workers", [0, 1])
def test_replay_loader_trains_on_the_stream(workers, capsys):
    result = load("replay_loader").main(["--steps", "40", "--capacity", "256", "--workers", str(workers)])
    printed = capsys.readouterr().out
    assert f"strategy loss_diff, alpha 1.0, workers={workers}: 78 updates on 1280 produced examples" in printed
    assert result["updates"] == 78  # the first call's 32 examples are below min_size = 64; then 2 batches a call
    assert result["buffer_size"] == 256 and "buffer: 256 of 256 examples" in printed
    assert result["test_mse"] < result["test_mse_before"]


def test_replay_loader_without_replay_priorities(capsys):
    result = load("replay_loader").main(["--steps", "20", "--capacity", "256", "--alpha", "0", "--strategy", "loss"])
    assert result["alpha"] == 0.0 and result["updates"] == 38
    assert "strategy loss, alpha 0.0" in capsys.readouterr().out


def test_dataloader_sampler_in_process(capsys):
    result = load("dataloader_sampler").main(["--epochs", "2"])
    printed = capsys.readouterr().out
    assert "epoch 0: test accuracy" in printed and "epoch 1: test accuracy" in printed
    assert result["epoch"] == 2 and len(result["accuracy"]) == 2
    assert result["drawn"] == 1347 + 43 * 32  # the shuffled pass over 1,347 digits, then 43 full batches
    assert result["accuracy"][-1] > 0.5  # ten classes: chance is 0.1
    assert "never visited 0.000" in printed


def test_dataloader_sampler_with_a_spawned_worker_as_a_script(tmp_path):
    """Run as users do: spawned workers import the script again, where the __main__ guard keeps them idle."""
    done = subprocess.run([sys.executable, str(EXAMPLES / "dataloader_sampler.py"), "--epochs", "2",
                           "--num-workers", "1"], check=False, cwd=tmp_path, capture_output=True, text=True,
                          timeout=180,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "alpha 1.0, num_workers=1: 2 epochs of 43 batches" in done.stdout
    assert "sampler: 2723 draws" in done.stdout


def test_hf_trainer_example(capsys):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    result = load("hf_trainer").main(["--steps", "12", "--train-size", "128"])
    printed = capsys.readouterr().out
    assert result["steps"] == 12 and "12 steps of 32" in printed
    assert "sampler: epoch 3, 384 draws" in printed  # 128 examples, batch 32: 4 steps an epoch
    assert 0.0 <= result["accuracy"] <= 1.0 and "flipped training labels hold" in printed


def test_rho_loss_example_reports_both_arms(capsys):
    result = load("rho_loss").main(["--steps", "60", "--eval-every", "20", "--irreducible-epochs", "5",
                                    "--target", "0.5"])
    printed = capsys.readouterr().out
    assert ("irreducible-loss model: 539 hold-out examples, accuracy on the held-out slice that chose its epoch"
            in printed)
    for arm in ("uniform", "rho_loss"):
        assert f"{arm:>8}: steps to 0.50 test accuracy:" in printed
        assert list(result[arm]["curve"]) == [20, 40, 60]
    assert 0.0 < result["irreducible_val_accuracy"] <= 1.0
    # top reducible loss avoids the flipped labels (about 20% of the training split)
    assert result["flipped_share_selected"] < 0.15


def test_lightning_example_on_one_device(capsys):
    pytest.importorskip("lightning")
    result = load("lightning_sampler").main(["--epochs", "2"])
    printed = capsys.readouterr().out
    assert result["steps"] == 2 * 43 and result["epoch"] == 2 and result["world_size"] == 1
    assert "1 device(s), alpha 1.0: 86 steps in" in printed and "sampler: epoch 2, 2723 draws" in printed


def test_dqn_per_example(capsys):
    pytest.importorskip("gymnasium")
    result = load("dqn_per").main(["--env-steps", "600", "--warmup", "100", "--eval-episodes", "1"])
    printed = capsys.readouterr().out
    assert result["updates"] == 501  # one update per environment step once 100 transitions are stored
    assert result["buffer_size"] == 600 and "buffer 600 transitions" in printed
    assert result["episodes"] > 0 and "greedy policy: mean return" in printed


def test_every_example_has_a_test_here():
    tested = {"electra_tmr.py", "sb3_per_dqn.py", "sb3_per_sac.py",  # here
              "replay_loader.py", "dataloader_sampler.py", "hf_trainer.py", "rho_loss.py", "lightning_sampler.py",
              "dqn_per.py",  # here
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

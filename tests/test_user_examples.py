"""The short examples a user copies (examples/, one per entry point) run end to end with tiny arguments and
print what they measured. The DDP one runs under torchrun in tests/distributed/test_example_ddp.py, the Ray one
on the session's cluster in tests/ray/test_user_example.py."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def load(name: str):
    """The example as a module (not registered in sys.modules, as a user's script would not be)."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def torch_threads():
    """The examples set one torch thread for their process; give the suite its setting back."""
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

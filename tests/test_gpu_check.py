"""`checks/gpu_check.sh --dry-run` runs the GPU check's whole command on the CPU at toy sizes (the numbers there
mean nothing): the prepare step and its size check, every part, the report; the parts run with `datasets`
blocked, so this also shows that the flagship pretrains and fine-tunes from local files without it."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "checks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(args: list[str], out: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable}
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_prepare_and_dry_run_write_every_section(tmp_path):
    pytest.importorskip("transformers")
    bundle, out = tmp_path / "bundle", tmp_path / "out"
    prepared = _run([sys.executable, "-m", "checks.gpu_check", "--prepare", "--dry-run", "--bundle", str(bundle)], out)
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    assert "limit 64 MiB: OK" in prepared.stdout and (bundle / "data" / "glue" / "SST-2" / "train.tsv").is_file()
    done = _run(["bash", "checks/gpu_check.sh", "--dry-run", "--in-process", "--skip-tests", "--bundle", str(bundle)],
                out)
    log = (out / "gpu_check.log").read_text()
    assert done.returncode == 0, log[-3000:]
    text = (out / "gpu_check.md").read_text()
    assert "dry run on the CPU" in text and "failed" not in text
    for part in ("nccl", "speed", "syncs", "real", "finetune", "logging", "buffer"):
        assert f"| {part} | ok |" in text, part
    for row in ("| electra | ", "| tmr-loss_diff | ", "| tmr-loss_diff (deferred feedback) |", "| tmr-grad_norm |",
                "| tmr-grad_bound |", "Reference loop", "| 1,000 | 128 |", "draws and probabilities equal to a plain "
                "`PrioritizedSampler`'s: True", "Held-out AUC at matched steps", "at matched training wall time",
                "| deferred, --log-every 50 | ", "Over 2 electra / reference pair(s) timed in turn"):
        assert row in text, row
    assert text.count("| tmr-loss_diff | 0.") >= 1 and "## SST-2 fine-tune" in text
    assert (out / "gpu_check.json").is_file()


def test_a_part_runs_in_its_own_process_and_a_hung_one_is_stopped(tmp_path):
    out = tmp_path / "out"
    done = _run(["bash", "checks/gpu_check.sh", "--dry-run", "--parts", "buffer", "--bundle", str(tmp_path)], out)
    assert done.returncode == 0, (out / "gpu_check.log").read_text()[-3000:]
    assert "| buffer | ok |" in (out / "gpu_check.md").read_text()
    started = time.perf_counter()
    code, _, seconds = _gpu_check().run_process([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1)
    assert code is None and time.perf_counter() - started < 20


def test_syncs_are_counted_by_the_line_that_caused_them():
    pytest.importorskip("transformers")
    check = _gpu_check()
    check.import_integration()
    window: dict = {}
    with check.sync_window("cpu", warm=0, steps=1, window=window):
        warnings.warn("called a synchronizing CUDA operation")  # what set_sync_debug_mode("warn") raises
        warnings.warn("something else")
    assert window["syncs"] == 1 and list(window["where"]) == [f"tests/test_gpu_check.py:{_line_of('synchronizing CUDA')}"]
    assert [check.sync_source(w) for w in ("replayloader/buffer/core.py:3", "integrations/electra/pretrain/loop.py:9",
                                           "transformers/models/electra/x.py:1", "torch/nn/x.py:2")] == [
        "library", "integration", "transformers", "other"]
    points = [{"elapsed": 1.0, "auc": 0.6}, {"elapsed": 3.0, "auc": 0.8}]
    assert check.auc_at(points, 0.5) is None and check.auc_at(points, 2.0) == pytest.approx(0.7)
    assert check.auc_at(points, 9.0) == 0.8


def test_a_wait_on_a_cuda_event_is_counted_too(monkeypatch):
    """The debug mode does not flag `torch.cuda.Event.synchronize()`; the window counts it at its caller's line
    (a stand-in event here: no CUDA on the CPU), and puts the method back after."""
    import torch

    pytest.importorskip("transformers")
    check = _gpu_check()
    check.import_integration()
    waited = []

    def stub(self):
        waited.append(self)

    monkeypatch.setattr(torch.cuda.Event, "synchronize", stub)
    stand_in, window = object(), {}
    with check.sync_window("cpu", warm=0, steps=1, window=window):
        torch.cuda.Event.synchronize(stand_in)  # the event wait
    assert waited == [stand_in] and window["syncs"] == 1
    assert list(window["where"]) == [f"tests/test_gpu_check.py:{_line_of('the event wait', call='synchronize(')}"]
    assert torch.cuda.Event.synchronize is stub  # put back after the window


def _line_of(text: str, call: str = "warnings.warn") -> int:
    return next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1)
                if text in line and call in line)


def test_without_cuda_a_real_run_is_refused_with_a_hint(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert _gpu_check().main(["--skip-tests"]) == 2
    assert "--dry-run" in capsys.readouterr().err


def test_table_picks_rows_by_name_keeps_electra_and_refuses_an_unknown_row():
    gpu_check = _gpu_check()
    every = gpu_check.table_runs(None)
    assert every == list(gpu_check.TABLE_RUNS)
    picked = gpu_check.table_runs("tmr-loss_diff_(deferred_feedback),tmr-grad_bound")
    assert [gpu_check.table_label(v, e) for v, e in picked] == ["electra", "tmr-loss_diff (deferred feedback)",
                                                                 "tmr-grad_bound"]
    with pytest.raises(ValueError, match=r"--table names unknown rows \['tmr-nope'\]"):
        gpu_check.table_runs("tmr-nope")
    with pytest.raises(ValueError, match="tmr-nope"):  # refused before any part runs
        gpu_check.main(["--dry-run", "--table", "tmr-nope", "--parts", "nccl"])


def test_the_report_names_both_commits_when_git_and_the_bundle_disagree():
    gpu_check = _gpu_check()
    same = {"commit": "abc1234", "git_commit": "abc1234", "prepared": {"commit": "abc1234"}}
    assert gpu_check.commit_text(same) == "abc1234"
    stale = {"commit": "0c8e572", "git_commit": "0c8e572", "prepared": {"commit": "5f7468e"}}
    assert gpu_check.commit_text(stale).startswith("5f7468e by the bundle's prepared.json (git here says 0c8e572")
    no_git = {"commit": "5f7468e", "git_commit": None, "prepared": {"commit": "5f7468e"}}
    assert gpu_check.commit_text(no_git) == "5f7468e"

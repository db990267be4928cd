"""`bench/gpu_check.py --dry-run` runs its whole plumbing on the CPU (the numbers there mean nothing)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dry_run_writes_every_section(tmp_path):
    import torch

    threads = torch.get_num_threads()
    out = tmp_path / "gpu_check.md"
    try:
        assert _gpu_check().main(["--dry-run", "--skip-tests", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    text = out.read_text()
    assert "dry run on the CPU" in text
    for row in ("| electra | ", "| tmr-loss_diff | ", "| tmr-loss_diff (deferred feedback) |", "| tmr-grad_norm |",
                "| tmr-grad_bound |", "| 1,000 | 128 |", "| producer |", "| discriminator forward |"):
        assert row in text, row
    assert "synchronous" in text and "deferred" in text
    for row in ("| synchronous | ", "| deferred | ", "| synchronous, --log-every 50 | ", "| deferred, --log-every 50 | "):
        assert row in text, row  # (d): what logging every step costs
    assert "deferred, --log-every 50 " in text.split("## (d)")[0]  # (c): its host transfers per step


def test_without_cuda_a_real_run_is_refused_with_a_hint(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SystemExit):
        _gpu_check().main([])
    assert "--dry-run" in capsys.readouterr().err

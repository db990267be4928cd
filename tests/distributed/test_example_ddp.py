"""examples/ddp_sampler.py under torchrun on 2 CPU processes (gloo), launched as the docs' torchrun recipes are in
test_lifecycle.py: it exits 0, prints each rank's share and the accuracy, writes its one shared state file, and
leaves no process behind (tests/processes.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests import processes

from .launch import ROOT, job_env, torchrun_command

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds a job's processes through /proc")

EXAMPLE = ROOT / "examples" / "ddp_sampler.py"


def test_the_ddp_example_runs_under_torchrun(tmp_path):
    state = tmp_path / "sampler.npz"
    done = processes.run([*torchrun_command(), str(EXAMPLE), "--epochs", "2", "--state", str(state)],
                         env=job_env(), cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "terminate called" not in done.stderr
    for rank in (0, 1):  # 1,347 digits: the warm-up pass pads to 1,348, then 22 global batches of 64
        assert f"rank {rank} of 2: trained on {(1348 + 22 * 64) // 2} examples" in done.stdout, done.stdout
    assert "sampler epoch 2, 2755 global draws" in done.stdout
    assert "epoch 1: test accuracy" in done.stdout and "final test accuracy" in done.stdout
    assert state.is_file() and list(tmp_path.glob("*.npz")) == [state]

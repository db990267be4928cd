"""How a distributed job ends (issue 32): the torchrun recipes of docs/distributed.md run standalone and exit 0, a rank never
outlives its launcher, and no process of a job is left behind (tests/processes.py). The 20-run count of the
recipes lives in `checks/ddp_stress.py`, outside the suite's time budget."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import docs_blocks, processes

from .launch import JOBS, ROOT, job_env, torchrun_command

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds a job's processes through /proc")


def torchrun_recipes() -> dict[str, str]:
    """Every python block of docs/distributed.md that starts its own group, by the bold heading before it."""
    page = docs_blocks.text("docs/distributed.md")
    recipes = {}
    for offset, code in docs_blocks.blocks("docs/distributed.md"):
        if "session(" in code:
            recipes[re.findall(r"^\*\*(.+?)\*\*", page[:offset], re.M)[-1]] = code
    return recipes


def test_the_docs_have_their_two_torchrun_recipes():
    assert len(torchrun_recipes()) == 2


@pytest.mark.parametrize("heading", sorted(torchrun_recipes()))
def test_a_torchrun_recipe_of_the_docs_run_standalone_exits_0_and_leaves_nothing(heading, tmp_path):
    """Inside the suite's shared launch these blocks share one process group and never reach their own exit,
    where gloo's threads aborted 3 of 9 standalone runs before `session` (replayloader/launcher.py)."""
    script = tmp_path / "train.py"
    script.write_text(torchrun_recipes()[heading])
    done = processes.run([*torchrun_command(), str(script)], env=job_env(), cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "terminate called" not in done.stderr
    assert len(list(tmp_path.glob("*.npz"))) == 1  # it trained to the end and wrote its one shared state file


def test_a_killed_launcher_leaves_no_rank_alive(tmp_path):
    """torchrun starts each rank in a session of its own: without the watchdog a SIGKILL to the launcher left
    both ranks training (issue 32). Now every rank of a DistributedPrioritizedSampler job ends by itself."""
    with processes.job([*torchrun_command(), str(JOBS), str(tmp_path), "forever"], env=job_env(), cwd=ROOT,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as job:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("started-*"))) < 2 and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(list(tmp_path.glob("started-*"))) == 2, job.stderr.read().decode()[-3000:]
        ranks = [int(p.read_text()) for p in tmp_path.glob("started-*")]
        assert all(map(processes.alive, ranks))
        os.kill(job.pid, signal.SIGKILL)
        job.wait()
        killed_at = time.monotonic()
        left = processes.wait_until_gone(job.tag, 10)  # ranks and their DataLoader workers
        gone_after = time.monotonic() - killed_at
        assert not left, f"outlived the launcher: {left}"
        assert gone_after < 5, gone_after  # the watchdog polls every 0.5 s
        said = job.stderr.read().decode()
        assert said.count("its launcher (pid") == 2, said[-3000:]  # one line from each rank


def test_the_watchdog_ends_an_orphan_with_one_line_and_its_own_status(tmp_path):
    """The watchdog alone, without torch.distributed: a child whose parent is SIGKILLed exits with
    `LAUNCHER_GONE_EXIT` within a second and says why."""
    from replayloader.distributed import LAUNCHER_GONE_EXIT

    child = ("import sys, time; from replayloader.distributed import watch_launcher; watch_launcher(); "
             f"open({str(tmp_path / 'ready')!r}, 'w').close(); time.sleep(60)")
    parent = ("import subprocess, sys, time; "
              f"p = subprocess.Popen([sys.executable, '-c', {child!r}], stderr=open({str(tmp_path / 'err')!r}, 'w')); "
              f"open({str(tmp_path / 'child')!r}, 'w').write(str(p.pid)); time.sleep(60)")
    with processes.job([sys.executable, "-c", parent], env=job_env(), cwd=ROOT) as job:
        deadline = time.monotonic() + 60
        while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        orphan = int((tmp_path / "child").read_text())
        os.kill(job.pid, signal.SIGKILL)
        job.wait()
        assert not processes.wait_until_gone(job.tag, 3)
    assert not processes.alive(orphan)
    said = (tmp_path / "err").read_text()
    assert f"its launcher (pid {job.pid}) is gone; exiting with status {LAUNCHER_GONE_EXIT}" in said

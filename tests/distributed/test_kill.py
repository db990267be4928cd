"""A rank that dies ends the torchrun job, and the job resumes from its last shared state file exactly: on 2 ranks
(a new torchrun launch) and in one process. The uninterrupted run is in the shared launch (conftest.py)."""
from __future__ import annotations

import shutil
import signal
import subprocess
import time

import pytest
import torch

from replayloader import PrioritizedBatchSampler
from replayloader.distributed import load_shared_state, state_digest

from tests import processes

from . import scenario as sc
from .jobs import KILL_AT, KILL_EVERY, KILL_TOTAL
from .launch import JOBS, ROOT, job_env, launch, torchrun_command

SAVED = KILL_AT // KILL_EVERY * KILL_EVERY  # the last state file before the death


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> dict:
    """The job whose rank 1 SIGKILLs itself at step `KILL_AT` (rank 0 is then waiting in an all-gather)."""
    out = tmp_path_factory.mktemp("killed")
    with (out / "torchrun.log").open("w") as log, processes.job(
            [*torchrun_command(), str(JOBS), str(out), "kill_die"], env=job_env(), cwd=ROOT, stdout=log,
            stderr=subprocess.STDOUT) as job:
        try:
            status = job.wait(timeout=120)
        except subprocess.TimeoutExpired:  # a hang: the job's processes are all killed on leaving the block
            status = None
    ended = time.time()
    at_death = out.parent / f"{out.name}-state-at-death.npz"  # the resumed job writes its own files over it
    if (out / "kill_state.npz").exists():
        shutil.copyfile(out / "kill_state.npz", at_death)
    return {"out": out, "status": status, "ended": ended, "state": at_death}


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_rank_that_dies_ends_the_job_within_a_minute(killed):
    log = (killed["out"] / "torchrun.log").read_text()[-3000:]
    assert killed["status"] != 0, log
    assert (killed["out"] / "killed_at").exists(), log  # it died where the job kills it, not earlier
    assert killed["ended"] - float((killed["out"] / "killed_at").read_text()) < 60
    assert not list(killed["out"].glob("report-*.json"))  # no rank finished its job
    assert int(load_shared_state(killed["state"])["trained"]) == SAVED


def test_the_job_relaunched_from_its_last_state_file_continues_exactly(killed, torchrun_reports):
    steady = [report["kill_steady"] for report in torchrun_reports]
    resumed = [report["kill_resume"] for report in launch(torchrun_command(), killed["out"], ["kill_resume"])]
    for run, full in zip(resumed, steady):
        assert run["start"] == SAVED and len(full["records"]) == KILL_TOTAL
        assert run["records"] == full["records"][SAVED:]  # indices, probabilities, importance weights
        assert run["sampler"] == full["sampler"]  # the final tree, RNG and position


def test_the_state_file_of_the_dead_job_resumes_in_one_process(killed, torchrun_reports):
    steady = [report["kill_steady"] for report in torchrun_reports]
    batches = PrioritizedBatchSampler(sc.make_sampler())
    batches.load_state_dict(load_shared_state(killed["state"])["loader"])
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(sc.N)), batch_sampler=batches,
                                         num_workers=1, prefetch_factor=2)
    one = sc.run_loader(loader, batches, KILL_TOTAL - SAVED, lambda b, info, batch: sc.feed_back(b, info))
    assert sc.assemble([one]) == sc.assemble([run["records"] for run in steady])[SAVED:]
    assert state_digest(batches.sampler.state_dict()) == steady[0]["sampler"]

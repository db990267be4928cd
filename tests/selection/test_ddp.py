"""`ReusedPool`, the stale reducible-loss tree and `SelectionSwitch` on 2 gloo CPU ranks under torchrun (one
launch for the three, see ddp_jobs.py), against one process applying what each rank does (ddp_scenario.py)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

from replayloader.distributed import state_digest  # noqa: E402
from tests import processes  # noqa: E402
from tests.distributed.launch import ROOT, job_env, torchrun_command  # noqa: E402

from . import ddp_scenario as sc  # noqa: E402

JOBS = Path(__file__).with_name("ddp_jobs.py")


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("selection_ddp")
    # every process of the job is killed on timeout, and none may be left after it (tests/processes.py)
    done = processes.run([*torchrun_command(2), str(JOBS), str(out)], env=job_env(), cwd=ROOT, timeout=300)
    if done.returncode != 0:
        raise AssertionError(f"torchrun failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    return [json.loads((out / f"report-{rank}.json").read_text()) for rank in (0, 1)]


def test_a_reused_pool_hands_each_rank_its_slices_top_rows_and_resumes_mid_pool_from_one_file(reports):
    expected, sampler = sc.reuse_reference()
    for rank, report in enumerate(reports):
        run = report["reuse"]
        assert run["records"] == expected[rank]
        saved_at = sc.SAVE_POOL * sc.STEPS_PER_POOL + sc.STEPS_PER_POOL - 1  # after step 2 of pool 4's 3
        assert run["resumed"] == [{"chosen": r["chosen"]} for r in run["records"][saved_at:]]
        assert run["sampler"] == state_digest(sampler.state_dict())
        assert run["stats"]["forward_rows_per_trained_row"] == 12 / (sc.STEPS_PER_POOL * sc.CHOSEN)
    assert reports[0]["reuse"]["state"] == reports[1]["reuse"]["state"]


def test_the_stale_tree_is_the_same_on_both_ranks_and_equals_one_process_fed_the_whole_batch(reports):
    expected, sampler = sc.stale_reference()
    for rank, report in enumerate(reports):
        assert [r["indices"] for r in report["stale"]["records"]] == [r["indices"] for r in expected[rank]]
        assert report["stale"]["digest"] == state_digest(sampler.state_dict())  # weights, last_fed, RNG, ...
    assert sampler.update_rule.calls == sc.STALE_STEPS + 2 * (sc.STALE_STEPS // 3)  # a refresh per rank share


def test_each_ranks_importance_weights_and_probabilities_are_its_share_of_the_global_batch(reports):
    expected, _ = sc.stale_reference()
    for rank, report in enumerate(reports):
        for got, want in zip(report["stale"]["records"], expected[rank]):
            assert got["weights"] == want["weights"] and got["probabilities"] == want["probabilities"]


def test_the_switch_decides_alike_on_both_ranks_and_resumes_mid_window_from_one_file(reports):
    expected, reference = sc.switch_reference()
    for rank, report in enumerate(reports):
        run = report["switch"]
        assert run["records"] == expected[rank]
        assert run["resumed"] == run["records"][sc.SWITCH_SAVE:]
        assert run["switch"] == state_digest(reference.state_dict()["switch"])
    modes = [r["selecting"] for r in expected[0]]
    assert True in modes and False in modes  # both modes ran
    stats = reports[0]["switch"]["stats"]
    assert stats == reports[1]["switch"]["stats"] and stats["steps"] == sc.SWITCH_STEPS
    assert stats["stopped"] == reference.stats()["stopped"] and stats["reason"] == reference.stats()["reason"]
    assert np.isclose(stats["selecting_fraction"], modes.count(True) / len(modes))
    assert reports[0]["switch"]["state"] == reports[1]["switch"]["state"]


"""GRPOPromptSampler on 2 gloo CPU ranks under torchrun (one launch; every process it starts is killed on timeout
and none may be left: tests/processes.py) against the same scenario in one process: identical prompts on every
rank, feedback gathered from slices that cut groups, bit-identical priorities, checkpoints, bad input."""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

from replayloader.distributed import load_shared_state, state_digest  # noqa: E402
from tests.distributed.launch import launch, torchrun_command  # noqa: E402

from . import scenario as sc  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds a job's processes through /proc")
JOBS = Path(__file__).with_name("jobs.py")


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("prompts_ddp")
    return out, launch(torchrun_command(2), out, [], script=JOBS, clean_exit=True)


@pytest.fixture(scope="module")
def one_process():
    sampler = sc.make()
    return sc.train(sampler, sc.TOTAL), sampler


def test_two_ranks_draw_the_one_process_prompts_and_keep_identical_priorities(launched, one_process):
    _, reports = launched
    seen, sampler = one_process
    assert (sc.B * sc.G // 2) % sc.G != 0  # each rank's slice cuts a group: the gather must regroup them
    assert reports[0]["uninterrupted"] == reports[1]["uninterrupted"] == seen
    assert reports[0]["digest"] == reports[1]["digest"] == state_digest(sampler.state_dict())
    assert reports[0]["priorities"] == reports[1]["priorities"] == sampler.prompts.priorities().tolist()
    stats = reports[0]["stats"]
    assert stats["feedback_calls"] == sc.TOTAL and stats["groups"] == sc.TOTAL * sc.B and stats["max_lag_seen"] == 1
    assert stats["retests"] > 0 and len({p for batch in seen for p in batch}) > 20


def test_a_two_rank_checkpoint_resumes_on_two_ranks_and_in_one_process(launched, one_process):
    out, reports = launched
    seen, sampler = one_process
    for report in reports:
        assert report["resumed"] == report["uninterrupted"][sc.SAVE_AT + 1:]
        assert report["resumed_digest"] == report["digest"]
    resumed = sc.make()
    resumed.load_state_dict(load_shared_state(out / "two_ranks.npz"))
    pending = seen[sc.SAVE_AT + 1]
    assert sc.train(resumed, sc.TOTAL - sc.SAVE_AT - 1, start=sc.SAVE_AT + 1, pending=pending) == seen[sc.SAVE_AT + 1:]
    assert state_digest(resumed.state_dict()) == state_digest(sampler.state_dict())


def test_bad_feedback_on_one_rank_raises_on_both_and_changes_nothing(launched):
    _, reports = launched
    assert reports[1]["bad_feedback"] == "ValueError: rewards must be finite; rewards[2] = nan"
    assert reports[0]["bad_feedback"] == ("ValueError: rank 1 rejected its feedback (its own error says why); "
                                          "nothing changed")
    assert reports[0]["bad_unchanged"] and reports[1]["bad_unchanged"]
    for report in reports:
        assert "seed is 3 on rank 0 but 4 on rank 1" in report["mismatch"]


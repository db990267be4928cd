"""PrioritizedGRPOTrainer on 2 CPU processes under ``accelerate launch`` (gloo; one launch, every process it starts
is killed on timeout: tests/processes.py) against the same run in one process: every process draws the same
prompts, each rewards its own slice (which cuts a group), the gathered feedback gives both processes the one-process
sampler bit for bit, and a checkpoint written by both resumes on both."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

from replayloader.distributed import state_digest  # noqa: E402
from replayloader.prompts import PrioritizedGRPOTrainer, PromptSampler  # noqa: E402
from tests.distributed.launch import accelerate_command, launch  # noqa: E402

from . import tiny_grpo as tiny  # noqa: E402
from .trl_jobs import PER_PROCESS, SAVE_AT, STEPS  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds a job's processes through /proc")
JOBS = Path(__file__).with_name("trl_jobs.py")


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("trl_ddp")
    found = launch(accelerate_command(), out, [], script=JOBS, clean_exit=True)
    assert (out / "a" / f"checkpoint-{SAVE_AT}" / "prompt_sampler.npz").is_file()
    return found


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        reward = tiny.StreamReward(group=4)
        run = PrioritizedGRPOTrainer(model=tiny.model(), reward_funcs=reward, processing_class=tiny.tokenizer(),
                                     args=tiny.config(tmp_path_factory.mktemp("trl_one"),
                                                      per_device_train_batch_size=2 * PER_PROCESS, max_steps=STEPS),
                                     train_dataset=tiny.prompts(),
                                     prompt_sampler=PromptSampler(40, 3, group_size=4, retest_every=2, seed=7))
        run.train()
        return reward.calls, run.prompt_sampler
    finally:
        torch.set_num_threads(threads)


def test_both_processes_draw_the_one_process_prompts_and_share_its_sampler(reports, one_process):
    calls, sampler = one_process
    assert [r["world"] for r in reports] == [2, 2] and len(calls) == STEPS
    assert (PER_PROCESS % 4) != 0  # each process's slice cuts a group: the gather must regroup them
    for step in range(STEPS):  # process 0 holds the generation batch's first half, process 1 the rest
        assert reports[0]["calls"][step] + reports[1]["calls"][step] == calls[step]
    assert reports[0]["digest"] == reports[1]["digest"] == state_digest(sampler.state_dict())
    stats = reports[0]["stats"]
    assert stats["feedback_calls"] == STEPS and stats["groups"] == 3 * STEPS and stats["max_lag_seen"] == 1


def test_a_checkpoint_written_by_both_resumes_on_both(reports):
    for report in reports:
        assert report["resumed_calls"] == report["calls"][SAVE_AT:]
        # each process's sampling RNG resumes too (restored after the DataLoader's first batch drew its seed)
        assert report["resumed_completions"] == report["completions"][SAVE_AT:]
        assert report["resumed_digest"] == report["digest"]

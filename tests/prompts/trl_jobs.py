"""What every process runs in the PrioritizedGRPOTrainer DDP test: ``python tests/prompts/trl_jobs.py OUT`` under
``accelerate launch`` (2 CPU processes, gloo).

Process r writes ``OUT/report-r.json``: the prompt indices its reward function saw at each generation (its slice
of the generation batch: 6 completions of 3 prompts x 4, so each slice cuts a group), the sampler's state digest
and counts after 4 steps (a checkpoint written at step 2, one file for both), and the slices and completions seen
when a second trainer resumes from that checkpoint.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from replayloader.distributed import shutdown, state_digest
from replayloader.prompts import PrioritizedGRPOTrainer, PromptSampler
from tests.prompts import tiny_grpo as tiny

PER_PROCESS, STEPS, SAVE_AT = 6, 4, 2


def trainer(out: Path, reward: tiny.StreamReward) -> PrioritizedGRPOTrainer:
    return PrioritizedGRPOTrainer(model=tiny.model(), reward_funcs=reward, processing_class=tiny.tokenizer(),
                                  args=tiny.config(out, per_device_train_batch_size=PER_PROCESS, max_steps=STEPS,
                                                   save_strategy="steps", save_steps=SAVE_AT),
                                  train_dataset=tiny.prompts(), prompt_sampler=PromptSampler(40, 3, group_size=4,
                                                                                             retest_every=2, seed=7))


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    first_reward = tiny.StreamReward(group=4)
    first = trainer(out / "a", first_reward)
    rank, world = first.accelerator.process_index, first.accelerator.num_processes
    first_reward.offset = rank * PER_PROCESS  # this process's first completion in the generation batch
    first.train()
    report = {"rank": rank, "world": world, "calls": first_reward.calls, "completions": first_reward.completions,
              "digest": state_digest(first.prompt_sampler.state_dict()),
              "stats": {k: v for k, v in first.prompt_sampler.stats().items() if isinstance(v, (int, float))}}
    resumed_reward = tiny.StreamReward(group=4, offset=rank * PER_PROCESS)
    resumed = trainer(out / "b", resumed_reward)
    resumed.train(resume_from_checkpoint=str(out / "a" / f"checkpoint-{SAVE_AT}"))
    report["resumed_calls"] = resumed_reward.calls
    report["resumed_completions"] = resumed_reward.completions
    report["resumed_digest"] = state_digest(resumed.prompt_sampler.state_dict())
    (out / f"report-{rank}.json").write_text(json.dumps(report))
    shutdown()  # barrier, destroy, gloo's workers parked: a bare destroy_process_group aborted a rank at exit in CI


if __name__ == "__main__":
    main()

"""What every rank runs in the prompt sampler's DDP test: ``python tests/prompts/jobs.py OUT`` under torchrun.

Rank r writes ``OUT/report-r.json``: the scenario uninterrupted (a checkpoint at SAVE_AT), resumed from that
checkpoint, bad feedback on rank 1 only, and a sampler built with a different seed on each rank.
"""
from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from replayloader.distributed import load_shared_state, save_shared_state, shutdown, state_digest


def error_of(action) -> str | None:
    try:
        action()
    except Exception as exc:  # reported, compared by the test
        return f"{type(exc).__name__}: {exc}"
    return None


def main() -> None:
    from tests.prompts import scenario as sc

    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    sampler = sc.make()
    ahead: dict = {}

    def save(step, fetched):
        if step == sc.SAVE_AT:
            save_shared_state(sampler.state_dict(), out / "two_ranks.npz")
            ahead["batch"] = list(fetched)

    report = {"uninterrupted": sc.train(sampler, sc.TOTAL, rank=rank, world=world, on_step=save),
              "digest": state_digest(sampler.state_dict()), "priorities": sampler.prompts.priorities().tolist(),
              "stats": {k: v for k, v in sampler.stats().items() if isinstance(v, (int, float))}}
    resumed = sc.make()
    resumed.load_state_dict(load_shared_state(out / "two_ranks.npz"))
    report["resumed"] = sc.train(resumed, sc.TOTAL - sc.SAVE_AT - 1, rank=rank, world=world, start=sc.SAVE_AT + 1,
                                 pending=ahead["batch"])
    report["resumed_digest"] = state_digest(resumed.state_dict())

    bad = sc.make()
    whole = np.array(next(sc.generation_batches(bad)))
    before = state_digest(bad.state_dict())
    mine = slice(rank * len(whole) // world, (rank + 1) * len(whole) // world)
    rewards = sc.rewards_of(whole, 0)[mine]
    if rank == 1:
        rewards[2] = np.nan
    report["bad_feedback"] = error_of(lambda: bad.feedback(whole[mine], rewards=rewards))
    report["bad_unchanged"] = state_digest(bad.state_dict()) == before
    report["mismatch"] = error_of(lambda: sc.make(seed=3 + rank))
    (out / f"report-{rank}.json").write_text(json.dumps(report))
    shutdown()  # barrier, destroy, gloo's workers parked: no abort at exit


if __name__ == "__main__":
    main()

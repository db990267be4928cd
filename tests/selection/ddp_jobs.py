"""What every rank runs in tests/selection/test_ddp.py: ``python -m torch.distributed.run ... ddp_jobs.py OUT``.

Three jobs on 2 gloo ranks, each against a one-process reference in the test (ddp_scenario.py): `ReusedPool`
behind `DistributedScoreThenSelect` (a mid-pool checkpoint resumed from one file), the stale reducible-loss tree
in a `DistributedPrioritizedSampler` (with the periodic refresh, each rank scoring its share), and
`SelectionSwitch` behind `DistributedScoreThenSelect` (uniform steps' losses gathered; a mid-window checkpoint
resumed). Rank r writes ``OUT/report-r.json``.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from replayloader.distributed import (DistributedPrioritizedSampler, load_shared_state, save_shared_state,  # noqa
                                      shutdown, state_digest, verify_identical)
from replayloader.distributed.select import DistributedScoreThenSelect  # noqa: E402
from replayloader.selection import stale_rows  # noqa: E402
from tests.selection import ddp_scenario as sc  # noqa: E402


def reuse(out: Path) -> dict:
    def build():
        select = DistributedScoreThenSelect(DistributedPrioritizedSampler(sc.reuse_sampler()), sc.reuse_pool())
        return select, select.selector

    select, pool = build()
    rank, records = dist.get_rank(), []
    for number in range(sc.POOLS):
        candidates = select.next_candidates()
        first = select.choose(candidates, sc.loss_of(candidates.indices, number))
        for chosen in pool.steps(first, rank=rank, world_size=2):
            records.append({"candidates": candidates.indices.tolist(), "chosen": chosen.indices.tolist()})
            if number == sc.SAVE_POOL and pool.pending_steps == 1:
                save_shared_state(select.state_dict(), out / "reuse.npz")
    resumed_select, resumed_pool = build()
    resumed_select.load_state_dict(load_shared_state(out / "reuse.npz"))
    resumed = [{"chosen": c.indices.tolist()} for c in resumed_pool.steps(rank=rank, world_size=2)]
    for number in range(sc.SAVE_POOL + 1, sc.POOLS):
        candidates = resumed_select.next_candidates()
        first = resumed_select.choose(candidates, sc.loss_of(candidates.indices, number))
        resumed += [{"chosen": c.indices.tolist()} for c in resumed_pool.steps(first, rank=rank, world_size=2)]
    return {"records": records, "resumed": resumed, "state": verify_identical(select.state_dict()),
            "sampler": state_digest(select.sampler.state_dict()), "stats": pool.stats()}


def stale(out: Path) -> dict:
    shared = DistributedPrioritizedSampler(sc.stale_sampler())
    rank, records = dist.get_rank(), []
    for step in range(sc.STALE_STEPS):
        batch = shared.next_batch()
        shared.feedback(batch, loss=sc.loss_of(batch.indices, step))
        if step % 3 == 2:
            rows = stale_rows(shared, sc.REFRESH)
            mine = rows[rank::2]  # each rank scores its share of the stale rows
            shared.feedback(mine, loss=sc.loss_of(mine, -step))
        records.append({"indices": batch.indices.tolist(), "weights": batch.weights.tolist(),
                        "probabilities": batch.probabilities.tolist()})
    return {"records": records, "state": verify_identical(shared.state_dict()),
            "digest": state_digest(shared.state_dict())}


def switch(out: Path) -> dict:
    def build():
        select = DistributedScoreThenSelect(DistributedPrioritizedSampler(sc.switch_sampler()), sc.switch())
        return select, select.selector

    select, switched = build()
    records = run_switch(select, switched, 0, sc.SWITCH_STEPS, out)
    resumed_select, resumed_switch = build()
    resumed_select.load_state_dict(load_shared_state(out / "switch.npz"))
    resumed = run_switch(resumed_select, resumed_switch, sc.SWITCH_SAVE, sc.SWITCH_STEPS, None)
    return {"records": records, "resumed": resumed, "state": verify_identical(select.state_dict()),
            "switch": state_digest(switched.state_dict()["switch"]), "stats": json_safe(switched.stats())}


def run_switch(select, switched, start: int, stop: int, out: Path | None) -> list:
    records = []
    for step in range(start, stop):
        if out is not None and step == sc.SWITCH_SAVE:
            save_shared_state(select.state_dict(), out / "switch.npz")
        candidates = select.next_candidates()
        if switched.selecting:
            chosen = select.choose(candidates, sc.switch_losses(candidates.indices, step))
            switched.step_done()
        else:
            chosen = switched.uniform(candidates, rows=sc.CHOSEN // 2)
            losses = sc.switch_losses(chosen.indices, step)  # this rank's trained rows
            everyone = [torch.zeros(len(chosen), dtype=torch.float64) for _ in range(2)]
            indices = [torch.zeros(len(chosen), dtype=torch.int64) for _ in range(2)]
            dist.all_gather(everyone, torch.as_tensor(losses))
            dist.all_gather(indices, torch.as_tensor(chosen.indices))
            switched.step_done(torch.cat(everyone).numpy(), indices=torch.cat(indices).numpy())
        records.append({"selecting": chosen.scores.size > 0 and bool(np.isfinite(chosen.scores).all()),
                        "chosen": chosen.indices.tolist()})
    return records


def json_safe(stats: dict) -> dict:
    return {k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in stats.items()
            if not isinstance(v, list)}


JOBS = {"reuse": reuse, "stale": stale, "switch": switch}


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    report = {name: job(out) for name, job in JOBS.items()}
    rank = int(os.environ["RANK"])
    (out / f"report-{rank}.json").write_text(json.dumps(report))
    shutdown()


if __name__ == "__main__":
    main()

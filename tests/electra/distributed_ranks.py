"""What each rank of the distributed tests runs (a module of its own, so spawned processes can import it).

`run_ranks` starts ``ranks`` processes with torchrun's environment variables set, so the code under test finds
its process group exactly as under torchrun. Each rank runs `rank_main` and writes a JSON report.
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import torch

EQUIVALENCE_BATCH = 8
EQUIVALENCE_STEPS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(ranks: int, jobs: list[dict], out: Path) -> list[dict]:
    """Run ``jobs`` (in order) on ``ranks`` spawned processes; return each rank's report."""
    import torch.multiprocessing as mp

    for stale in out.glob("port-*"):  # a port published for an earlier call must not be read for this one
        stale.unlink()
    mp.start_processes(rank_main, args=(ranks, jobs, str(out)), nprocs=ranks, join=True, start_method="spawn")
    return [json.loads((out / f"report-{rank}.json").read_text()) for rank in range(ranks)]


def rank_main(rank: int, ranks: int, jobs: list[dict], out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1")
    report = {}
    for number, job in enumerate(jobs):
        os.environ["MASTER_PORT"] = str(job_port(rank, Path(out, f"port-{number}")))
        report[job["name"]] = JOBS[job["kind"]](**job.get("args", {}))
    Path(out, f"report-{rank}.json").write_text(json.dumps(report))


def job_port(rank: int, published: Path, patience_seconds: float = 300.0) -> int:
    """A fresh rendezvous port for one job: rank 0 picks a free one right before the job and publishes it; the
    others wait for it. Ports picked ahead of time for later jobs can meanwhile be taken as ephemeral ports by
    the earlier jobs' own connections, which made CI fail once."""
    if rank == 0:
        partial = published.with_suffix(".partial")
        partial.write_text(str(free_port()))
        partial.replace(published)  # atomic: the others never read half a number
    deadline = time.monotonic() + patience_seconds
    while not published.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: rank 0 published no port at {published}")
        time.sleep(0.05)
    return int(published.read_text())


# ----------------------------------------------------------------------------- a pretraining run, observed
def observed_pretrain(config: dict) -> dict:
    """`pretrain` with two observers: after every optimizer step, are all ranks' parameters bit-identical? And
    which examples (by their original token ids) did this rank add to its buffer and sample from it?"""
    import torch.distributed as dist

    from replayloader_electra.pretrain import PretrainConfig, loop

    identical: list[bool] = []
    added: list[str] = []
    sampled: list[str] = []

    def make_optimizer(model, *args):
        optimizer = original_make_optimizer(model, *args)

        def compare(*_):
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            everyone = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
            dist.all_gather(everyone, flat)
            identical.append(all(torch.equal(everyone[0], other) for other in everyone[1:]))

        optimizer.register_step_post_hook(compare)
        return optimizer

    class RecordingBuffer(loop.ReplayBuffer):
        def add(self, examples, **kwargs):
            added.extend(row_keys(examples["original_ids"]))
            return super().add(examples, **kwargs)

        def sample(self, *args, **kwargs):
            sample = super().sample(*args, **kwargs)
            sampled.extend(row_keys(sample.data["original_ids"]))
            return sample

    original_make_optimizer = loop.make_optimizer
    loop.make_optimizer, loop.ReplayBuffer = make_optimizer, RecordingBuffer
    try:
        loop.pretrain(PretrainConfig(**config))
    finally:
        loop.make_optimizer, loop.ReplayBuffer = original_make_optimizer, RecordingBuffer.__bases__[0]
    return {"identical": identical, "added": added, "sampled": sampled}


def ghost_norms_against_loop(config: dict) -> dict:
    """A `tmr-grad_norm` run in which every step's ghost norms (from the rank's DDP backward, loss share
    included) are compared with the loop reference on the same examples at the same parameters (taken just
    before the optimizer step; run it without dropout): the largest relative difference per step."""
    from replayloader_electra.grad_norms import loop_grad_norms
    from replayloader_electra.pretrain import PretrainConfig, discriminator_losses, feedback, loop

    differences: list[float] = []
    seen: dict = {}
    original_signals, original_losses = feedback.GhostNormFeedback.signals, loop.discriminator_losses
    original_make_optimizer = loop.make_optimizer

    def losses(discriminator, data, *args):
        seen["data"] = data
        return original_losses(discriminator, data, *args)

    def make_optimizer(model, *args):
        optimizer = original_make_optimizer(model, *args)

        def reference(*_):
            seen["reference"] = loop_grad_norms(model.discriminator, lambda m, b: original_losses(m, b).per_example,
                                                seen["data"])

        optimizer.register_step_pre_hook(reference)
        return optimizer

    def signals(self, data, d, loss_scale):
        out = original_signals(self, data, d, loss_scale)
        expected = seen["reference"]
        differences.append(float(((out["grad_norm"].double() - expected).abs() / expected).max()))
        return out

    feedback.GhostNormFeedback.signals, loop.discriminator_losses, loop.make_optimizer = signals, losses, \
        make_optimizer
    try:
        loop.pretrain(PretrainConfig(**config))
    finally:
        feedback.GhostNormFeedback.signals, loop.discriminator_losses, loop.make_optimizer = original_signals, \
            original_losses, original_make_optimizer
    return {"relative_differences": differences}


def resumed_pretrain(checkpoint: str, output_dir: str) -> dict:
    """`pretrain --resume CHECKPOINT` into a fresh ``output_dir``: every rank restores its own state."""
    from replayloader_electra.pretrain import loop, resume_config

    loop.pretrain(resume_config(checkpoint, output_dir=output_dir, progress=False))
    return {}


def row_keys(ids: torch.Tensor) -> list[str]:
    return [",".join(map(str, row.tolist())) for row in ids.cpu()]


# ----------------------------------------------------------------------------- equivalence, explicit inputs
def equivalence_inputs() -> list[dict]:
    """Fixed examples, masks and replacements for every step: rows of different lengths, so the two halves of a
    batch hold different numbers of real and of masked tokens (the case that needs the loss shares)."""
    from replayloader_electra.pretrain import SpecialIds

    special = SpecialIds(pad=0, cls=2, sep=3, mask=4)
    rng = torch.Generator().manual_seed(0)
    steps = []
    for _ in range(EQUIVALENCE_STEPS):
        b, t = EQUIVALENCE_BATCH, 24
        ids = torch.randint(5, 200, (b, t), generator=rng)
        lengths = torch.tensor([24, 24, 24, 24, 9, 12, 7, 20])
        real = torch.arange(t)[None, :] < lengths[:, None]
        ids[:, 0] = special.cls
        ids[torch.arange(b), lengths - 1] = special.sep
        ids[~real] = special.pad
        inner = real & (ids != special.cls) & (ids != special.sep)
        masked = inner & (torch.rand((b, t), generator=rng) < 0.3)
        corrupted = ids.masked_fill(masked & (torch.rand((b, t), generator=rng) < 0.5),
                                    int(torch.randint(5, 200, (1,), generator=rng)))
        steps.append({"input_ids": ids, "attention_mask": real.long(), "masked": masked, "corrupted": corrupted})
    return steps


def equivalence_run(rows: slice | None = None) -> dict[str, torch.Tensor]:
    """`EQUIVALENCE_STEPS` joint steps of a tiny pair on `equivalence_inputs` (this rank's ``rows`` of each batch)
    through the production pieces: the run's world, its DDP wrapper, its loss shares and optimizer."""
    import torch.nn.functional as F

    from replayloader_electra.models import PRESETS, PairPart, build_electra_pair
    from replayloader_electra.pretrain import discriminator_losses, make_optimizer
    from replayloader_electra.pretrain.corruption import explicit_positions
    from replayloader_electra.pretrain.distributed import make_world

    world = make_world("cpu", 60)
    try:
        pair = build_electra_pair(PRESETS["tiny"], 200, 0, dropout=0.0, seed=0)
        model = world.wrap(pair)
        optimizer = make_optimizer(pair, 1e-3, 0.01)
        generator, discriminator = PairPart(model, "generator"), PairPart(model, "discriminator")
        for inputs in equivalence_inputs():
            part = {k: v[rows] if rows is not None else v for k, v in inputs.items()}
            positions, segments = explicit_positions(part["input_ids"])
            logits = generator(input_ids=part["input_ids"].masked_fill(part["masked"], 4),
                               attention_mask=part["attention_mask"], position_ids=positions,
                               token_type_ids=segments, masked=part["masked"])
            generator_loss = F.cross_entropy(logits, part["input_ids"][part["masked"]])
            data = {"input_ids": part["corrupted"], "original_ids": part["input_ids"],
                    "attention_mask": part["attention_mask"]}
            d = discriminator_losses(discriminator, data)
            share_g, share_d = world.loss_shares(int(part["masked"].sum()), d.mask.sum())  # as the loop: a tensor
            optimizer.zero_grad(set_to_none=True)
            (share_g * generator_loss + 50.0 * (share_d * d.loss)).backward()
            optimizer.step()
        return {name: p.detach().clone() for name, p in pair.named_parameters()}
    finally:
        world.close()


def distributed_equivalence() -> dict:
    """This rank's half of every batch; parameters returned as lists (JSON)."""
    rank, ranks = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    share = EQUIVALENCE_BATCH // ranks
    params = equivalence_run(slice(rank * share, (rank + 1) * share))
    return {name: p.reshape(-1).tolist() for name, p in params.items()}


JOBS = {"pretrain": observed_pretrain, "equivalence": distributed_equivalence,
        "ghost_norms": ghost_norms_against_loop, "resumed": resumed_pretrain}

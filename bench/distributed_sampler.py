"""DistributedPrioritizedSampler: what sharing one distribution across DDP ranks costs.

    python -m torch.distributed.run --nproc_per_node=2 -m bench.distributed_sampler gather
    python -m torch.distributed.run --nproc_per_node=2 -m bench.distributed_sampler select
    python -m torch.distributed.run --nproc_per_node=2 -m bench.distributed_sampler finetune [--overlap]
    python -m bench.distributed_sampler memory --sizes 10000000 --distributed
    python -m bench.distributed_sampler memory --sizes 100000000
    python -m bench.distributed_sampler report          # the tables of results/distributed_sampler/distributed_sampler.md

``gather``: per step, the bytes every rank receives and the time of `update` (all-gather + applying the merged
feedback) next to its parts: the bare collective, the local apply (what one process pays), and the draw; also
the same feedback sent with ``all_gather_object`` (pickled dicts) instead of our fixed-width int64 tensor.
``select``: score-then-select across ranks (`DistributedScoreThenSelect`, TopK with n_b = n_B / 10): the bytes
of the score all-gather per step and the time of ``choose`` next to the bare collective, one process's choice
among the same n_B candidates, and the draw.
``finetune``: the sampler's share (draw + update, called after the forward pass as in the recipes) of a DDP
fine-tuning step of a tiny BERT, per rank, with and without ``--overlap``. A barrier before `update` takes the
ranks' skew (one rank's forward ending later), reported apart: without it `update`'s gather would absorb that
wait, which DDP's all-reduce absorbs otherwise.
``memory``: bytes per example held by one rank's replica (RSS and tracemalloc), in the warm-up pass and after.
Each collective is timed right after a barrier (the ranks in step). Each measurement is merged into
``results/distributed_sampler/distributed_sampler.json`` (raw figures), from which ``report`` prints the tables. Times are medians
over ``--steps`` steps after 20 unmeasured ones.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import pickle
import platform
import resource
import statistics
import time
import tracemalloc
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
from replayloader import LinearSchedule, PrioritizedSampler  # noqa: E402

RESULTS = ROOT / "results" / "distributed_sampler" / "distributed_sampler.json"
WARM = 20


def machine() -> str:
    import torch

    return (f"{platform.machine()}, {os.cpu_count()} CPU cores (shared with other jobs), no GPU, Python "
            f"{platform.python_version()}, torch {torch.__version__}")


def record(name: str, command: str, rows: list[dict]) -> None:
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[name] = {"command": command, "date": datetime.datetime.now(datetime.timezone.utc)
                     .strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(), "rows": rows}
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")


def median_us(samples: list[float]) -> float:
    return round(statistics.median(samples[WARM:]) * 1e6, 1)


def make_sampler(n: int, batch: int) -> PrioritizedSampler:
    return PrioritizedSampler(n, batch_size=batch, beta=LinearSchedule(0.4, 1.0, 1000), uniform_fraction=0.1,
                              warmup_epochs=0, seed=0)


def timed(action) -> tuple[object, float]:
    started = time.perf_counter()
    result = action()
    return result, time.perf_counter() - started


def finish_on_ranks(name: str, rows: list[dict]) -> None:
    """Rank 0 records and prints the rows of the 2-rank measurement ``name``; then every rank leaves the group."""
    import torch.distributed as dist

    if dist.get_rank() == 0:
        record(name, f"python -m torch.distributed.run --nproc_per_node=2 -m bench.distributed_sampler {name}", rows)
        print(json.dumps(rows, indent=1))
    dist.barrier()
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- gather
def gather(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from replayloader.distributed import DistributedPrioritizedSampler

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    for local in args.batches:
        shared = DistributedPrioritizedSampler(make_sampler(args.n, local * world))
        reference = make_sampler(args.n, local * world)  # one process applying the same global feedback
        draw, update, collective, apply, as_objects = [], [], [], [], []
        row = np.zeros(shared.gather_width + 1, np.int64)
        for step in range(WARM + args.steps):
            batch, t = timed(shared.next_batch)
            draw.append(t)
            loss = torch.rand(len(batch), generator=torch.Generator().manual_seed(step * world + rank)) + 0.1
            dist.barrier()  # each collective timed with the ranks in step (in training, DDP's backward syncs them)
            _, t = timed(lambda: shared.feedback(batch, loss=loss))
            update.append(t)
            dist.barrier()
            _, t = timed(lambda: shared.world.all_gather_rows(row))
            collective.append(t)
            message = {"step": batch.step, "epoch": batch.epoch, "positions": batch.positions,
                       "indices": batch.indices, "loss": loss.numpy()}
            dist.barrier()
            _, t = timed(lambda: shared.world.all_gather_objects(message))
            as_objects.append(t)
            whole = reference.next_batch()
            _, t = timed(lambda: reference.feedback(whole, loss=np.full(len(whole), 0.5)))
            apply.append(t)
        rows.append({"world_size": world, "n": args.n, "global_batch": local * world, "local_batch": local,
                     "tensor_bytes_per_step": shared.counters["gathered_bytes"] // shared.counters["feedback_gathers"],
                     "object_bytes_per_step": world * len(pickle.dumps(message)),
                     "update_us": median_us(update), "collective_us": median_us(collective),
                     "apply_us": median_us(apply), "draw_us": median_us(draw),
                     "all_gather_object_us": median_us(as_objects)})
    finish_on_ranks("gather", rows)


# ----------------------------------------------------------------------------- select
def select(args: argparse.Namespace) -> None:
    """Score-then-select across ranks: per step, the bytes of the score all-gather and the time of `choose`
    (gather + the per-slice choice over all slices + the tree refresh) next to the bare collective and to what
    one process pays for choosing among the same n_B candidates (`ScoreThenSelect.choose`, no gather)."""
    import torch
    import torch.distributed as dist

    from replayloader.distributed import DistributedPrioritizedSampler
    from replayloader.distributed.select import DistributedScoreThenSelect
    from replayloader.selection.score_then_select import ScoreThenSelect
    from replayloader.selection import Selector, TopK

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    for local in args.batches:
        chosen = max(world, local * world // 10 // world * world)  # n_b = n_B / 10, divisible by the world size
        chooser = DistributedScoreThenSelect(DistributedPrioritizedSampler(make_sampler(args.n, local * world)),
                                             Selector(TopK(chosen), seed=0))
        reference = ScoreThenSelect(make_sampler(args.n, local * world), Selector(TopK(chosen), seed=0))
        draw, choose, collective, alone = [], [], [], []
        row = np.zeros(chooser.row_width, np.int64)
        for step in range(WARM + args.steps):
            candidates, t = timed(chooser.next_candidates)
            draw.append(t)
            losses = torch.rand(len(candidates), generator=torch.Generator().manual_seed(step * world + rank)) + 0.1
            dist.barrier()  # timed with the ranks in step
            _, t = timed(lambda: chooser.choose(candidates, losses))
            choose.append(t)
            dist.barrier()
            _, t = timed(lambda: chooser.world.all_gather_rows(row))
            collective.append(t)
            whole = reference.next_candidates()
            _, t = timed(lambda: reference.choose(whole, np.random.default_rng(step).random(len(whole)) + 0.1))
            alone.append(t)
        rows.append({"world_size": world, "n": args.n, "candidates_global": local * world,
                     "candidates_per_rank": local, "chosen_global": chosen,
                     "gathered_bytes_per_step": chooser.counters["gathered_bytes"] // chooser.counters["score_gathers"],
                     "choose_us": median_us(choose), "collective_us": median_us(collective),
                     "one_process_choose_us": median_us(alone), "draw_us": median_us(draw)})
    finish_on_ranks("select", rows)


# ----------------------------------------------------------------------------- finetune
def finetune(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn import functional as F
    from transformers import BertConfig, BertForSequenceClassification

    from replayloader.distributed import DistributedPrioritizedSampler

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 1000, (args.n, args.seq_len), generator=g)
    labels = torch.randint(0, 2, (args.n,), generator=g)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=512, max_position_embeddings=args.seq_len, num_labels=2)
    model = torch.nn.parallel.DistributedDataParallel(BertForSequenceClassification(config))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    shared = DistributedPrioritizedSampler(make_sampler(args.n, args.local_batch * world), overlap=args.overlap)
    sampler_time, step_time, wait_time, draw_time = [], [], [], []
    for _ in range(WARM + args.steps):
        started = time.perf_counter()
        batch, t_draw = timed(shared.next_batch)  # with overlap: also waits for the last gather and applies it
        index = torch.from_numpy(batch.indices)
        logits = model(input_ids=ids[index]).logits
        per_example = F.cross_entropy(logits, labels[index], reduction="none")
        loss = (per_example * torch.as_tensor(batch.weights, dtype=per_example.dtype)).mean()
        _, t_wait = timed(dist.barrier)  # the ranks' skew, which any collective (ours or DDP's) absorbs
        _, t_update = timed(lambda: shared.feedback(batch, loss=per_example.detach()))  # as in the recipes
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        sampler_time.append(t_draw + t_update)
        draw_time.append(t_draw)
        wait_time.append(t_wait)
        step_time.append(time.perf_counter() - started)
    times = torch.tensor([median_us(sampler_time), median_us(step_time), median_us(wait_time),
                          median_us(draw_time)], dtype=torch.float64)
    everyone = [torch.empty_like(times) for _ in range(world)]
    dist.all_gather(everyone, times)
    if rank == 0:
        rows = [{"overlap": args.overlap, "rank": r, "world_size": world, "n": args.n,
                 "global_batch": args.local_batch * world,
                 "seq_len": args.seq_len, "model": "BERT 2 layers, hidden 128, 2 heads, vocab 1000",
                 "sampler_us": t[0].item(), "of_which_draw_us": t[3].item(), "step_us": t[1].item(),
                 "skew_wait_us": t[2].item(),
                 "share_percent": round(100 * t[0].item() / t[1].item(), 3)} for r, t in enumerate(everyone)]
        record("finetune" + ("_overlap" if args.overlap else ""), "python -m torch.distributed.run "
               "--nproc_per_node=2 -m bench.distributed_sampler finetune" + (" --overlap" if args.overlap else ""),
               rows)
        print(json.dumps(rows, indent=1))
    dist.barrier()
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- memory
def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def memory(args: argparse.Namespace) -> None:
    if args.distributed:
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29591"))
        dist.init_process_group("gloo", rank=0, world_size=1)
    make_sampler(1000, 32).next_batch()  # kernels compiled (or loaded from the cache) before measuring
    rows = []
    for n in args.sizes:
        gc.collect()
        rss0 = rss_bytes()
        tracemalloc.start()
        sampler = PrioritizedSampler(n, batch_size=256, seed=0)  # warm-up pass first, as by default
        sampler.feedback(sampler.next_batch(), loss=np.full(256, 0.5))  # the pass's permutation now exists
        in_warmup, _ = tracemalloc.get_traced_memory()
        rss_warmup = rss_bytes() - rss0
        sampler.order = np.empty(0, np.int64)  # as after the pass (skipping it costs N / 256 draws)
        sampler.epoch = sampler.warmup_epochs
        gc.collect()
        after, peak = tracemalloc.get_traced_memory()
        row = {}
        if args.distributed:  # wrapping it (a 1-process gloo group): the construction check digests the state
            from replayloader.distributed import DistributedPrioritizedSampler

            tracemalloc.reset_peak()
            DistributedPrioritizedSampler(sampler)
            row["wrap_peak_bytes_per_example"] = round(tracemalloc.get_traced_memory()[1] / n, 1)
        tracemalloc.stop()
        rows.append({"n": n, "bytes_per_example_warmup": round(in_warmup / n, 1),
                     "bytes_per_example_after": round(after / n, 1), "peak_bytes_per_example": round(peak / n, 1),
                     **row,
                     "rss_bytes_per_example_warmup": round(rss_warmup / n, 1),
                     "tree_leaves": sampler.tree.n_leaves,
                     "tree_bytes_per_example": round(sampler.tree.nodes.nbytes / n, 1)})
        del sampler
        gc.collect()
    command = "python -m bench.distributed_sampler memory --sizes " + " ".join(map(str, args.sizes))
    record("memory" + ("" if args.distributed else f"_{args.sizes[-1]:.0e}"),
           command + (" --distributed" if args.distributed else ""), rows)
    print(json.dumps(rows, indent=1))


# ----------------------------------------------------------------------------- report
def report(_: argparse.Namespace) -> None:
    results = json.loads(RESULTS.read_text())
    for name, result in results.items():
        print(f"### {name}\n\nCommand: `{result['command']}`  \nDate: {result['date']}  \nMachine: "
              f"{result['machine']}\n")
        columns = list(result["rows"][0])
        print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
        for row in result["rows"]:
            print("| " + " | ".join(f"{row[c]:,}" if isinstance(row[c], (int, float)) else str(row[c])
                                    for c in columns) + " |")
        print()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("gather")
    p.add_argument("--n", type=int, default=67_349)
    p.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256, 1024], help="per-rank batch sizes")
    p.add_argument("--steps", type=int, default=300)
    p = sub.add_parser("select")
    p.add_argument("--n", type=int, default=67_349)
    p.add_argument("--batches", type=int, nargs="+", default=[32, 128, 512, 2048], help="candidates per rank")
    p.add_argument("--steps", type=int, default=300)
    p = sub.add_parser("finetune")
    p.add_argument("--n", type=int, default=67_349)
    p.add_argument("--local-batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--overlap", action="store_true", help="DistributedPrioritizedSampler(overlap=True)")
    p = sub.add_parser("memory")
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000_000])
    p.add_argument("--distributed", action="store_true", help="also the peak while wrapping it")
    sub.add_parser("report")
    args = parser.parse_args(argv)
    {"gather": gather, "select": select, "finetune": finetune, "memory": memory, "report": report}[args.command](args)


if __name__ == "__main__":
    main()

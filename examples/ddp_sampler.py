"""PrioritizedSampler under DDP: every rank draws the same global batch and trains on its share.

    torchrun --nproc_per_node=2 examples/ddp_sampler.py                  # 2 CPU processes (gloo)
    torchrun --nproc_per_node=2 examples/ddp_sampler.py --num-workers 1  # + a spawned DataLoader worker each

On GPUs the same command uses NCCL, one GPU per process. scikit-learn's digits train a small MLP wrapped in
DistributedDataParallel. Each rank builds the same `PrioritizedSampler` (same length, options and seed; its
``batch_size`` is the GLOBAL batch) and wraps it in a `DistributedPrioritizedSampler`: the ranks draw the same
global batch, each takes its share, and `feedback` gathers every rank's per-example losses so the sampler's
weights stay identical on all ranks. At the end `save_shared_state` checks that the ranks agree and writes one
file (``--state``) from which a run resumes on any number of ranks. `session` starts the process group, ends it
without an abort, and stops a rank whose launcher is gone.

Each rank prints its share of the work; rank 0 prints the test accuracy after each epoch.
"""
import argparse
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from replayloader import LinearSchedule, PrioritizedSampler
from replayloader.distributed import DistributedPrioritizedSampler, save_shared_state, session
from replayloader.torch import PrioritizedBatchSampler


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64, help="the global batch (all ranks together)")
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--state", default="sampler.npz", help="the sampler's shared state, written at the end")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(1)

    with session("nccl" if cuda else "gloo"):  # starts the group, watches the launcher, ends without an abort
        rank, world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
        x, y = load_digits(return_X_y=True)
        x_train, x_test, y_train, y_test = train_test_split((x / 16.0).astype(np.float32), y, test_size=0.25,
                                                            random_state=args.seed, stratify=y)
        train = TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))
        x_test, y_test = torch.from_numpy(x_test).to(device), torch.from_numpy(y_test).to(device)
        net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).to(device)
        model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[device.index] if cuda else None)
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

        steps = args.epochs * -(-len(train) // args.batch_size)
        sampler = PrioritizedSampler(len(train), batch_size=args.batch_size, beta=LinearSchedule(0.4, 1.0, steps),
                                     uniform_fraction=0.1, seed=args.seed)  # identical on every rank
        batches = PrioritizedBatchSampler(DistributedPrioritizedSampler(sampler, dataset_size=len(train)))
        workers = {} if args.num_workers == 0 else {  # never fork a rank: spawned workers, started once
            "num_workers": args.num_workers, "multiprocessing_context": "spawn", "persistent_workers": True}
        loader = DataLoader(train, batch_sampler=batches, pin_memory=cuda, **workers)

        started, trained, accuracy = time.perf_counter(), 0, []
        for epoch in range(args.epochs):
            batches.set_epoch(epoch)
            for xb, yb in loader:  # this rank's share: batch_size / world examples
                xb, yb = xb.to(device), yb.to(device)
                info = batches.next_batch_info()  # this rank's indices and importance weights
                per_example = F.cross_entropy(model(xb), yb, reduction="none")
                loss = (per_example * batches.importance_weights(info, per_example)).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                batches.feedback(info, loss=per_example.detach())  # a collective: every rank, once per batch
                trained += len(yb)
            with torch.no_grad():
                accuracy.append(float((net(x_test).argmax(1) == y_test).float().mean()))
            if rank == 0:
                print(f"epoch {epoch}: test accuracy {accuracy[-1]:.3f}", flush=True)
        seconds = time.perf_counter() - started

        save_shared_state(batches.state_dict(), args.state)  # compares the ranks' states, then one file
        stats = sampler.stats()
        print(f"rank {rank} of {world}: trained on {trained} examples in {seconds:.1f} s; sampler epoch "
              f"{sampler.epoch}, {stats['drawn']} global draws, never visited {stats['frac_never_visited']:.3f}",
              flush=True)
        if rank == 0:
            print(f"final test accuracy {accuracy[-1]:.3f}; shared sampler state in {args.state}", flush=True)
    return {"rank": rank, "world_size": world, "trained": trained, "accuracy": accuracy}


if __name__ == "__main__":  # spawned DataLoader workers import this file again: only the launched ranks train
    main()

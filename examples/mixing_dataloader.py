"""Online data mixing in a torch DataLoader: four synthetic sources, ODM against fixed mixtures.

One 4-class task on 32-dimensional inputs, from four sources: "easy" (a linear rule), "curved" (labels of a
random two-layer network, harder for the model), "noisy" (the easy rule with 40% of the labels flipped) and
"rare" (a small source from another region of the input space, with a rule of its own). The K datasets become
one through `concat_sources`; a `MixtureBatchSampler` draws each batch's per-source counts from the rule and
the per-example training losses go back to it. Held-out accuracy is measured per source, on clean labels.

    python examples/mixing_dataloader.py                          # ODM, 1000 steps (a few seconds)
    python examples/mixing_dataloader.py --rule stratified        # the same loop with equal shares
    python examples/mixing_dataloader.py --num-workers 2 --log weights.jsonl
    python -m replayloader.mixing.plot weights.jsonl -o weights.png

Prints the held-out accuracy per source, the final weights and how many examples each source gave.
"""
import argparse
import time

import numpy as np
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from replayloader.mixing import ODM, FixedMixture
from replayloader.torch import MixtureBatchSampler, concat_sources

NAMES = ["easy", "curved", "noisy", "rare"]
SIZES = [2000, 2000, 2000, 200]
DIM, CLASSES = 32, 4


def make_sources(seed: int, held_out: int = 500):
    """Per source: (train inputs, train labels, test inputs, clean test labels)."""
    rng = np.random.default_rng(seed)
    linear = rng.normal(size=(DIM, CLASSES))
    hidden, readout = rng.normal(size=(DIM, 64)), rng.normal(size=(64, CLASSES))
    rare_rule = rng.normal(size=(DIM, CLASSES))
    rules = [lambda x: x @ linear, lambda x: np.tanh(x @ hidden) @ readout, lambda x: x @ linear,
             lambda x: x @ rare_rule]
    sources = []
    for k, (n, rule) in enumerate(zip(SIZES, rules)):
        x = rng.normal(size=(n + held_out, DIM)) + (3.0 if NAMES[k] == "rare" else 0.0)
        y = rule(x).argmax(1)
        x[:, DIM - 1 - k] += 5.0  # a mark of the source, so that the model can tell the rules apart
        train_y = y[:n].copy()
        if NAMES[k] == "noisy":
            flip = rng.random(n) < 0.4
            train_y[flip] = rng.integers(0, CLASSES, size=flip.sum())
        as_x = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
        sources.append((as_x(x[:n]), torch.tensor(train_y), as_x(x[n:]), torch.tensor(y[n:])))
    return sources


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rule", choices=["odm", "stratified", "natural"], default="odm")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--log", default=None, help="write the weights to this JSONL file every 10 steps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    sources = make_sources(args.seed)

    rule = {"odm": ODM(), "stratified": FixedMixture.stratified(len(SIZES)),
            "natural": FixedMixture.natural(SIZES)}[args.rule]
    dataset, sampler = concat_sources([TensorDataset(x, y) for x, y, _, _ in sources], batch_size=args.batch_size,
                                      rule=rule, seed=args.seed, names=NAMES, log_path=args.log, log_every=10)
    batches = MixtureBatchSampler(sampler)
    workers = {} if args.num_workers == 0 else {  # spawned workers import this file again: see the guard below
        "num_workers": args.num_workers, "multiprocessing_context": "spawn", "persistent_workers": True}
    loader = DataLoader(dataset, batch_sampler=batches, **workers)

    model = torch.nn.Sequential(torch.nn.Linear(DIM, 128), torch.nn.ReLU(), torch.nn.Linear(128, CLASSES))
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    started, step = time.perf_counter(), 0
    while step < args.steps:
        for xb, yb in loader:
            info = batches.next_batch_info()  # indices, sources, the weights this batch was drawn with
            per_example = F.cross_entropy(model(xb), yb, reduction="none")
            optimizer.zero_grad()
            per_example.mean().backward()
            optimizer.step()
            batches.feedback(info, loss=per_example.detach())  # the losses the step computed anyway
            step += 1
            if step == args.steps:
                break
    seconds = time.perf_counter() - started

    with torch.no_grad():
        accuracy = {name: float((model(xt).argmax(1) == yt).float().mean())
                    for name, (_, _, xt, yt) in zip(NAMES, sources)}
    stats = sampler.stats()
    weights = dict(zip(NAMES, stats["weights"].round(3).tolist()))
    drawn = dict(zip(NAMES, stats["drawn"].tolist()))
    print(f"rule {args.rule}, num_workers={args.num_workers}: {args.steps} steps of {args.batch_size} in "
          f"{seconds:.1f} s")
    print("held-out accuracy: " + ", ".join(f"{n} {a:.3f}" for n, a in accuracy.items())
          + f"; mean {np.mean(list(accuracy.values())):.3f}")
    print(f"final weights: {weights}")
    print(f"examples drawn: {drawn}")
    return {"accuracy": accuracy, "weights": weights, "drawn": drawn, "steps": step}


if __name__ == "__main__":  # needed with --num-workers: spawned workers import this file without running it
    main()

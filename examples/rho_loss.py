"""Score, then select (RHO-LOSS): train on the candidates whose loss is high but learnable, against uniform.

scikit-learn's digits with ``--label-noise`` of the labels flipped outside the test split (which stays clean).
The non-test data is split in two: a training split, and a hold-out split on which a small irreducible-loss
model trains. Its checkpoint (the epoch) is chosen on a held-out slice of the hold-out split, never on the test
set; its losses on the training split are computed once by `irreducible_losses`. The main model then draws
n_B = ``--candidates`` uniform candidates a step, scores them with one no-grad forward pass, and trains on the
n_b = ``--batch-size`` with the highest reducible loss (training loss - irreducible loss): a flipped label has a
high training loss but also a high irreducible one, so it is rarely picked. The uniform arm trains on n_b
shuffled examples a step. Both arms start from the same weights and take the same number of steps.

    python examples/rho_loss.py
    python examples/rho_loss.py --label-noise 0 --target 0.9

Prints the irreducible-loss model's accuracy, then each arm's test accuracy curve, steps to ``--target`` and
final accuracy. Per step, selection costs one extra forward pass over n_B rows (docs/selection.md, cost model).
"""
import argparse
import copy
import itertools
import tempfile
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from replayloader import PrioritizedSampler, Selector
from replayloader.selection import ReducibleLoss, TopK, irreducible_losses
from replayloader.torch import CandidateBatchSampler, take_rows


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def accuracy(model, x, y) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def fit_irreducible(x, y, x_val, y_val, epochs: int, seed: int):
    """The irreducible-loss model: trained on the hold-out split, its best epoch chosen on the held-out slice."""
    torch.manual_seed(seed)
    model, best, best_accuracy = mlp(), None, -1.0
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-3)
    for _ in range(epochs):
        for rows in torch.randperm(len(x)).split(32):
            optimizer.zero_grad()
            F.cross_entropy(model(x[rows]), y[rows]).backward()
            optimizer.step()
        if (val := accuracy(model, x_val, y_val)) > best_accuracy:
            best, best_accuracy = copy.deepcopy(model), val
    return best, best_accuracy


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--candidates", type=int, default=320, help="n_B, candidates scored per step")
    parser.add_argument("--batch-size", type=int, default=32, help="n_b, rows trained on per step")
    parser.add_argument("--label-noise", type=float, default=0.2)
    parser.add_argument("--irreducible-epochs", type=int, default=30)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--target", type=float, default=0.9, help="test accuracy for steps-to-target")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_rest, x_test, y_rest, y_test = train_test_split(x, y, test_size=0.25, random_state=args.seed, stratify=y)
    flip = rng.random(len(y_rest)) < args.label_noise  # a flipped label becomes any other class
    y_rest = np.where(flip, (y_rest + rng.integers(1, 10, len(y_rest))) % 10, y_rest)
    x_train, x_hold, y_train, y_hold, flip_train, _ = train_test_split(x_rest, y_rest, flip, test_size=0.5,
                                                                       random_state=args.seed)
    x_fit, x_val, y_fit, y_val = train_test_split(x_hold, y_hold, test_size=0.2, random_state=args.seed)
    x_train, y_train, x_test, y_test = map(torch.from_numpy, (x_train, y_train, x_test, y_test))
    train = TensorDataset(x_train, y_train)

    found = {}

    def train_irreducible():
        found["model"], found["val"] = fit_irreducible(*map(torch.from_numpy, (x_fit, y_fit, x_val, y_val)),
                                                       args.irreducible_epochs, args.seed)
        return found["model"]

    def score(model):
        with torch.no_grad():
            return F.cross_entropy(model(x_train), y_train, reduction="none")

    with tempfile.TemporaryDirectory() as cache:  # saved with their cost; a later call with the path loads them
        irreducible = irreducible_losses(Path(cache) / "irreducible.npz", len(train), train_irreducible, score)
    print(f"irreducible-loss model: {len(x_fit)} hold-out examples, accuracy on the held-out slice that chose "
          f"its epoch {found['val']:.3f} (noisy labels too), test accuracy "
          f"{accuracy(found['model'], x_test, y_test):.3f}; losses for {len(train)} training examples in "
          f"{irreducible.train_wall_s + irreducible.score_wall_s:.1f} s")

    torch.manual_seed(args.seed)
    start = mlp()
    results = {}
    for arm in ("uniform", "rho_loss"):
        model = copy.deepcopy(start)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        if arm == "uniform":
            loader = DataLoader(train, batch_size=args.batch_size, shuffle=True,
                                generator=torch.Generator().manual_seed(args.seed))
        else:
            sampler = PrioritizedSampler(len(train), batch_size=args.candidates, alpha=0.0, seed=args.seed)
            selector = Selector(TopK(args.batch_size), ReducibleLoss(irreducible.losses), seed=args.seed)
            batches = CandidateBatchSampler(sampler, selector)
            loader = DataLoader(train, batch_sampler=batches)
        curve, picked, picked_flipped = {}, 0, 0
        batches_forever = itertools.chain.from_iterable(itertools.repeat(loader))
        for step, (xb, yb) in zip(range(1, args.steps + 1), batches_forever):
            if arm == "rho_loss":
                candidates = batches.next_batch_info()
                with torch.no_grad():  # the scoring pass over n_B candidates
                    losses = F.cross_entropy(model(xb), yb, reduction="none")
                chosen = batches.choose(candidates, losses)  # top n_b by training loss - irreducible loss
                xb, yb = take_rows((xb, yb), chosen.positions)
                picked, picked_flipped = picked + len(chosen.indices), picked_flipped + flip_train[chosen.indices].sum()
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % args.eval_every == 0:
                curve[step] = accuracy(model, x_test, y_test)
        reached = next((s for s, a in curve.items() if a >= args.target), None)
        results[arm] = {"curve": curve, "steps_to_target": reached, "accuracy": curve[max(curve)]}
        print(f"{arm:>8}: test accuracy every {args.eval_every} steps " + " ".join(f"{a:.2f}" for a in curve.values()))
    share = picked_flipped / picked
    print(f"rho_loss trained on {share:.1%} flipped labels; {flip_train.mean():.1%} of the training split are flipped")
    for arm, result in results.items():
        print(f"{arm:>8}: steps to {args.target:.2f} test accuracy: {result['steps_to_target'] or 'not reached'}; "
              f"accuracy after {args.steps} steps {result['accuracy']:.3f}")
    return {"irreducible_val_accuracy": found["val"], "flipped_share_selected": float(share), **results}


if __name__ == "__main__":
    main()

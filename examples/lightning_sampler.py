"""PrioritizedModule: a Lightning module whose training batches come from a PrioritizedSampler.

    python examples/lightning_sampler.py                   # 1 CPU device
    python examples/lightning_sampler.py --devices 2       # 2 CPU processes under DDP (Lightning starts them)

scikit-learn's digits train a small MLP. The module subclasses `PrioritizedModule`: its train DataLoader draws
batches from the sampler (``prioritized_dataloader``), and ``training_step`` returns ``prioritized_loss``, which
feeds the per-example losses back and returns their importance-weighted mean. The sampler's ``batch_size`` is
the global batch; under DDP each process trains its share and the feedback is gathered across processes, so the
Trainer must keep its hands off the sampler: ``use_distributed_sampler=False``. The sampler's state rides in
Lightning's checkpoints (resume with ``trainer.fit(model, ckpt_path=...)``).

Prints the test accuracy (on the first process) and the sampler's statistics.
"""
import argparse
import time

import lightning.pytorch as pl
import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from replayloader import LinearSchedule, PrioritizedSampler
from replayloader.torch import PrioritizedModule


class DigitsModel(PrioritizedModule):
    def __init__(self, dataset: TensorDataset, sampler: PrioritizedSampler, lr: float) -> None:
        super().__init__(sampler)
        self.dataset, self.lr = dataset, lr
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))

    def train_dataloader(self):
        return self.prioritized_dataloader(self.dataset)  # num_workers=... etc. go to the DataLoader

    def training_step(self, batch, batch_idx):
        x, y = batch
        info = self.batch_info()  # this process's indices and importance weights
        loss = self.prioritized_loss(info, F.cross_entropy(self.net(x), y, reduction="none"))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="the global batch (all devices together)")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--alpha", type=float, default=1.0, help="priority exponent (0: uniform draws)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    pl.seed_everything(args.seed, verbose=False)
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split((x / 16.0).astype(np.float32), y, test_size=0.25,
                                                        random_state=args.seed, stratify=y)
    train = TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))
    steps = args.epochs * -(-len(train) // args.batch_size)
    sampler = PrioritizedSampler(len(train), batch_size=args.batch_size, alpha=args.alpha,
                                 beta=LinearSchedule(0.4, 1.0, steps), uniform_fraction=0.1, seed=args.seed)
    model = DigitsModel(train, sampler, lr=3e-3)
    trainer = pl.Trainer(max_epochs=args.epochs, accelerator="cpu", devices=args.devices,
                         strategy="ddp" if args.devices > 1 else "auto",
                         use_distributed_sampler=False,  # the sampler shares its draws across processes itself
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    started = time.perf_counter()
    trainer.fit(model)
    seconds = time.perf_counter() - started

    with torch.no_grad():
        accuracy = float((model.net(torch.from_numpy(x_test)).argmax(1) == torch.from_numpy(y_test)).float().mean())
    stats = sampler.stats()
    if trainer.is_global_zero:
        print(f"{trainer.world_size} device(s), alpha {args.alpha}: {trainer.global_step} steps in "
              f"{seconds:.1f} s; test accuracy {accuracy:.3f}")
        print(f"sampler: epoch {sampler.epoch}, {stats['drawn']} draws ({stats['uniform_draws']} uniform), "
              f"never visited {stats['frac_never_visited']:.3f}, weight std {sampler.weights.std():.3f}")
    return {"accuracy": accuracy, "steps": trainer.global_step, "epoch": sampler.epoch,
            "world_size": trainer.world_size}


if __name__ == "__main__":  # Lightning starts the other processes by running this script again
    main()

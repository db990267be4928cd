"""Noisy-label SST-2: does choosing each batch by fresh scores beat uniform sampling? (issue 22, measurement 1)

Data: GLUE SST-2 from ``--glue-dir`` (train.tsv, dev.tsv). A fixed share of the training labels is flipped with a
fixed flip seed (dev labels stay clean); the noisy training set is split once (fixed split seed) into a training
split and a held-out split for RHO-LOSS's irreducible-loss model, as in Mindermann et al. 2022. Every arm
trains on the training split only.

Model: fastText-style bag of hashed unigrams and bigrams (an `EmbeddingBag` mean, then a linear layer), one torch
thread. Arms (n_b = 64 rows trained per step):

- ``uniform``: shuffled passes over the training split.
- ``prioritized``: the library's `PrioritizedSampler` (P ∝ latest loss, 10% uniform draws, importance weights
  with beta 0.4 → 1, prioritized from the start).
- ``topk``: online batch selection: 640 uniform candidates scored, the 64 highest training losses trained.
- ``sb``: SelectiveBackprop: 192 uniform candidates, each kept with P = percentile^2 (expected 64).
- ``rho``: RHO-LOSS: 640 uniform candidates, the 64 highest reducible losses (training loss − irreducible
  loss from a model of the same architecture trained on the held-out split; its cost is recorded).

Each run evaluates dev accuracy every ``--eval-every`` steps and writes its records (one JSON line per
evaluation) to ``RUNS/<run>.jsonl``, rewritten atomically after every evaluation; a run whose file ends with its
final record is skipped when the driver is started again. ``--collect OUT.jsonl.gz`` gathers the finished runs.

    python -m experiments.noisy_sst2 --runs runs/noisy_sst2 --jobs 2
    python -m experiments.noisy_sst2 --runs runs/noisy_sst2 --collect results/noisy_sst2/noisy_sst2.jsonl.gz
    python -m experiments.noisy_sst2_summary results/noisy_sst2/noisy_sst2.jsonl.gz --out results/noisy_sst2/noisy_sst2.md
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from replayloader import LinearSchedule, PrioritizedSampler  # noqa: E402
from replayloader.state.atomic import atomic_write_bytes, atomic_write_text  # noqa: E402
from replayloader.selection.irreducible import irreducible_losses  # noqa: E402
from replayloader.selection.score_then_select import ScoreThenSelect  # noqa: E402
from replayloader.selection import ReducibleLoss, SelectiveBackprop, Selector, TopK  # noqa: E402

ARMS = ("uniform", "prioritized", "topk", "sb", "rho")
DEFAULT_GLUE = Path(__file__).resolve().parents[2] / "shared" / "data" / "glue"


@dataclass(frozen=True)
class Config:
    """Everything a run depends on besides its arm, noise and seed (recorded in every line)."""

    steps: int = 3000
    eval_every: int = 50
    batch: int = 64  # n_b
    candidates: int = 640  # n_B of topk and rho (n_b / n_B = 10%, RHO-LOSS's setting)
    sb_candidates: int = 192  # n_B of SelectiveBackprop
    sb_beta: float = 2.0
    sb_history: int = 1024
    buckets: int = 1 << 17
    dim: int = 32
    lr: float = 0.01
    holdout: float = 0.2  # share of the noisy training set held out for the irreducible-loss model
    il_epochs: int = 2  # epochs of the irreducible-loss model over the held-out split
    flip_seed: int = 12345
    split_seed: int = 2026


# ------------------------------------------------------------------------------------------------ data
def read_tsv(path: Path) -> tuple[list[str], np.ndarray]:
    lines = path.read_text(encoding="utf-8").splitlines()[1:]
    sentences, labels = zip(*(line.rsplit("\t", 1) for line in lines))
    return list(sentences), np.array(labels, np.int64)


def hashed_features(sentence: str, buckets: int) -> list[int]:
    """Hashed lowercase unigrams and bigrams (crc32: the same ids on every machine); 0 is padding."""
    words = sentence.lower().split()
    grams = words + [f"{a} {b}" for a, b in zip(words, words[1:])]
    return [1 + zlib.crc32(g.encode()) % (buckets - 1) for g in grams] or [0]


def padded(rows: list[list[int]]) -> np.ndarray:
    out = np.zeros((len(rows), max(map(len, rows))), np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


@dataclass
class Data:
    train_x: np.ndarray  # (N, L) token ids of the training split, 0-padded
    train_y: np.ndarray  # noisy labels
    train_flipped: np.ndarray  # bool: the label was flipped
    held_x: np.ndarray
    held_y: np.ndarray
    dev_x: np.ndarray
    dev_y: np.ndarray


def load_data(glue_dir: Path, noise: float, cfg: Config) -> Data:
    sentences, labels = read_tsv(glue_dir / "SST-2" / "train.tsv")
    dev_sentences, dev_y = read_tsv(glue_dir / "SST-2" / "dev.tsv")
    n = len(labels)
    flipped = np.zeros(n, bool)
    flipped[np.random.default_rng(cfg.flip_seed).permutation(n)[: round(noise * n)]] = True
    noisy = np.where(flipped, 1 - labels, labels)
    x = padded([hashed_features(s, cfg.buckets) for s in sentences])
    order = np.random.default_rng(cfg.split_seed).permutation(n)
    held, train = np.sort(order[: round(cfg.holdout * n)]), np.sort(order[round(cfg.holdout * n):])
    return Data(x[train], noisy[train], flipped[train], x[held], noisy[held],
                padded([hashed_features(s, cfg.buckets) for s in dev_sentences]), dev_y)


def rows(x: np.ndarray, index: np.ndarray) -> torch.Tensor:
    """The rows ``index`` of a padded id matrix, trimmed to their longest row."""
    picked = x[index]
    width = max(int((picked != 0).sum(1).max()), 1)
    return torch.from_numpy(np.ascontiguousarray(picked[:, :width]))


# ------------------------------------------------------------------------------------------------ model
class BagOfNgrams(torch.nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.embed = torch.nn.EmbeddingBag(cfg.buckets, cfg.dim, mode="mean", padding_idx=0, sparse=True)
        self.out = torch.nn.Linear(cfg.dim, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(ids))


def per_example_loss(model: torch.nn.Module, x: np.ndarray, y: np.ndarray, index: np.ndarray) -> torch.Tensor:
    return F.cross_entropy(model(rows(x, index)), torch.from_numpy(y[index]), reduction="none")


def evaluate(model: torch.nn.Module, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    with torch.no_grad():
        logits = model(torch.from_numpy(x))
        return float((logits.argmax(1).numpy() == y).mean()), float(F.cross_entropy(logits, torch.from_numpy(y)))


class Optimizers:
    """Sparse Adam for the embedding (a step touches only the rows in the batch), Adam for the rest."""

    def __init__(self, model: BagOfNgrams, lr: float) -> None:
        self.parts = [torch.optim.SparseAdam(model.embed.parameters(), lr=lr),
                      torch.optim.Adam(model.out.parameters(), lr=lr)]

    def zero_grad(self) -> None:
        for part in self.parts:
            part.zero_grad()

    def step(self) -> None:
        for part in self.parts:
            part.step()


def make_model(cfg: Config, seed: int) -> tuple[BagOfNgrams, Optimizers]:
    torch.manual_seed(seed)
    model = BagOfNgrams(cfg)
    return model, Optimizers(model, cfg.lr)


def train_plain(model, optimizer, x, y, steps: int, batch: int, seed: int) -> None:
    """Uniform shuffled passes (the irreducible-loss model's training)."""
    rng = np.random.default_rng(seed)
    order = np.empty(0, np.int64)
    for _ in range(steps):
        if len(order) < batch:
            order = np.concatenate([order, rng.permutation(len(x))])
        index, order = order[:batch], order[batch:]
        loss = per_example_loss(model, x, y, index).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def irreducible(data: Data, cfg: Config, seed: int, path: Path):
    """RHO-LOSS's irreducible losses of the training split, computed once per (noise, seed) and saved."""
    def train():
        model, optimizer = make_model(cfg, seed + 1000)
        steps = cfg.il_epochs * len(data.held_x) // cfg.batch
        train_plain(model, optimizer, data.held_x, data.held_y, steps, cfg.batch, seed + 1000)
        return model

    def score(model):
        with torch.no_grad():
            return np.concatenate([per_example_loss(model, data.train_x, data.train_y, chunk).numpy()
                                   for chunk in np.array_split(np.arange(len(data.train_x)), 64) if len(chunk)])

    return irreducible_losses(path, len(data.train_x), train, score)


# ------------------------------------------------------------------------------------------------ arms
class Uniform:
    """Shuffled passes, n_b rows per step, nothing scored."""

    def __init__(self, n: int, cfg: Config, seed: int) -> None:
        self.sampler = PrioritizedSampler(n, cfg.batch, alpha=0.0, warmup_epochs=1 << 30, seed=seed)

    def step(self, model, data: Data):
        batch = self.sampler.next_batch()
        return batch.indices, np.ones(len(batch)), 0, lambda losses: None


class Prioritized:
    """The library's loss-prioritized sampler, fed back each trained row's loss."""

    def __init__(self, n: int, cfg: Config, seed: int) -> None:
        self.sampler = PrioritizedSampler(n, cfg.batch, alpha=1.0, beta=LinearSchedule(0.4, 1.0, cfg.steps),
                                          uniform_fraction=0.1, warmup_epochs=0, seed=seed)

    def step(self, model, data: Data):
        batch = self.sampler.next_batch()
        return batch.indices, batch.weights, 0, lambda losses: self.sampler.feedback(batch, loss=losses)


class Select:
    """Score-then-select: n_B uniform candidates scored by one no-grad forward, n_b (or SB's share) trained."""

    def __init__(self, n: int, candidates: int, selector: Selector, seed: int) -> None:
        sampler = PrioritizedSampler(n, candidates, alpha=0.0, warmup_epochs=1 << 30, seed=seed)
        self.select = ScoreThenSelect(sampler, selector, refresh=False)  # uniform candidates: weights unused

    def step(self, model, data: Data):
        candidates = self.select.next_candidates()
        with torch.no_grad():
            losses = per_example_loss(model, data.train_x, data.train_y, candidates.indices)
        chosen = self.select.choose(candidates, losses)
        return chosen.indices, chosen.weights, len(candidates), lambda losses: None


def make_arm(arm: str, data: Data, cfg: Config, seed: int, il_path: Path):
    n = len(data.train_x)
    if arm == "uniform":
        return Uniform(n, cfg, seed), None
    if arm == "prioritized":
        return Prioritized(n, cfg, seed), None
    if arm == "topk":
        return Select(n, cfg.candidates, Selector(TopK(cfg.batch), seed=seed), seed), None
    if arm == "sb":
        rule = SelectiveBackprop(selectivity=cfg.sb_beta, history=cfg.sb_history)
        return Select(n, cfg.sb_candidates, Selector(rule, seed=seed), seed), None
    if arm == "rho":
        il = irreducible(data, cfg, seed, il_path)
        return Select(n, cfg.candidates, Selector(TopK(cfg.batch), ReducibleLoss(il.losses), seed=seed), seed), il
    raise ValueError(f"arm must be one of {ARMS}, got {arm!r}")


# ------------------------------------------------------------------------------------------------ one run
def run_name(arm: str, noise: float, seed: int) -> str:
    return f"{arm}_noise{round(noise * 100):02d}_seed{seed}"


def finished(path: Path) -> bool:
    if not path.exists():
        return False
    lines = path.read_text().splitlines()
    return bool(lines) and json.loads(lines[-1]).get("final", False)


def run(arm: str, noise: float, seed: int, runs: Path, glue_dir: Path, cfg: Config) -> str:
    """Train one arm; one JSON line per evaluation, the file rewritten atomically each time."""
    torch.set_num_threads(1)
    name = run_name(arm, noise, seed)
    out = runs / f"{name}.jsonl"
    if finished(out):
        return f"{name}: done before"
    data = load_data(glue_dir, noise, cfg)
    model, optimizer = make_model(cfg, seed)
    il_path = runs / f"irreducible_noise{round(noise * 100):02d}_seed{seed}.npz"
    strategy, il = make_arm(arm, data, cfg, seed, il_path)
    head = {"arm": arm, "noise": noise, "seed": seed, "config": asdict(cfg), "n_train": len(data.train_x),
            "n_heldout": len(data.held_x), "n_dev": len(data.dev_x)}
    if il is not None:
        head["irreducible"] = {"train_cpu_s": il.train_cpu_s, "score_cpu_s": il.score_cpu_s,
                               "train_wall_s": il.train_wall_s, "score_wall_s": il.score_wall_s}
    records, cpu, wall = [], 0.0, 0.0
    scored = trained = mislabelled = 0
    for step in range(1, cfg.steps + 1):
        c0, w0 = time.process_time(), time.perf_counter()
        index, weights, n_scored, feedback = strategy.step(model, data)
        losses = per_example_loss(model, data.train_x, data.train_y, index)
        loss = (losses * torch.as_tensor(weights, dtype=losses.dtype)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        feedback(losses.detach())
        cpu += time.process_time() - c0
        wall += time.perf_counter() - w0
        scored += n_scored
        trained += len(index)
        mislabelled += int(data.train_flipped[index].sum())
        if step % cfg.eval_every == 0 or step == cfg.steps:
            accuracy, dev_loss = evaluate(model, data.dev_x, data.dev_y)
            records.append({**head, "step": step, "cpu_s": cpu, "wall_s": wall, "scored_rows": scored,
                            "trained_rows": trained, "selected_mislabelled": mislabelled,
                            "dev_accuracy": accuracy, "dev_loss": dev_loss, "final": step == cfg.steps})
            atomic_write_text(out, "".join(json.dumps(r) + "\n" for r in records))
    return f"{name}: dev accuracy {records[-1]['dev_accuracy']:.4f}, {cpu:.1f} CPU s"


# ------------------------------------------------------------------------------------------------ driver
def collect(runs: Path, out: Path) -> int:
    lines = [line for path in sorted(runs.glob("*.jsonl")) if finished(path) for line in
             path.read_text().splitlines()]
    atomic_write_bytes(out, gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0))
    return len(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=Path("runs/noisy_sst2"))
    parser.add_argument("--glue-dir", type=Path, default=DEFAULT_GLUE)
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--noise", nargs="+", type=float, default=[0.2, 0.1, 0.0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=Config.steps)
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, one torch thread each")
    parser.add_argument("--collect", type=Path, help="write the finished runs' records to this .jsonl.gz and stop")
    args = parser.parse_args(argv)
    if args.collect:
        print(f"{collect(args.runs, args.collect)} records -> {args.collect}")
        return
    args.runs.mkdir(parents=True, exist_ok=True)
    cfg = Config(steps=args.steps)
    # seeds outermost: a partial grid is a complete set of paired arms for the seeds it has
    jobs = [(arm, noise, seed) for seed in args.seeds for noise in args.noise for arm in args.arms]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run, arm, noise, seed, args.runs, args.glue_dir, cfg) for arm, noise, seed in jobs]
        for future in futures:
            print(time.strftime("%H:%M:%S"), future.result(), flush=True)


if __name__ == "__main__":
    main()

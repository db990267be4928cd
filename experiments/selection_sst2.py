"""Selection that pays in wall time? CPU seconds to a dev accuracy on noisy SST-2, IL model included (issue 28).

Data: GLUE SST-2 (``--data-dir``, default ``$REPLAYLOADER_DATA``; files ``glue/SST-2/train.tsv`` and ``dev.tsv``).
20% of the training labels are flipped (fixed flip seed); dev stays clean. The noisy training set is split once
(fixed split seed) into a 50% training split (every arm trains on it) and a 50% hold-out split on which the
irreducible-loss (IL) model trains. The IL model's checkpoint is chosen on a held-out slice of the hold-out
split (its noisy labels), never on dev. One IL model serves every run (one IL model per data/noise split,
reused across seeds and arms); its cost is recorded in every run's record.

Model: bag of hashed unigrams + bigrams (EmbeddingBag mean, 2^17 buckets, dim 64, embedding init U(±1/dim)),
linear head, sparse Adam lr 3e-3, n_b = 32 rows trained per step, one torch thread.

Arms (``--arms``): uniform, rho (top 32 of 320 by reducible loss), rho-pool128 (top 32 of 128), rho-reuse4 (one
scored pool of 320 feeds 4 steps), stale-tree (`PrioritizedSampler` weighted by a stale reducible loss, no
scoring forward), switch (the library's automatic switch over rho), recommended (fixed in the protocol after the
pilot: top 32 of 64 by reducible loss, with the cheap IL model: dim 8, batch 256, 1 epoch, its checkpoint
chosen on the same held-out slice).

Each run trains ``--steps`` steps and evaluates dev accuracy every ``--eval-every`` steps; CPU seconds
(``time.process_time``) and wall seconds (``time.perf_counter``) are summed over the training steps only
(candidate drawing, scoring forwards, selection, training forward/backward/optimizer, feedback), never over
evaluation. One JSON record per run: ``OUT/runs/<arm>-seed<k>.json`` (written atomically at the end); an
existing record is skipped.

    python -m experiments.selection_sst2 --il-only                      # fit (or load) the IL model
    python -m experiments.selection_sst2 --arms uniform rho --seeds 0 1 2 3 4
    python -m experiments.selection_summary
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import time
import zlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
ROOT = Path(__file__).resolve().parents[1]
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from experiments.noisy_sst2 import Optimizers, hashed_features, padded, read_tsv, rows  # noqa: E402
from replayloader import PrioritizedSampler  # noqa: E402
from replayloader.state.atomic import atomic_write_text  # noqa: E402
from replayloader.selection import ReducibleLoss, Selector, TopK  # noqa: E402
from replayloader.selection.score_then_select import ScoreThenSelect  # noqa: E402

ARMS = ("uniform", "rho", "rho-pool128", "rho-reuse4", "stale-tree", "switch", "recommended")
TF_ARMS = ("tf-uniform", "tf-rho", "tf-pool64")  # stretch: the small-transformer regime (protocol section)
PILOT_ARMS = ("pilot-rho-cheapil", "pilot-pool128-cheapil", "pilot-pool64-cheapil")  # pilot only (seeds >= 100), never in the results
OUT = ROOT / "results" / "selection"


@dataclass(frozen=True)
class Config:
    steps: int = 2000  # budget per run (a run that never reaches a target is censored here)
    eval_every: int = 10
    batch: int = 32  # n_b
    pool: int = 320  # n_B of rho
    small_pool: int = 128  # n_B of rho-pool128
    reuse: int = 4  # steps fed by one scored pool (rho-reuse4)
    recommended_pool: int = 64  # recommended: top 32 of 64 by reducible loss under the cheap IL model
    buckets: int = 1 << 17
    dim: int = 64
    lr: float = 3e-3
    noise: float = 0.2
    holdout: float = 0.5  # share of the noisy training set held out for the IL model
    il_val: float = 0.2  # share of the hold-out split held out again to choose the IL checkpoint
    il_epochs: int = 2
    il_eval_every: int = 100  # IL steps between checkpoint evaluations on the held-out slice
    il_seed: int = 7
    # the cheap IL model (same hold-out split and held-out slice, a smaller and faster bag model)
    cheap_il_dim: int = 8
    cheap_il_batch: int = 256
    cheap_il_lr: float = 3e-2
    cheap_il_epochs: int = 1
    cheap_il_eval_every: int = 15
    flip_seed: int = 12345
    split_seed: int = 2026
    # the small transformer (stretch): hashed unigram tokens, learned positions, mean-pooled encoder
    tf_vocab: int = 1 << 15
    tf_dim: int = 64
    tf_heads: int = 4
    tf_layers: int = 2
    tf_ff: int = 128
    tf_max_len: int = 48
    tf_lr: float = 3e-3
    tf_steps: int = 1000  # the transformer's budget per run
    tf_eval_every: int = 20
    tf_stop_at: float = 0.70  # a transformer run stops at its first evaluation >= this (its highest target)
    stale_refresh_every: int = 50  # stale-tree: steps between periodic refreshes
    stale_refresh_rows: int = 320  # stale-tree: rows rescored per refresh


# ------------------------------------------------------------------------------------------------ data
def data_dir(arg: str | None) -> Path:
    root = arg or os.environ.get("REPLAYLOADER_DATA")
    if not root:
        raise SystemExit("set REPLAYLOADER_DATA or pass --data-dir (the folder holding glue/SST-2/)")
    return Path(root)


@dataclass
class Data:
    train_x: np.ndarray
    train_y: np.ndarray
    train_flipped: np.ndarray
    fit_x: np.ndarray  # the IL model's training part of the hold-out split
    fit_y: np.ndarray
    val_x: np.ndarray  # the held-out slice of the hold-out split (noisy labels): chooses the IL checkpoint
    val_y: np.ndarray
    dev_x: np.ndarray
    dev_y: np.ndarray


def hashed_tokens(sentence: str, vocab: int, max_len: int) -> list[int]:
    """Hashed lowercase unigrams in order (crc32), at most ``max_len``; 0 is padding, an empty phrase is [1]."""
    words = sentence.lower().split()[:max_len]
    return [1 + zlib.crc32(w.encode()) % (vocab - 1) for w in words] or [1]


def load_data(root: Path, cfg: Config, tokens: bool = False) -> Data:
    sentences, labels = read_tsv(root / "glue" / "SST-2" / "train.tsv")
    dev_sentences, dev_y = read_tsv(root / "glue" / "SST-2" / "dev.tsv")
    n = len(labels)
    flipped = np.zeros(n, bool)
    flipped[np.random.default_rng(cfg.flip_seed).permutation(n)[: round(cfg.noise * n)]] = True
    noisy = np.where(flipped, 1 - labels, labels)
    featurize = ((lambda s: hashed_tokens(s, cfg.tf_vocab, cfg.tf_max_len)) if tokens
                 else (lambda s: hashed_features(s, cfg.buckets)))
    x = padded([featurize(s) for s in sentences])
    order = np.random.default_rng(cfg.split_seed).permutation(n)
    n_held = round(cfg.holdout * n)
    held, train = order[:n_held], np.sort(order[n_held:])
    n_val = round(cfg.il_val * n_held)
    val, fit = np.sort(held[:n_val]), np.sort(held[n_val:])
    return Data(x[train], noisy[train], flipped[train], x[fit], noisy[fit], x[val], noisy[val],
                padded([featurize(s) for s in dev_sentences]), dev_y)


# ------------------------------------------------------------------------------------------------ model
class BagOfNgrams(torch.nn.Module):
    """The bag model with the small embedding init U(±1/dim) of the setup that reproduced RHO-LOSS (noisy_sst2's
    has torch's default; the init comes before the head is built, so the RNG order, and the records, stay)."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.embed = torch.nn.EmbeddingBag(cfg.buckets, cfg.dim, mode="mean", padding_idx=0, sparse=True)
        with torch.no_grad():
            self.embed.weight.uniform_(-1.0 / cfg.dim, 1.0 / cfg.dim)
            self.embed.weight[0].zero_()
        self.out = torch.nn.Linear(cfg.dim, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(ids))


class TinyEncoder(torch.nn.Module):
    """A 2-layer transformer encoder over hashed unigram tokens, mean-pooled over the real tokens, linear head."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(cfg.tf_vocab, cfg.tf_dim, padding_idx=0, sparse=True)
        self.pos = torch.nn.Parameter(0.02 * torch.randn(cfg.tf_max_len, cfg.tf_dim))
        layer = torch.nn.TransformerEncoderLayer(cfg.tf_dim, cfg.tf_heads, cfg.tf_ff, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, cfg.tf_layers, enable_nested_tensor=False)
        self.out = torch.nn.Linear(cfg.tf_dim, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pad = ids == 0
        h = self.encoder(self.embed(ids) + self.pos[: ids.shape[1]], src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).to(h.dtype)
        return self.out((h * keep).sum(1) / keep.sum(1).clamp(min=1.0))


class TfOptimizers(Optimizers):
    def __init__(self, model: TinyEncoder, lr: float) -> None:
        rest = [p for name, p in model.named_parameters() if not name.startswith("embed.")]
        self.parts = [torch.optim.SparseAdam(model.embed.parameters(), lr=lr), torch.optim.Adam(rest, lr=lr)]


def make_model(cfg: Config, seed: int, transformer: bool = False):
    torch.manual_seed(seed)
    if transformer:
        model = TinyEncoder(cfg)
        return model, TfOptimizers(model, cfg.tf_lr)
    model = BagOfNgrams(cfg)
    return model, Optimizers(model, cfg.lr)


def per_example_loss(model, x, y, index) -> torch.Tensor:
    return F.cross_entropy(model(rows(x, index)), torch.from_numpy(y[index]), reduction="none")


def accuracy(model, x, y) -> float:
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())


def chunked_losses(model, x, y) -> np.ndarray:
    with torch.no_grad():
        return np.concatenate([per_example_loss(model, x, y, c).numpy()
                               for c in np.array_split(np.arange(len(x)), 64) if len(c)])


# ------------------------------------------------------------------------------------------------ IL model
def il_config(cfg: Config, variant: str) -> Config:
    """The main config with the IL model's own dim / batch / lr / epochs / checkpoint interval."""
    if variant == "full":
        return cfg
    if variant == "cheap":
        return replace(cfg, dim=cfg.cheap_il_dim, batch=cfg.cheap_il_batch, lr=cfg.cheap_il_lr,
                       il_epochs=cfg.cheap_il_epochs, il_eval_every=cfg.cheap_il_eval_every)
    raise ValueError(f"IL variant must be 'full' or 'cheap', got {variant!r}")


def fit_il(data: Data, cfg: Config) -> BagOfNgrams:
    """Train on the hold-out split's fit part; keep the checkpoint with the best held-out-slice accuracy
    (evaluated every ``il_eval_every`` steps; the evaluations are part of the IL cost)."""
    model, optimizer = make_model(cfg, cfg.il_seed)
    rng = np.random.default_rng(cfg.il_seed)
    steps = cfg.il_epochs * len(data.fit_x) // cfg.batch
    order = np.empty(0, np.int64)
    best, best_acc, best_step = None, -1.0, 0
    for step in range(1, steps + 1):
        if len(order) < cfg.batch:
            order = np.concatenate([order, rng.permutation(len(data.fit_x))])
        index, order = order[:cfg.batch], order[cfg.batch:]
        loss = per_example_loss(model, data.fit_x, data.fit_y, index).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % cfg.il_eval_every == 0 or step == steps:
            acc = accuracy(model, data.val_x, data.val_y)
            if acc > best_acc:
                best, best_acc, best_step = copy.deepcopy(model.state_dict()), acc, step
    model.load_state_dict(best)
    model.il_info = {"heldout_slice_accuracy": best_acc, "checkpoint_step": best_step, "il_steps": steps,
                     "fit_rows": len(data.fit_x), "heldout_slice_rows": len(data.val_x)}
    return model


def il_losses(data: Data, main_cfg: Config, variant: str, out: Path) -> tuple[np.ndarray, dict]:
    """The IL losses of the training split and the IL record (cost, held-out accuracy), made once and cached:
    ``OUT/il-<variant>.json`` (committed) and ``runs/selection_cache/il_<digest>.npz`` (not committed; the IL
    model is refit, and its cost measured again, if either is absent)."""
    cfg = il_config(main_cfg, variant)
    cache = ROOT / "runs" / "selection_cache" / f"il_{config_digest(cfg)}.npz"
    meta_path = out / f"il-{variant}.json"
    if cache.exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta["digest"] == config_digest(cfg):
            return np.load(cache)["losses"], meta
    cache.parent.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    c0, w0 = time.process_time(), time.perf_counter()
    model = fit_il(data, cfg)
    c1, w1 = time.process_time(), time.perf_counter()
    losses = chunked_losses(model, data.train_x, data.train_y)
    c2, w2 = time.process_time(), time.perf_counter()
    meta = {"variant": variant, "digest": config_digest(cfg), "dim": cfg.dim, "batch": cfg.batch, "lr": cfg.lr,
            "epochs": cfg.il_epochs, "eval_every": cfg.il_eval_every, "implementation": "experiments/selection_sst2.py fit_il",
            "train_cpu_s": c1 - c0, "score_cpu_s": c2 - c1, "train_wall_s": w1 - w0, "score_wall_s": w2 - w1,
            "cpu_s": c2 - c0, "wall_s": w2 - w0, **model.il_info,
            # information only, computed after the checkpoint was fixed on the held-out slice:
            "dev_accuracy_information_only": accuracy(model, data.dev_x, data.dev_y),
            "train_split_accuracy_noisy_labels": float(np.mean(
                np.concatenate([model(rows(data.train_x, c)).argmax(1).detach().numpy()
                                for c in np.array_split(np.arange(len(data.train_x)), 64)]) == data.train_y)),
            "machine": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    np.savez(cache, losses=losses)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(meta_path, json.dumps(meta, indent=1) + "\n")
    return losses, meta


def config_digest(cfg: Config) -> str:
    keys = ("buckets", "dim", "lr", "batch", "noise", "holdout", "il_val", "il_epochs", "il_eval_every", "il_seed",
            "flip_seed", "split_seed")
    return f"{zlib.crc32(json.dumps({k: getattr(cfg, k) for k in keys}, sort_keys=True).encode()):08x}"


# ------------------------------------------------------------------------------------------------ arms
class Uniform:
    def __init__(self, n: int, cfg: Config, seed: int) -> None:
        self.sampler = PrioritizedSampler(n, cfg.batch, alpha=0.0, warmup_epochs=1 << 30, seed=seed)

    def step(self, model, data):
        batch = self.sampler.next_batch()
        return batch.indices, None, 0, None


class Rho:
    """Plain RHO-LOSS: n_B uniform candidates, one no-grad forward, top n_b by reducible loss."""

    def __init__(self, n: int, pool: int, il: np.ndarray, cfg: Config, seed: int) -> None:
        sampler = PrioritizedSampler(n, pool, alpha=0.0, warmup_epochs=1 << 30, seed=seed)
        self.select = ScoreThenSelect(sampler, Selector(TopK(cfg.batch), ReducibleLoss(il), seed=seed),
                                      refresh=False)

    def step(self, model, data):
        candidates = self.select.next_candidates()
        with torch.no_grad():
            losses = per_example_loss(model, data.train_x, data.train_y, candidates.indices)
        chosen = self.select.choose(candidates, losses)
        return chosen.indices, None, len(candidates), None


class RhoReuse:
    """rho-reuse4: the library's `ReusedPool` (default hand-out: the pool's top m·n_b rows, n_b per step): one
    scored pool of n_B feeds m steps; the steps between pools draw and score nothing."""

    def __init__(self, n: int, il: np.ndarray, cfg: Config, seed: int) -> None:
        from replayloader.selection.reuse import ReusedPool
        sampler = PrioritizedSampler(n, cfg.pool, alpha=0.0, warmup_epochs=1 << 30, seed=seed)
        self.pool = ReusedPool(Selector(TopK(cfg.batch), ReducibleLoss(il), seed=seed), steps=cfg.reuse)
        self.select = ScoreThenSelect(sampler, self.pool, refresh=False)

    def step(self, model, data):
        if self.pool.pending_steps:
            return self.pool.next_step().indices, None, 0, None
        candidates = self.select.next_candidates()
        with torch.no_grad():
            losses = per_example_loss(model, data.train_x, data.train_y, candidates.indices)
        chosen = self.select.choose(candidates, losses)
        return chosen.indices, None, len(candidates), None

    def stats(self) -> dict:
        return {k: float(v) for k, v in self.pool.stats().items()}


class StaleTree:
    """stale-tree: the library's `stale_reducible_sampler` (weights = max(training loss − IL, 0) + floor from the
    trained rows' own training forward; unseen rows at max(ln 2 − IL, 0) + floor, ln 2 being the loss of the
    untrained model) and its periodic refresh: every ``stale_refresh_every`` steps the ``stale_refresh_rows``
    stalest rows are rescored (one no-grad forward, counted as scoring rows) and fed back."""

    def __init__(self, n: int, il: np.ndarray, cfg: Config, seed: int) -> None:
        from replayloader.selection.stale import stale_reducible_sampler, stale_rows
        self.sampler = stale_reducible_sampler(il, batch_size=cfg.batch, initial_loss=float(np.log(2.0)), seed=seed)
        self.stale_rows, self.cfg, self.count = stale_rows, cfg, 0

    def step(self, model, data):
        self.count += 1
        scored = 0
        if self.count % self.cfg.stale_refresh_every == 0:
            rows_ = self.stale_rows(self.sampler, self.cfg.stale_refresh_rows)
            if len(rows_):
                with torch.no_grad():
                    fresh = per_example_loss(model, data.train_x, data.train_y, rows_).numpy()
                self.sampler.feedback(rows_, loss=fresh)
                scored = len(rows_)
        batch = self.sampler.next_batch()

        def feedback(losses):
            self.sampler.feedback(batch, loss=losses.numpy())
            return 0  # the trained rows' own forward: no extra scoring

        return batch.indices, None, scored, feedback

    def stats(self) -> dict:
        return {k: float(v) for k, v in self.sampler.stats().items()}


class Switch:
    """switch: the library's `SelectionSwitch` (its defaults) over rho (top 32 of 320 uniform candidates by
    reducible loss). In a uniform window it trains 32 uniform rows of the drawn candidates and scores nothing."""

    def __init__(self, n: int, il: np.ndarray, cfg: Config, seed: int) -> None:
        from replayloader.selection.switch import SelectionSwitch
        sampler = PrioritizedSampler(n, cfg.pool, alpha=0.0, warmup_epochs=1 << 30, seed=seed)
        self.switch = SelectionSwitch(Selector(TopK(cfg.batch), ReducibleLoss(il), seed=seed))
        self.select = ScoreThenSelect(sampler, self.switch, refresh=False)

    def step(self, model, data):
        candidates = self.select.next_candidates()
        if self.switch.selecting:
            with torch.no_grad():
                losses = per_example_loss(model, data.train_x, data.train_y, candidates.indices)
            chosen = self.select.choose(candidates, losses)

            def done(_):
                self.switch.step_done()
                return 0

            return chosen.indices, None, len(candidates), done
        chosen = self.switch.uniform(candidates)

        def done_uniform(trained_losses):
            self.switch.step_done(trained_losses.numpy())
            return 0

        return chosen.indices, None, 0, done_uniform

    def stats(self) -> dict:
        return {k: (v if isinstance(v, (str, bool)) else float(v)) for k, v in self.switch.stats().items()
                if isinstance(v, (str, bool, int, float, np.floating, np.integer))}


LIBRARY: dict = {}


class LibraryPartMissing(RuntimeError):
    pass


def make_arm(arm: str, n: int, il: np.ndarray, cfg: Config, seed: int):
    if arm in ("uniform", "tf-uniform"):
        return Uniform(n, cfg, seed)
    if arm == "tf-rho":
        return Rho(n, cfg.pool, il, cfg, seed)
    if arm == "tf-pool64":
        return Rho(n, cfg.recommended_pool, il, cfg, seed)
    if arm == "rho":
        return Rho(n, cfg.pool, il, cfg, seed)
    if arm in ("rho-pool128", "pilot-pool128-cheapil"):
        return Rho(n, cfg.small_pool, il, cfg, seed)
    if arm in ("recommended", "pilot-pool64-cheapil"):  # recommended: fixed after the pilot (protocol)
        return Rho(n, cfg.recommended_pool, il, cfg, seed)
    if arm == "pilot-rho-cheapil":
        return Rho(n, cfg.pool, il, cfg, seed)
    if arm == "rho-reuse4":
        return RhoReuse(n, il, cfg, seed)
    if arm == "stale-tree":
        return StaleTree(n, il, cfg, seed)
    if arm == "switch":
        return Switch(n, il, cfg, seed)
    raise LibraryPartMissing(f"arm {arm!r}: its library part is not wired in yet")


# ------------------------------------------------------------------------------------------------ one run
IL_OF = {"recommended": "cheap", "pilot-rho-cheapil": "cheap", "pilot-pool128-cheapil": "cheap",
         "pilot-pool64-cheapil": "cheap",
         "tf-rho": "cheap", "tf-pool64": "cheap"}  # every other arm: the full IL model


def run(arm: str, seed: int, data: Data, ils: dict, cfg: Config, out: Path) -> str:
    torch.set_num_threads(1)
    path = out / "runs" / f"{arm}-seed{seed}.json"
    if path.exists():
        return f"{path.name}: exists, skipped"
    il, il_meta = ils[IL_OF.get(arm, "full")]
    transformer = arm.startswith("tf-")
    if transformer:
        data = data.tokens()
        cfg = replace(cfg, steps=cfg.tf_steps, eval_every=cfg.tf_eval_every)
    model, optimizer = make_model(cfg, seed, transformer)
    strategy = make_arm(arm, len(data.train_x), il, cfg, seed)
    curve = []
    cpu = wall = 0.0
    scored = trained = mislabelled = 0
    for step in range(1, cfg.steps + 1):
        c0, w0 = time.process_time(), time.perf_counter()
        index, weights, n_scored, feedback = strategy.step(model, data)
        losses = per_example_loss(model, data.train_x, data.train_y, index)
        loss = losses.mean() if weights is None else (losses * torch.as_tensor(weights, dtype=losses.dtype)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if feedback is not None:
            n_scored += feedback(losses.detach())
        cpu += time.process_time() - c0
        wall += time.perf_counter() - w0
        scored += n_scored
        trained += len(index)
        mislabelled += int(data.train_flipped[index].sum())
        if step % cfg.eval_every == 0 or step == cfg.steps:
            curve.append({"step": step, "cpu_s": cpu, "wall_s": wall, "dev_accuracy": accuracy(model, data.dev_x,
                                                                                                 data.dev_y),
                          "scored_rows": scored, "trained_rows": trained})
            if transformer and curve[-1]["dev_accuracy"] >= cfg.tf_stop_at:
                break  # the stretch's highest target reached: nothing left to measure
    record = {"arm": arm, "seed": seed, "config": asdict(cfg), "n_train": len(data.train_x),
              "n_dev": len(data.dev_x), "il": {k: il_meta[k] for k in (
                  "variant", "cpu_s", "wall_s", "train_cpu_s", "score_cpu_s", "heldout_slice_accuracy", "digest")},
              "uses_il": arm not in ("uniform", "tf-uniform"), "curve": curve, "scoring_forward_rows": scored, "trained_rows": trained,
              "selected_mislabelled_share": mislabelled / trained,
              "arm_stats": strategy.stats() if hasattr(strategy, "stats") else None,
              "machine": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "torch": torch.__version__, "library": LIBRARY}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record) + "\n")
    best = max(c["dev_accuracy"] for c in curve)
    return f"{path.name}: peak {best:.3f}, final {curve[-1]['dev_accuracy']:.3f}, {cpu:.2f} CPU s"


def library_state() -> dict:
    """The commit and a digest of the uncommitted changes under replayloader/ (the library is being extended
    while the runs go)."""
    import subprocess
    def git(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout
    diff = git("diff", "HEAD", "--", "replayloader") + "".join(
        f"{p}\n{(ROOT / p).read_text(errors='replace')}" for p in
        git("ls-files", "--others", "--exclude-standard", "--", "replayloader").split())
    return {"commit": git("rev-parse", "HEAD").strip(), "uncommitted_digest": f"{zlib.crc32(diff.encode()):08x}",
            "uncommitted": bool(diff)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", help="folder holding glue/SST-2/ (default: $REPLAYLOADER_DATA)")
    parser.add_argument("--out", type=Path, default=OUT, help="results folder (records go to OUT/runs/)")
    parser.add_argument("--arms", nargs="+", choices=ARMS + TF_ARMS + PILOT_ARMS, default=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=Config.steps)
    parser.add_argument("--il-only", action="store_true", help="fit (or load) the IL model, print it, stop")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    global LIBRARY
    LIBRARY = library_state()
    cfg = Config(steps=args.steps)
    root = data_dir(args.data_dir)
    data = load_data(root, cfg)
    data.tokens = lambda cache={}: (cache["d"] if "d" in cache else   # the transformer's tokens, same split
                                    cache.setdefault("d", load_data(root, cfg, tokens=True)))
    ils = {}
    for variant in ("full", "cheap"):
        ils[variant] = il_losses(data, cfg, variant, args.out)
        print(json.dumps(ils[variant][1]), flush=True)
    if args.il_only:
        return
    for seed in args.seeds:  # seeds outermost: a partial grid is a complete set of pairs
        for arm in args.arms:
            print(time.strftime("%H:%M:%S"), run(arm, seed, data, ils, cfg, args.out), flush=True)


if __name__ == "__main__":
    main()

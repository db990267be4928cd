"""Online data mixing (ODM) against stratified and natural mixtures, pretraining a tiny causal LM (issue 29).

    python -m experiments.mixing_lm prepare                      # tokenizer + token-id cache under runs/mixing/data
    python -m experiments.mixing_lm grid                         # the protocol's grid, one run at a time, resumable
    python -m experiments.mixing_lm grid --commit                # ... and commit each record as it finishes
    python -m experiments.mixing_lm grid --commit --seeds 4 3 2 1 0   # a second process from the other end
    python -m experiments.mixing_lm list                         # each run of the grid, done or not
    python -m experiments.mixing_lm run --arm odm --seed 0       # one run in this process
    python -m experiments.mixing_lm pilot --seed 100 --steps 200 # speed pilot (records under runs/mixing/pilot)

Protocol: results/mixing/protocol.md. Data: experiments/mixing_lm_data.py (six sources, data root from
``$REPLAYLOADER_DATA`` or ``--data-dir``). One run = one (arm, seed); it writes the compact record
``results/mixing/runs/<arm>-seed<k>.json`` (and, for every arm, ``<arm>-seed<k>.weights.jsonl``: the mixture
weights every ``--weights-every`` steps) only when it finishes, so the grid skips finished runs.

Arms: ``stratified`` (FixedMixture.stratified: uniform over the six sources), ``natural`` (FixedMixture.natural:
proportional to the sources' sizes in blocks), ``odm`` (the library's ODM rule with its defaults, fed the
per-example training loss). Everything else is shared and, for a seed, identical: the model initialisation
(``torch.manual_seed(seed)`` before building the model) and the sampler's seed.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
from experiments import mixing_lm_data as mdata  # noqa: E402

RESULTS = REPO / "results" / "mixing"
RUNS = RESULTS / "runs"
PILOT = REPO / "runs" / "mixing" / "pilot"
SAMPLER_LOGS = REPO / "runs" / "mixing" / "logs"  # the sampler's log_path while a run is going
ARMS = ("stratified", "natural", "odm")
SEEDS = (0, 1, 2, 3, 4)

# fixed by the protocol (the step budget from the pilot)
DEFAULTS = dict(steps=800, batch_size=16, lr=2e-3, warmup=40, min_lr_frac=0.1, weight_decay=0.01, betas=(0.9, 0.95),
                grad_clip=1.0, eval_every=100, weights_every=20, n_layer=2, n_embd=128, n_head=4)


def record_path(out: Path, arm: str, seed: int) -> Path:
    return out / f"{arm}-seed{seed}.json"


def weights_path(out: Path, arm: str, seed: int) -> Path:
    return out / f"{arm}-seed{seed}.weights.jsonl"


# ------------------------------------------------------------------------------------------------ sampler
def make_sampler(arm: str, sizes: list[int], batch_size: int, seed: int, log_path: Path | None = None,
                 log_every: int = 1):
    from replayloader.mixing import ODM, FixedMixture, MixtureSampler

    library_hash()
    if arm == "stratified":
        rule = FixedMixture.stratified(len(sizes))
    elif arm == "natural":
        rule = FixedMixture.natural(sizes)
    elif arm == "odm":
        rule = ODM()
    else:
        raise ValueError(f"unknown arm {arm!r}")
    return MixtureSampler(np.asarray(sizes, dtype=np.int64), batch_size=batch_size, rule=rule, seed=seed,
                          names=mdata.SOURCES, log_path=log_path, log_every=log_every)


_LIB_HASH: dict = {}


def library_hash() -> dict:
    """SHA-256 prefixes of replayloader/mixing/*.py as first imported by this process (the code the runs use)."""
    if not _LIB_HASH:
        import hashlib

        import replayloader.mixing as mixing

        for f in sorted(Path(mixing.__file__).parent.glob("*.py")):
            _LIB_HASH[f.name] = hashlib.sha256(f.read_bytes()).hexdigest()[:16]
    return dict(_LIB_HASH)


def current_weights(sampler) -> list[float]:
    """The rule's sampling distribution over sources now."""
    return [float(w) for w in np.asarray(sampler.probabilities(), dtype=float)]


# ------------------------------------------------------------------------------------------------ model
def build_model(vocab: int, block: int, cfg: dict, seed: int):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    conf = GPT2Config(vocab_size=vocab, n_positions=block, n_embd=cfg["n_embd"], n_layer=cfg["n_layer"],
                      n_head=cfg["n_head"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(conf)


def per_example_ce(model, x):
    """Mean next-token cross-entropy of each block (block - 1 predictions each): shape (batch,)."""
    import torch.nn.functional as F

    logits = model(input_ids=x).logits[:, :-1]
    tgt = x[:, 1:]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tgt.reshape(-1), reduction="none")
    return ce.view(tgt.shape).mean(dim=1)


def evaluate(model, evals, batch: int = 64) -> list[float]:
    """Mean token CE on each source's fixed held-out blocks."""
    import torch

    model.eval()
    out = []
    with torch.no_grad():
        for ev in evals:
            ces = [per_example_ce(model, torch.from_numpy(ev[i:i + batch].astype(np.int64)))
                   for i in range(0, len(ev), batch)]
            out.append(float(torch.cat(ces).mean()))
    model.train()
    return out


def lr_at(step: int, cfg: dict) -> float:
    if step < cfg["warmup"]:
        return cfg["lr"] * (step + 1) / cfg["warmup"]
    p = (step - cfg["warmup"]) / max(1, cfg["steps"] - cfg["warmup"])
    return cfg["lr"] * (cfg["min_lr_frac"] + (1 - cfg["min_lr_frac"]) * 0.5 * (1 + math.cos(math.pi * min(1.0, p))))


# ------------------------------------------------------------------------------------------------ one run
def train(arm: str, seed: int, cfg: dict, sampler_factory=make_sampler, progress: bool = False,
          log_path: Path | None = None) -> tuple[dict, list[dict]]:
    """One run. ``log_path``: the sampler's own weight log (JSONL, every ``weights_every`` draws), started afresh."""
    import torch

    torch.set_num_threads(1)
    t_start = time.perf_counter()
    meta, train_blocks, evals = mdata.load()
    sizes = [len(t) for t in train_blocks]
    all_blocks = np.concatenate(train_blocks)  # global index = contiguous blocks per source, in SOURCES order
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    model = build_model(meta["vocab_size"], meta["block"], cfg, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=tuple(cfg["betas"]), weight_decay=cfg["weight_decay"])
    if log_path is not None and log_path.exists():
        log_path.unlink()
    sampler = sampler_factory(arm, sizes, cfg["batch_size"], seed, log_path=log_path, log_every=cfg["weights_every"])

    evals_log, weights_log = [], []
    drawn = np.zeros(len(sizes), dtype=np.int64)
    mix_wall = train_wall = eval_wall = 0.0
    step_walls = []

    def do_eval(step):
        nonlocal eval_wall
        t0 = time.perf_counter()
        ce = evaluate(model, evals)
        eval_wall += time.perf_counter() - t0
        ppl = [math.exp(c) for c in ce]
        evals_log.append({"step": step, "ce": ce, "mean_ppl": float(np.mean(ppl)), "worst_ppl": float(max(ppl))})
        if progress:
            print(f"[{arm} s{seed}] step {step:5d} mean ppl {np.mean(ppl):8.2f} worst {max(ppl):8.2f} "
                  f"train {train_wall:6.1f}s mix {mix_wall:5.2f}s", flush=True)

    do_eval(0)
    weights_log.append({"step": 0, "weights": current_weights(sampler)})
    for step in range(1, cfg["steps"] + 1):
        t0 = time.perf_counter()
        batch = sampler.next_batch()
        t1 = time.perf_counter()
        idx = np.asarray(batch.indices, dtype=np.int64)
        src = np.searchsorted(offsets, idx, side="right") - 1
        drawn += np.bincount(src, minlength=len(sizes))
        for g in opt.param_groups:
            g["lr"] = lr_at(step - 1, cfg)
        x = torch.from_numpy(all_blocks[idx].astype(np.int64))
        losses = per_example_ce(model, x)
        loss = losses.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        opt.step()
        fb = losses.detach().numpy().astype(np.float64)
        t2 = time.perf_counter()
        sampler.feedback(idx, loss=fb)
        t3 = time.perf_counter()
        mix_wall += (t1 - t0) + (t3 - t2)
        step_walls.append(t3 - t0)
        train_wall += t3 - t0
        if step % cfg["weights_every"] == 0:
            weights_log.append({"step": step, "weights": current_weights(sampler)})
        if step % cfg["eval_every"] == 0 or step == cfg["steps"]:
            do_eval(step)

    final = evals_log[-1]
    try:
        stats = sampler.stats()
        stats = json.loads(json.dumps(stats, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))
    except Exception as exc:  # a report, not a dependency
        stats = {"error": repr(exc)}
    sw = np.asarray(step_walls)
    record = {
        "arm": arm, "seed": seed, "config": cfg, "sources": mdata.SOURCES, "sizes": sizes,
        "data": {s: {k: meta["sources"][s][k] for k in ("train_blocks", "eval_blocks", "train_sha256", "eval_sha256")}
                 for s in mdata.SOURCES},
        "vocab_size": meta["vocab_size"], "block": meta["block"],
        "n_params": int(sum(p.numel() for p in model.parameters())),
        "evals": evals_log,
        "final": {"step": final["step"], "ce": final["ce"], "ppl": [math.exp(c) for c in final["ce"]],
                  "mean_ppl": final["mean_ppl"], "worst_ppl": final["worst_ppl"]},
        "drawn_per_source": drawn.tolist(),
        "weights_every": cfg["weights_every"], "final_weights": weights_log[-1]["weights"],
        "weights": weights_log,
        "sampler_stats": stats,
        "timing": {"total_wall_s": time.perf_counter() - t_start, "train_wall_s": train_wall, "mixing_wall_s": mix_wall,
                   "eval_wall_s": eval_wall, "step_wall_mean_s": float(sw.mean()), "step_wall_median_s": float(np.median(sw)),
                   "mixing_per_step_s": mix_wall / len(sw), "mixing_frac_of_step": mix_wall / train_wall},
        "env": {"torch": torch.__version__, "threads": torch.get_num_threads(), "python": sys.version.split()[0],
                "host_cpus": os.cpu_count(), "git_head": _git_head(),
                "replayloader_mixing_sha256": dict(_LIB_HASH)},
    }
    return record, weights_log


def _git_head() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def write_run(out: Path, record: dict, weights_log: list[dict], sampler_log: Path | None = None) -> list[Path]:
    """The weights JSONL (the sampler's own ``log_path`` file when given: one line per ``weights_every`` draws,
    the weights that draw used; else the driver's copy) and then the record."""
    out.mkdir(parents=True, exist_ok=True)
    arm, seed = record["arm"], record["seed"]
    rp, wp = record_path(out, arm, seed), weights_path(out, arm, seed)
    tmp = wp.with_suffix(".tmp")
    if sampler_log is not None and sampler_log.exists():
        tmp.write_text(sampler_log.read_text())
    else:
        tmp.write_text("".join(json.dumps({"step": w["step"], "weights": dict(zip(mdata.SOURCES, w["weights"]))}) + "\n"
                               for w in weights_log))
    tmp.replace(wp)
    tmp = rp.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=None, separators=(",", ":")) + "\n")
    tmp.replace(rp)  # the record last: it marks the run done
    return [rp, wp]


def commit(paths: list[Path], msg: str) -> None:
    """Pathspec commit of ``paths`` only (added with -f: ``runs/`` is gitignored at every level). Retried a few
    times (another process may hold the index lock); a commit that still fails is reported, not raised: the
    record is on disk and can be committed by hand."""
    rel = [str(p.relative_to(REPO)) for p in paths]
    for attempt in range(6):
        add = subprocess.run(["git", "add", "-f", "--", *rel], cwd=REPO, capture_output=True, text=True)
        com = add.returncode == 0 and subprocess.run(["git", "commit", "-q", "-m", msg, "--", *rel], cwd=REPO,
                                                     capture_output=True, text=True)
        if com and com.returncode == 0:
            return
        time.sleep(2 + 3 * attempt)
    print(f"commit failed for {rel}: {(add.stderr if add.returncode else com.stderr).strip()}", flush=True)


# ------------------------------------------------------------------------------------------------ cli
def config_from(args) -> dict:
    cfg = dict(DEFAULTS)
    for k in ("steps", "batch_size", "lr", "eval_every", "weights_every"):
        v = getattr(args, k, None)
        if v is not None:
            cfg[k] = v
    cfg["warmup"] = max(1, round(cfg["steps"] * 0.05))
    return cfg


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cmd", choices=["prepare", "run", "grid", "list", "pilot"])
    ap.add_argument("--arm", choices=ARMS)
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    ap.add_argument("--seed", type=int)
    ap.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    ap.add_argument("--steps", type=int)
    ap.add_argument("--batch-size", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--eval-every", type=int)
    ap.add_argument("--weights-every", type=int)
    ap.add_argument("--out", type=Path, default=RUNS)
    ap.add_argument("--data-dir", default=None, help=f"data root (default: ${mdata.DATA_ENV})")
    ap.add_argument("--commit", action="store_true", help="commit each finished record (pathspec commit of its files)")
    ap.add_argument("--progress", action="store_true")
    args = ap.parse_args(argv)

    if args.cmd == "prepare":
        print(json.dumps(mdata.prepare(args.data_dir), indent=1))
        return
    cfg = config_from(args)
    if args.cmd == "list":
        for seed in args.seeds:
            for arm in args.arms:
                done = record_path(args.out, arm, seed).exists()
                print(f"{'done' if done else 'todo'}  {arm}-seed{seed}")
        return
    mdata.prepare(args.data_dir)
    if args.cmd == "pilot":
        out = PILOT
        if args.seed is None or args.seed < 100:
            raise SystemExit("pilot seeds are >= 100 (the protocol's seeds 0-4 are for the results only)")
        for arm in ([args.arm] if args.arm else args.arms):
            log = out / f"{arm}-seed{args.seed}.sampler.jsonl"
            rec, wl = train(arm, args.seed, cfg, progress=True, log_path=log)
            write_run(out, rec, wl, log)
            print(json.dumps(rec["timing"]), flush=True)
        return
    if args.cmd == "run":
        jobs = [(args.arm, args.seed)]
    else:
        # the primary pairs first (stratified, odm; seed by seed), then natural; a second grid process given the
        # seeds in reverse order meets the first in the middle (lock files)
        jobs = ([(arm, seed) for seed in args.seeds for arm in ("stratified", "odm") if arm in args.arms]
                + [("natural", seed) for seed in args.seeds if "natural" in args.arms])
    for arm, seed in jobs:
        if record_path(args.out, arm, seed).exists():
            print(f"skip {arm}-seed{seed} (record exists)", flush=True)
            continue
        SAMPLER_LOGS.mkdir(parents=True, exist_ok=True)
        lock = SAMPLER_LOGS / f"{arm}-seed{seed}.lock"  # a second grid process (other seeds first) skips it
        try:
            os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            print(f"skip {arm}-seed{seed} (running elsewhere: {lock} exists; delete it if that run died)", flush=True)
            continue
        print(f"start {arm}-seed{seed} {time.strftime('%H:%M:%S')}", flush=True)
        log = SAMPLER_LOGS / f"{arm}-seed{seed}.weights.jsonl"
        try:
            rec, wl = train(arm, seed, cfg, progress=args.progress, log_path=log)
            paths = write_run(args.out, rec, wl, log)
        finally:
            lock.unlink(missing_ok=True)
        print(f"done {arm}-seed{seed}: mean ppl {rec['final']['mean_ppl']:.2f}, wall {rec['timing']['total_wall_s']:.0f}s, "
              f"mixing {100 * rec['timing']['mixing_frac_of_step']:.3f}% of step", flush=True)
        if args.commit:
            commit(paths, f"mixing LM (issue 29): record {arm}-seed{seed}")


if __name__ == "__main__":
    main()

"""The fair mixing test (issue 40): stratified, natural, ODM as its authors released it, and ADO, pretraining a
tiny causal LM on six English sources long enough for a rule to act. Runs in resumable chunks.

    python -m experiments.mixing_fair list                     # each run of the grid, done, partial or not started
    python -m experiments.mixing_fair grid --commit            # the grid, one run at a time, resumable; commits records
    python -m experiments.mixing_fair grid --commit --reverse  # a second process from the other end (lock files)
    python -m experiments.mixing_fair run --arm odm --seed 0   # one run in this process
    python -m experiments.mixing_fair pilot --steps 60         # CPU seconds per step (seed 100, nothing kept)

Protocol: results/mixing_fair/protocol.md. The data, model, loss and evaluation are those of
`experiments/mixing_lm.py` (issue 29's study, reused here, not copied); data root ``$REPLAYLOADER_DATA``.

Resumable: every ``eval_every`` steps a run writes a checkpoint (model, optimizer, sampler state, the torch RNG,
its logs and CPU/wall counters so far) to ``runs/mixing_fair/ckpt/<arm>-seed<k>.pt`` (temp name, then rename),
and a restarted run continues from it with the identical stream. The record
``results/mixing_fair/runs/<arm>-seed<k>.json`` is written only when the run finishes, so the grid skips
finished runs.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from experiments import mixing_lm as base
from experiments import mixing_lm_data as mdata

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results" / "mixing_fair"
RUNS = RESULTS / "runs"
WORK = REPO / "runs" / "mixing_fair"
ARMS = ("stratified", "odm", "ado", "natural")
SEEDS = (0, 1, 2, 3, 4)

# fixed by the protocol (results/mixing_fair/protocol.md)
DEFAULTS = dict(steps=6000, batch_size=16, lr=2e-3, warmup_frac=0.05, min_lr_frac=0.1, weight_decay=0.01,
                betas=(0.9, 0.95), grad_clip=1.0, eval_every=500, weights_every=50, n_layer=2, n_embd=128, n_head=4,
                odm_warmup_frac=0.02, ado_step_scale=0.1)


def make_rule(arm: str, sizes: list[int], cfg: dict):
    """The arm's rule. ODM: the authors' smoothed-mean rule with their defaults, the warm-up scaled to the same
    share of the run as their 2,000 of 100,000 steps, starting from the natural mixture as their runs do.
    ADO: the authors' defaults with every step count scaled by ``ado_step_scale``."""
    from replayloader.mixing import ADO, ODM, FixedMixture

    sizes_arr = np.asarray(sizes, dtype=np.float64)
    if arm == "stratified":
        return FixedMixture.stratified(len(sizes))
    if arm == "natural":
        return FixedMixture.natural(np.asarray(sizes, dtype=np.int64))
    if arm == "odm":
        return ODM(len(sizes), warmup_steps=round(cfg["odm_warmup_frac"] * cfg["steps"]),
                   initial=sizes_arr / sizes_arr.sum())
    if arm == "ado":
        return ADO(len(sizes), step_scale=cfg["ado_step_scale"])
    raise ValueError(f"unknown arm {arm!r}")


def lr_at(step: int, cfg: dict) -> float:
    return base.lr_at(step, {**cfg, "warmup": max(1, round(cfg["warmup_frac"] * cfg["steps"]))})


def paths(arm: str, seed: int) -> dict[str, Path]:
    return {"record": RUNS / f"{arm}-seed{seed}.json", "ckpt": WORK / "ckpt" / f"{arm}-seed{seed}.pt",
            "lock": WORK / "locks" / f"{arm}-seed{seed}.lock"}


def train(arm: str, seed: int, cfg: dict, *, ckpt: Path | None, progress: bool = False,
          stop_after_s: float | None = None) -> dict | None:
    """One run, resumed from ``ckpt`` when it exists. Returns the record, or None when ``stop_after_s`` CPU
    seconds of this process ran out first (the checkpoint then holds the progress)."""
    import torch

    from replayloader.mixing import MixtureSampler

    torch.set_num_threads(1)
    cpu_start = time.process_time()
    meta, train_blocks, evals = mdata.load()
    sizes = [len(t) for t in train_blocks]
    all_blocks = np.concatenate(train_blocks)
    model = base.build_model(meta["vocab_size"], meta["block"], cfg, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=tuple(cfg["betas"]),
                            weight_decay=cfg["weight_decay"])
    sampler = MixtureSampler(np.asarray(sizes, dtype=np.int64), batch_size=cfg["batch_size"],
                             rule=make_rule(arm, sizes, cfg), seed=seed, names=mdata.SOURCES)
    state = {"step": 0, "evals": [], "weights": [], "estimates": [], "cpu": {"mix": 0.0, "train": 0.0, "eval": 0.0},
             "wall": {"train": 0.0}, "chunks": 0}
    if ckpt is not None and ckpt.exists():
        saved = torch.load(ckpt, weights_only=False)
        if saved["config"] != cfg or saved["arm"] != arm or saved["seed"] != seed:
            raise SystemExit(f"{ckpt} was written with another configuration: delete it to start over")
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        sampler.load_state_dict(saved["sampler"])
        torch.set_rng_state(saved["torch_rng"])
        state = saved["state"]
    state["chunks"] += 1

    def do_eval(step: int) -> None:
        t0 = time.process_time()
        ce = base.evaluate(model, evals)
        state["cpu"]["eval"] += time.process_time() - t0
        ppl = [math.exp(c) for c in ce]
        state["evals"].append({"step": step, "ce": ce, "mean_ppl": float(np.mean(ppl)), "worst_ppl": float(max(ppl)),
                               "train_cpu_s": state["cpu"]["train"], "train_wall_s": state["wall"]["train"]})
        if progress:
            print(f"[{arm} s{seed}] step {step:5d} mean ppl {np.mean(ppl):8.2f} worst {max(ppl):8.2f} "
                  f"cpu {state['cpu']['train']:7.1f}s mix {state['cpu']['mix']:6.2f}s", flush=True)

    def save_checkpoint() -> None:
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        tmp = ckpt.with_suffix(".tmp")
        torch.save({"config": cfg, "arm": arm, "seed": seed, "model": model.state_dict(),
                    "optimizer": opt.state_dict(), "sampler": sampler.state_dict(),
                    "torch_rng": torch.get_rng_state(), "state": state}, tmp)
        os.replace(tmp, ckpt)

    def log_weights(step: int) -> None:
        stats = sampler.stats()
        state["weights"].append({"step": step, "weights": [float(w) for w in stats["weights"]]})
        state["estimates"].append({"step": step, **{k: np.asarray(v, float).tolist()
                                                    for k, v in stats["estimates"].items()}})

    if state["step"] == 0:
        do_eval(0)
        log_weights(0)
    while state["step"] < cfg["steps"]:
        step = state["step"] + 1
        c0, w0 = time.process_time(), time.perf_counter()
        batch = sampler.next_batch()
        c1 = time.process_time()
        idx = np.asarray(batch.indices, dtype=np.int64)
        for g in opt.param_groups:
            g["lr"] = lr_at(step - 1, cfg)
        losses = base.per_example_ce(model, torch.from_numpy(all_blocks[idx].astype(np.int64)))
        opt.zero_grad(set_to_none=True)
        losses.mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        opt.step()
        feedback = losses.detach().numpy().astype(np.float64)
        c2 = time.process_time()
        sampler.feedback(idx, loss=feedback)
        c3, w3 = time.process_time(), time.perf_counter()
        state["cpu"]["mix"] += (c1 - c0) + (c3 - c2)
        state["cpu"]["train"] += c3 - c0
        state["wall"]["train"] += w3 - w0
        state["step"] = step
        if step % cfg["weights_every"] == 0:
            log_weights(step)
        if step % cfg["eval_every"] == 0 or step == cfg["steps"]:
            do_eval(step)
            if ckpt is not None:
                save_checkpoint()
            if stop_after_s is not None and time.process_time() - cpu_start > stop_after_s and step < cfg["steps"]:
                return None

    final = state["evals"][-1]
    import torch as _torch
    return {"arm": arm, "seed": seed, "config": cfg, "sources": mdata.SOURCES, "sizes": sizes,
            "data": {s: {k: meta["sources"][s][k] for k in ("train_blocks", "eval_blocks", "train_sha256",
                                                             "eval_sha256")} for s in mdata.SOURCES},
            "n_params": int(sum(p.numel() for p in model.parameters())),
            "evals": state["evals"], "final": {"step": final["step"], "ce": final["ce"],
                                               "ppl": [math.exp(c) for c in final["ce"]],
                                               "mean_ppl": final["mean_ppl"], "worst_ppl": final["worst_ppl"]},
            "weights": state["weights"], "estimates": state["estimates"],
            "drawn_per_source": sampler.stats()["drawn"].tolist(),
            "timing": {"train_cpu_s": state["cpu"]["train"], "mixing_cpu_s": state["cpu"]["mix"],
                       "eval_cpu_s": state["cpu"]["eval"], "train_wall_s": state["wall"]["train"],
                       "mixing_frac_of_step_cpu": state["cpu"]["mix"] / state["cpu"]["train"],
                       "chunks": state["chunks"]},
            "env": {"torch": _torch.__version__, "python": sys.version.split()[0], "git_head": _git_head(),
                    "replayloader_mixing_sha256": base.library_hash()}}


def _git_head() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                              text=True).stdout.strip()
    except OSError:
        return ""


def write_record(record: dict) -> Path:
    path = paths(record["arm"], record["seed"])["record"]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, separators=(",", ":")) + "\n")
    os.replace(tmp, path)
    return path


def jobs(arms: list[str], seeds: list[int], reverse: bool) -> list[tuple[str, int]]:
    """Seed by seed, the primary pair (stratified, odm) first, then ado, then natural."""
    order = [(arm, seed) for seed in seeds for arm in ARMS if arm in arms]
    return order[::-1] if reverse else order


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cmd", choices=["run", "grid", "list", "pilot"])
    ap.add_argument("--arm", choices=ARMS)
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    ap.add_argument("--seed", type=int)
    ap.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    ap.add_argument("--steps", type=int, help="pilot only: steps to time")
    ap.add_argument("--reverse", action="store_true", help="grid: take the jobs from the other end")
    ap.add_argument("--chunk-cpu-s", type=float, default=None,
                    help="stop a run (checkpointed) after this many CPU seconds of this process")
    ap.add_argument("--commit", action="store_true", help="commit each finished record")
    ap.add_argument("--progress", action="store_true")
    args = ap.parse_args(argv)
    cfg = dict(DEFAULTS)
    if args.cmd == "list":
        for arm, seed in jobs(args.arms, args.seeds, False):
            p = paths(arm, seed)
            print(f"{'done' if p['record'].exists() else 'partial' if p['ckpt'].exists() else 'todo':8s}"
                  f"{arm}-seed{seed}")
        return
    mdata.prepare(None)
    if args.cmd == "pilot":
        import torch

        for arm in ([args.arm] if args.arm else ["stratified", "odm", "ado"]):
            pilot = {**cfg, "steps": args.steps or 60, "eval_every": 10 ** 9}
            t0 = time.process_time()
            rec = train(arm, 100, pilot, ckpt=None)
            cpu = rec["timing"]["train_cpu_s"]
            print(json.dumps({"arm": arm, "steps": pilot["steps"], "train_cpu_s_per_step": cpu / pilot["steps"],
                              "mixing_frac": rec["timing"]["mixing_frac_of_step_cpu"],
                              "process_cpu_s": time.process_time() - t0, "torch_threads": torch.get_num_threads()}),
                  flush=True)
        return
    todo = [(args.arm, args.seed)] if args.cmd == "run" else jobs(args.arms, args.seeds, args.reverse)
    print("command:", shlex.join([sys.executable, "-m", "experiments.mixing_fair", *(argv or sys.argv[1:])]),
          flush=True)
    for arm, seed in todo:
        p = paths(arm, seed)
        if p["record"].exists():
            continue
        p["lock"].parent.mkdir(parents=True, exist_ok=True)
        try:
            os.close(os.open(p["lock"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            print(f"skip {arm}-seed{seed} (running elsewhere: {p['lock']} exists; delete it if that run died)")
            continue
        try:
            print(f"start {arm}-seed{seed} {time.strftime('%H:%M:%S')}", flush=True)
            rec = train(arm, seed, cfg, ckpt=p["ckpt"], progress=args.progress, stop_after_s=args.chunk_cpu_s)
        finally:
            p["lock"].unlink(missing_ok=True)
        if rec is None:
            print(f"paused {arm}-seed{seed} (checkpointed)", flush=True)
            return
        path = write_record(rec)
        print(f"done {arm}-seed{seed}: mean ppl {rec['final']['mean_ppl']:.2f}, train CPU "
              f"{rec['timing']['train_cpu_s']:.0f}s, mixing {100 * rec['timing']['mixing_frac_of_step_cpu']:.3f}%",
              flush=True)
        if args.commit:
            base.commit([path], f"mixing fair test (issue 40): record {arm}-seed{seed}")


if __name__ == "__main__":
    main()

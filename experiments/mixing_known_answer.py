"""Known-answer check for the adaptive mixing rules (issue 40): a mixture built so the best weights are known.

    python -m experiments.mixing_known_answer                 # all arms, seeds 0-2, ~1 CPU minute per run
    python -m experiments.mixing_known_answer --summary       # the table from the committed records

Protocol (fixed before the first run, committed with this file):

**Sources** (token sequences of length 64 over a vocabulary of 32, 4,096 training and 256 held-out sequences
each, generated from the run's data seed 1234, the same for every run):

- ``easy``: a first-order Markov chain in which every token has 2 successors, each with probability 1/2
  (entropy floor ln 2 = 0.693 nats per prediction after the first): learned within a few hundred steps.
- ``easy_copy``: the same training sequences as ``easy`` again (a duplicate source).
- ``hard``: a second-order chain: the next token is a fixed random function of the two before it with
  probability 0.9, else uniform (floor 0.651 nats): learnable (a 1,024-entry table) but slow.
- ``noise`` (second check only): uniform random tokens, floor ln 32 = 3.466 nats: nothing to learn.

**Known answer.** The target is the mean held-out *excess* loss (loss above the floor) over the learnable tasks,
``easy`` and ``hard``. ``easy`` is learned early, so the best weights after the first few hundred steps put
most weight on ``hard``; ``easy_copy`` adds nothing beyond ``easy``; ``noise`` teaches nothing. A rule moves the
right way when, over the last 20% of steps, its mean weight on ``hard`` exceeds the stratified share (1/K) and,
in the second check, its weight on ``noise`` stays at or below 1/K.

**Checks and arms.** Check A: ``easy``, ``easy_copy``, ``hard`` (K = 3). Check B: the same plus ``noise``
(K = 4). Arms: ``stratified`` (the baseline), ``odm`` (`ODM`, warm-up scaled to 2% of the run as the authors'
2,000 of 100,000), ``odm_exp3`` (`ODMExp3`, same warm-up), ``excess`` (`ExcessLoss` with the sources' true
entropy floors as reference losses: the oracle reference), ``ado`` (`ADO`, ``step_scale`` 0.1). Seeds 0, 1, 2
(model initialisation and the sampler's seed). 1,500 steps of batch 32, Adam lr 3e-3.

**Model.** A next-token MLP over the two previous tokens (embedding 32 → concat 64 → 128 ReLU → 32 logits), one
torch thread. It can represent both chains exactly.

**Reported** per (check, arm): mean over seeds of the final weights, the mean weight on ``hard`` (and
``noise``) over the last 20% of steps, the final held-out excess loss on ``easy`` and ``hard`` and their mean,
and the mixing overhead (draw + feedback seconds / step seconds). Descriptive: 3 seeds, no test.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parents[1] / "results" / "mixing_known_answer"
VOCAB, LENGTH, TRAIN, HELDOUT = 32, 64, 4096, 256
DATA_SEED = 1234
STEPS, BATCH, LR = 1500, 32, 3e-3
ARMS = ("stratified", "odm", "odm_exp3", "excess", "ado")
CHECKS = {"A": ("easy", "easy_copy", "hard"), "B": ("easy", "easy_copy", "hard", "noise")}
SEEDS = (0, 1, 2)
HARD_NOISE = 0.1


def floors() -> dict[str, float]:
    """Entropy per prediction (nats) of each source's generating process."""
    top = 1 - HARD_NOISE + HARD_NOISE / VOCAB
    rest = HARD_NOISE / VOCAB
    hard = -(top * np.log(top) + (VOCAB - 1) * rest * np.log(rest))
    return {"easy": float(np.log(2)), "easy_copy": float(np.log(2)), "hard": float(hard),
            "noise": float(np.log(VOCAB))}


def make_sources() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(train, held-out) int64 arrays of shape (n, LENGTH) per source, from DATA_SEED."""
    rng = np.random.default_rng(DATA_SEED)
    successors = np.stack([rng.choice(VOCAB, 2, replace=False) for _ in range(VOCAB)])
    table = rng.integers(0, VOCAB, (VOCAB, VOCAB))

    def easy(n):
        x = np.empty((n, LENGTH), np.int64)
        x[:, 0] = rng.integers(0, VOCAB, n)
        for t in range(1, LENGTH):
            x[:, t] = successors[x[:, t - 1], rng.integers(0, 2, n)]
        return x

    def hard(n):
        x = np.empty((n, LENGTH), np.int64)
        x[:, :2] = rng.integers(0, VOCAB, (n, 2))
        for t in range(2, LENGTH):
            follow = table[x[:, t - 2], x[:, t - 1]]
            x[:, t] = np.where(rng.random(n) < HARD_NOISE, rng.integers(0, VOCAB, n), follow)
        return x

    easy_train, easy_held = easy(TRAIN), easy(HELDOUT)
    return {"easy": (easy_train, easy_held), "easy_copy": (easy_train.copy(), easy_held.copy()),
            "hard": (hard(TRAIN), hard(HELDOUT)),
            "noise": (rng.integers(0, VOCAB, (TRAIN, LENGTH)), rng.integers(0, VOCAB, (HELDOUT, LENGTH)))}


def make_rule(arm: str, names: tuple[str, ...]):
    from replayloader.mixing import ADO, ODM, ExcessLoss, FixedMixture, ODMExp3

    k, warmup = len(names), int(0.02 * STEPS)
    if arm == "stratified":
        return FixedMixture.stratified(k)
    if arm == "odm":
        return ODM(k, warmup_steps=warmup)
    if arm == "odm_exp3":
        return ODMExp3(k, warmup_steps=warmup)
    if arm == "excess":
        return ExcessLoss([floors()[n] for n in names])
    if arm == "ado":
        return ADO(k, step_scale=0.1)
    raise ValueError(f"unknown arm {arm!r}")


def run(check: str, arm: str, seed: int) -> dict:
    import torch
    import torch.nn.functional as F

    from replayloader.mixing import MixtureSampler

    torch.set_num_threads(1)
    names = CHECKS[check]
    data = make_sources()
    train = np.concatenate([data[n][0] for n in names])
    held = {n: torch.from_numpy(data[n][1]) for n in ("easy", "hard")}
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 32), torch.nn.Flatten(-2), torch.nn.Linear(64, 128),
                                torch.nn.ReLU(), torch.nn.Linear(128, VOCAB))
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    sampler = MixtureSampler([TRAIN] * len(names), batch_size=BATCH, rule=make_rule(arm, names), seed=seed,
                             names=list(names))

    def per_sequence_loss(x):
        context = torch.stack([x[:, :-2], x[:, 1:-1]], dim=-1)  # (b, L-2, 2)
        logits = model(context)
        ce = F.cross_entropy(logits.reshape(-1, VOCAB), x[:, 2:].reshape(-1), reduction="none")
        return ce.view(x.shape[0], -1).mean(dim=1)

    weights, mix_s, step_s = [], 0.0, 0.0
    for _ in range(STEPS):
        t0 = time.process_time()
        batch = sampler.next_batch()
        t1 = time.process_time()
        x = torch.from_numpy(train[batch.indices])
        losses = per_sequence_loss(x)
        opt.zero_grad()
        losses.mean().backward()
        opt.step()
        t2 = time.process_time()
        sampler.feedback(batch.indices, loss=losses.detach())
        t3 = time.process_time()
        mix_s += (t1 - t0) + (t3 - t2)
        step_s += t3 - t0
        weights.append(sampler.probabilities().tolist())
    with torch.no_grad():
        excess = {n: float(per_sequence_loss(held[n]).mean()) - floors()[n] for n in held}
    w = np.array(weights)
    tail = w[int(0.8 * STEPS):].mean(axis=0)
    return {"check": check, "arm": arm, "seed": seed, "names": list(names), "steps": STEPS,
            "final_weights": w[-1].tolist(), "tail_weights": tail.tolist(),
            "weights_every_50": w[::50].tolist(), "heldout_excess": excess,
            "mean_excess": float(np.mean(list(excess.values()))), "mixing_cpu_s": mix_s, "step_cpu_s": step_s}


def record_path(check: str, arm: str, seed: int) -> Path:
    return RESULTS / f"{check}_{arm}_seed{seed}.json"


def summary() -> str:
    lines = ["# Known-answer check of the mixing rules (issue 40)", "",
             f"Recompute: `python -m experiments.mixing_known_answer --summary`. Protocol: the docstring of "
             f"`experiments/mixing_known_answer.py`. Mean over seeds {', '.join(map(str, SEEDS))}; 'tail' = mean "
             f"weight over the last 20% of {STEPS} steps; excess = held-out loss above the source's entropy floor "
             f"(nats); right way = tail weight on hard > 1/K (and on noise <= 1/K in check B).", ""]
    for check, names in CHECKS.items():
        k = len(names)
        lines += [f"## Check {check}: {', '.join(names)} (1/K = {1 / k:.3f})", "",
                  "| arm | tail weights (" + " / ".join(names) + ") | excess easy | excess hard | mean excess "
                  "| right way | mixing CPU share |", "|---|---|---|---|---|---|---|"]
        for arm in ARMS:
            recs = [json.loads(record_path(check, arm, s).read_text()) for s in SEEDS
                    if record_path(check, arm, s).exists()]
            if not recs:
                continue
            tail = np.mean([r["tail_weights"] for r in recs], axis=0)
            easy = np.mean([r["heldout_excess"]["easy"] for r in recs])
            hard = np.mean([r["heldout_excess"]["hard"] for r in recs])
            mean = np.mean([r["mean_excess"] for r in recs])
            share = np.mean([r["mixing_cpu_s"] / r["step_cpu_s"] for r in recs])
            right = tail[names.index("hard")] > 1 / k and (check == "A" or tail[names.index("noise")] <= 1 / k)
            verdict = "-" if arm == "stratified" else ("yes" if right else "no")
            lines.append(f"| {arm} (n={len(recs)}) | {' / '.join(f'{v:.3f}' for v in tail)} | {easy:.3f} | "
                         f"{hard:.3f} | {mean:.3f} | {verdict} | {share:.1%} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summary", action="store_true", help="print (and write) the table from the records")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    parser.add_argument("--checks", nargs="+", default=list(CHECKS), choices=list(CHECKS))
    args = parser.parse_args(argv)
    if args.summary:
        text = summary()
        (RESULTS / "summary.md").write_text(text + "\n")
        print(text)
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    print("command:", shlex.join([sys.executable, "-m", "experiments.mixing_known_answer", *(argv or sys.argv[1:])]))
    for check in args.checks:
        for seed in args.seeds:
            for arm in args.arms:
                path = record_path(check, arm, seed)
                if path.exists():
                    continue
                rec = run(check, arm, seed)
                path.write_text(json.dumps(rec) + "\n")
                print(f"{check} {arm} seed {seed}: tail {np.round(rec['tail_weights'], 3).tolist()} "
                      f"mean excess {rec['mean_excess']:.3f}", flush=True)


if __name__ == "__main__":
    main()

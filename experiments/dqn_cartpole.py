"""DQN with prioritized replay on CartPole, the environment stepping in a background worker.

    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 nice -n 10 python -m experiments.dqn_cartpole --seeds 0 1 2 \
        --env-steps 30000 --out results/dqn_cartpole/dqn_cartpole.md
    python -m experiments.dqn_cartpole --seeds 0 --env-steps 400 --warmup 64 --bins 2    # a smoke run, seconds

runs the same agent twice per seed: ``workers=0`` (the loader steps the environment in the training loop)
and ``workers=1`` (a background thread steps it while the learner trains, a `RateLimiter` holding both to the
same 32 sampled transitions per inserted one). Writes the learning curves (mean episode return per bin of
environment steps, over seeds) as a markdown table and a plot.

The producer is an actor: it steps a gymnasium CartPole-v1 for 2 steps with an epsilon-greedy policy from a
copy of the Q-network, which the learner refreshes every 250 updates. Priorities are PER's (|TD error| + 1e-3,
alpha 0.6, beta 0.4, new transitions at the largest priority so far, FIFO eviction) through `by_name("per")`.
With a worker, when the actor's copy is refreshed relative to its steps depends on thread timing, so runs with a
worker are not bit-reproducible; without one they are.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import os
import platform
import threading
import time
from pathlib import Path

import numpy as np

import gymnasium as gym  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from replayloader import ReplayBuffer, ReplayDataLoader  # noqa: E402
from replayloader.loader.rate_limiter import RateLimiter  # noqa: E402
from replayloader.strategies import by_name  # noqa: E402

STEPS_PER_CALL, BATCH, GAMMA = 2, 64, 0.99
WARMUP = 1000  # transitions stored before learning starts


class Actor:
    """The producer: steps the environment with an epsilon-greedy copy of the Q-network."""

    def __init__(self, q: nn.Module, seed: int, total_steps: int) -> None:
        self.env = gym.make("CartPole-v1")
        self.obs, _ = self.env.reset(seed=seed)
        self.rng = np.random.default_rng(seed)
        self.policy = copy.deepcopy(q)
        self.lock = threading.Lock()  # the learner swaps in new weights while this thread acts
        self.total_steps = total_steps
        self.steps = 0
        self.episode_return = 0.0
        self.episodes: list[tuple[int, float]] = []  # (environment steps at the end, return)

    def epsilon(self) -> float:
        return max(0.05, 1.0 - 0.95 * self.steps / (0.3 * self.total_steps))

    def act(self, obs: np.ndarray) -> int:
        if self.rng.random() < self.epsilon():
            return int(self.rng.integers(2))
        with self.lock, torch.no_grad():
            return int(self.policy(torch.as_tensor(obs, dtype=torch.float32)).argmax())

    def refresh(self, q: nn.Module) -> None:
        with self.lock:
            self.policy.load_state_dict(q.state_dict())

    def __call__(self) -> dict[str, np.ndarray]:
        rows = {"obs": [], "action": [], "reward": [], "next_obs": [], "done": []}
        for _ in range(STEPS_PER_CALL):
            action = self.act(self.obs)
            next_obs, reward, terminated, truncated, _ = self.env.step(action)
            for key, value in zip(rows, (self.obs, action, reward, next_obs, terminated)):
                rows[key].append(value)
            self.steps += 1
            self.episode_return += reward
            self.obs = next_obs
            if terminated or truncated:
                self.episodes.append((self.steps, self.episode_return))
                self.episode_return = 0.0
                self.obs, _ = self.env.reset()
        return {"obs": np.asarray(rows["obs"], np.float32), "action": np.asarray(rows["action"], np.int64),
                "reward": np.asarray(rows["reward"], np.float32),
                "next_obs": np.asarray(rows["next_obs"], np.float32),
                "done": np.asarray(rows["done"], np.float32)}


def q_network() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))


def td_errors(q: nn.Module, target: nn.Module, data: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Double-DQN targets y and the predictions Q(s, a) of a batch of transitions (tensors)."""
    with torch.no_grad():
        best = q(data["next_obs"]).argmax(1, keepdim=True)
        y = data["reward"] + GAMMA * (1 - data["done"]) * target(data["next_obs"]).gather(1, best).squeeze(1)
    return y, q(data["obs"]).gather(1, data["action"][:, None]).squeeze(1)


def learn(q: nn.Module, target: nn.Module, optimizer: torch.optim.Optimizer, batch) -> torch.Tensor:
    """One importance-weighted update on a sampled batch; returns its new priorities |TD error| + 1e-3."""
    y, predicted = td_errors(q, target, {k: torch.as_tensor(v) for k, v in batch.data.items()})
    loss = (torch.as_tensor(batch.weights, dtype=torch.float32)
            * nn.functional.smooth_l1_loss(predicted, y, reduction="none")).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return (y - predicted).detach().abs() + 1e-3


def train(seed: int, env_steps: int, workers: int, warmup: int = WARMUP) -> dict:
    torch.manual_seed(seed)
    q = q_network()
    target = copy.deepcopy(q)
    optimizer = torch.optim.Adam(q.parameters(), lr=1e-3)
    actor = Actor(q, seed, env_steps)
    buffer = ReplayBuffer(20000, alpha=0.6, beta=0.4, strategy=by_name("per"), seed=seed)
    calls = env_steps // STEPS_PER_CALL
    if workers:  # the same 32 samples per insert as the synchronous loop, within 4 batches either way
        limiter = RateLimiter(samples_per_insert=BATCH / STEPS_PER_CALL, min_size=warmup, error_buffer=4 * BATCH)
        loader = ReplayDataLoader(actor, buffer, BATCH, steps=calls, workers=workers, rate_limiter=limiter)
    else:
        loader = ReplayDataLoader(actor, buffer, BATCH, steps=calls, min_size=warmup)
    start = time.perf_counter()
    for updates, batch in enumerate(loader, 1):
        loader.feedback(batch, weight=learn(q, target, optimizer, batch))
        if updates % 250 == 0:
            actor.refresh(q)
        if updates % 500 == 0:
            target.load_state_dict(q.state_dict())
    stats = loader.stats()
    return {"episodes": actor.episodes, "seconds": time.perf_counter() - start, "updates": updates,
            "learner_wait_s": stats["learner_wait_s"], "producer_wait_s": stats["producer_wait_s"]}


def curve(episodes: list[tuple[int, float]], env_steps: int, bins: int) -> np.ndarray:
    """Mean return of the episodes that ended in each bin of environment steps (nan if none)."""
    edges = np.linspace(0, env_steps, bins + 1)
    ends = np.array([e[0] for e in episodes])
    returns = np.array([e[1] for e in episodes])
    return np.array([returns[(ends > lo) & (ends <= hi)].mean() if ((ends > lo) & (ends <= hi)).any() else np.nan
                     for lo, hi in zip(edges[:-1], edges[1:])])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--env-steps", type=int, default=30000)
    parser.add_argument("--bins", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=WARMUP, help="transitions stored before learning starts")
    parser.add_argument("--out", type=Path, default=None, help="markdown report (a .png plot beside it)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    runs = {}
    for workers in (0, 1):
        for seed in args.seeds:
            runs[workers, seed] = run = train(seed, args.env_steps, workers, args.warmup)
            last = [r for _, r in run["episodes"][-20:]]
            print(f"workers={workers} seed={seed}: {len(run['episodes'])} episodes, mean return of the last 20 "
                  f"{np.mean(last):.1f}, {run['updates']} updates in {run['seconds']:.0f} s", flush=True)
    if args.out is not None:
        report(args, runs)


def report(args, runs: dict) -> None:
    edges = np.linspace(0, args.env_steps, args.bins + 1).astype(int)
    curves = {w: np.array([curve(runs[w, s]["episodes"], args.env_steps, args.bins) for s in args.seeds])
              for w in (0, 1)}
    lines = ["# DQN with prioritized replay on CartPole-v1: environment in a background worker vs inline", "",
             f"Command: `OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 nice -n 10 python -m experiments.dqn_cartpole "
             f"--seeds {' '.join(map(str, args.seeds))} --env-steps {args.env_steps} --warmup {args.warmup} "
             f"--bins {args.bins} --out {args.out}`  ",
             f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC  ",
             f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores shared with other "
             f"jobs, no GPU; torch {torch.__version__} on 1 thread, gymnasium {gym.__version__}", "",
             "Mean episode return (over seeds) of the episodes ending in each bin of environment steps; "
             "± is the standard deviation over seeds. workers=0: the loader steps the environment inline; "
             "workers=1: a background thread does, paced by a RateLimiter to the same 32 samples per insert.", "",
             "| env steps | workers=0 | workers=1 |", "|---|---:|---:|"]
    for i in range(args.bins):
        cells = [f"{np.nanmean(curves[w][:, i]):.1f} ± {np.nanstd(curves[w][:, i]):.1f}" for w in (0, 1)]
        lines.append(f"| {edges[i]:,}–{edges[i + 1]:,} | {cells[0]} | {cells[1]} |")
    lines += ["", "| run | episodes | mean return, last 20 episodes | updates | seconds | learner waited (s) "
              "| producer waited (s) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for (w, s), run in sorted(runs.items()):
        last = np.mean([r for _, r in run["episodes"][-20:]])
        lines.append(f"| workers={w} seed={s} | {len(run['episodes'])} | {last:.1f} | {run['updates']} | "
                     f"{run['seconds']:.0f} | {run['learner_wait_s']:.1f} | {run['producer_wait_s']:.1f} |")
    args.out.write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    centers = (edges[:-1] + edges[1:]) / 2
    fig, ax = plt.subplots(figsize=(6, 4))
    for w, label in ((0, "inline (workers=0)"), (1, "background worker (workers=1)")):
        mean, std = np.nanmean(curves[w], 0), np.nanstd(curves[w], 0)
        ax.plot(centers, mean, marker="o", label=label)
        ax.fill_between(centers, mean - std, mean + std, alpha=0.2)
    ax.set_xlabel("environment steps")
    ax.set_ylabel(f"episode return (mean over {len(args.seeds)} seeds)")
    ax.set_title("DQN + PER on CartPole-v1")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=100)


if __name__ == "__main__":
    main()

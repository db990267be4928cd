"""Why does PER lose on CartPole? SB3 DQN on CartPole-v1: uniform replay, replayloader's PER, and cpprb's PER behind
the same SB3 training step (issue 42).

    python -m experiments.sb3_cartpole_per                         # arms uniform per cpprb, seeds 0-9, 20,000 steps
    python -m experiments.sb3_cartpole_per --arms per --seeds 3     # a part of the grid
    python -m experiments.sb3_cartpole_per --summary --out results/sb3_cartpole/summary.md

An outside client trained SB3's DQN with RL Baselines3 Zoo's CartPole-v1 settings for 20,000 steps and found
`PrioritizedDQN`'s greedy return below uniform's in 3 of 3 seeds. Is that prioritized replay on this task, or this
library's implementation of it? Three arms, everything else shared:

* ``uniform``: `stable_baselines3.DQN` with SB3's own `ReplayBuffer`;
* ``per``: `replayloader.sb3.PrioritizedDQN` with its `PrioritizedReplayBuffer`;
* ``cpprb``: the same `PrioritizedDQN` training step (importance-weighted Huber loss, |TD error| fed back), with
  the priorities, the sampling and the importance weights done by cpprb's `PrioritizedReplayBuffer` (an
  independent C++/Cython implementation) instead of this library's sum tree. The transitions themselves
  stay in SB3's storage; cpprb holds each transition's slot, and sample() reads the rows at the slots cpprb
  draws.

Both PER arms: alpha 0.6, beta linear 0.4 -> 1 over the run, priority eps 1e-6 (`PrioritizedDQN`'s defaults, what
a client gets without tuning), new transitions at the largest priority so far.

Zoo settings (rl-baselines3-zoo `hyperparams/dqn.yml`, CartPole-v1, commit ce95481): lr 2.3e-3, batch 64,
buffer 100,000, learning_starts 1,000, gamma 0.99, target_update_interval 10, train_freq 256,
gradient_steps 128, exploration_fraction 0.16, exploration_final_eps 0.04, net_arch [256, 256]; the zoo trains
50,000 steps, this runs 20,000 as the client did. (The client used a 10^6 buffer; with 20,000 steps neither size
fills, so the stored transitions and every sampling probability are the same.) Each run is evaluated greedily
(10 episodes, a separate environment seeded seed + 10,000) every 5,000 steps and at the end; its record goes to
``results/sb3_cartpole/cartpole_<arm>_seed<seed>.json``, and finished runs are skipped.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import numpy as np

ARMS = ("uniform", "per", "cpprb")
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "sb3_cartpole"
ZOO = dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1_000, gamma=0.99,
           target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
           exploration_final_eps=0.04, policy_kwargs={"net_arch": [256, 256]})
PER = {"alpha": 0.6, "beta_start": 0.4, "priority_eps": 1e-6}


def record_path(results: Path, arm: str, seed: int) -> Path:
    return results / f"cartpole_{arm}_seed{seed}.json"


def cpprb_buffer_class():
    """A `replayloader.sb3.PrioritizedReplayBuffer` whose priorities, draws and weights are cpprb's (one env)."""
    import cpprb
    from stable_baselines3.common.buffers import ReplayBuffer

    from replayloader.sb3 import PrioritizedReplayBuffer

    class CpprbPrioritizedBuffer(PrioritizedReplayBuffer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if self.n_envs != 1 or self.optimize_memory_usage:
                raise ValueError("this adapter handles one env without optimize_memory_usage")
            self.cpprb = cpprb.PrioritizedReplayBuffer(self.buffer_size, {"slot": {"dtype": np.int64}},
                                                       alpha=self.alpha, eps=self.priority_eps)

        def add(self, *args, **kwargs):
            position = self.pos
            ReplayBuffer.add(self, *args, **kwargs)  # SB3's storage only: this library's tree is not used
            self.cpprb.add(slot=position)  # at cpprb's largest priority so far, as PER adds

        def _draw(self, batch_size):
            drawn = self.cpprb.sample(batch_size, beta=self.current_beta())
            slots = drawn["slot"].reshape(-1).astype(np.int64)
            if not np.array_equal(slots, drawn["indexes"]):  # both are rings of the same size, filled in order
                raise AssertionError("cpprb's index and SB3's position disagree")
            return slots, drawn["weights"].astype(np.float32)

        def update_priorities(self, indices, priorities):
            self.cpprb.update_priorities(np.asarray(indices), np.asarray(priorities, dtype=np.float64))
            self._awaiting_feedback = False

    return CpprbPrioritizedBuffer


def greedy_returns(model, env, episodes: int) -> list[float]:
    returns = []
    for _ in range(episodes):
        obs, _ = env.reset()
        total, done = 0.0, False
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(int(action))
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    return returns


def run(arm: str, seed: int, steps: int, out: Path, *, eval_every: int = 5_000, eval_episodes: int = 10) -> dict:
    import gymnasium as gym
    import stable_baselines3
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.monitor import Monitor

    from replayloader import LinearSchedule
    from replayloader.sb3 import PrioritizedDQN

    torch.set_num_threads(1)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    episodes: list[tuple[int, float, float]] = []  # (step at the end, return, training CPU seconds)
    evals: list[dict] = []
    eval_env = gym.make("CartPole-v1")
    eval_env.reset(seed=seed + 10_000)
    eval_cpu = 0.0

    class Record(BaseCallback):
        def _on_step(self) -> bool:
            nonlocal eval_cpu
            for info in self.locals["infos"]:
                if "episode" in info:
                    episodes.append((self.num_timesteps, float(info["episode"]["r"]),
                                     time.process_time() - cpu0 - eval_cpu))
            if self.num_timesteps % eval_every == 0 or self.num_timesteps == steps:
                start = time.process_time()
                evals.append({"step": self.num_timesteps, "returns": greedy_returns(self.model, eval_env,
                                                                                    eval_episodes)})
                eval_cpu += time.process_time() - start
            return True

    env = Monitor(gym.make("CartPole-v1"))
    env.reset(seed=seed)
    env.action_space.seed(seed)
    shared = ZOO | {"seed": seed, "device": "cpu"}
    buffer = {"alpha": PER["alpha"], "beta": LinearSchedule(PER["beta_start"], 1.0, steps=1),
              "priority_eps": PER["priority_eps"]}
    if arm == "uniform":
        model = DQN("MlpPolicy", env, **shared)
    elif arm == "per":
        model = PrioritizedDQN("MlpPolicy", env, replay_buffer_kwargs=buffer, **shared)
    else:
        model = PrioritizedDQN("MlpPolicy", env, replay_buffer_class=cpprb_buffer_class(),
                               replay_buffer_kwargs=buffer, **shared)
    model.learn(total_timesteps=steps, callback=Record())

    versions = {"stable_baselines3": stable_baselines3.__version__, "torch": torch.__version__,
                "numpy": np.__version__}
    if arm == "cpprb":
        import cpprb

        versions["cpprb"] = getattr(cpprb, "__version__", "11.0.0")
    step, ret, cpu = (list(column) for column in zip(*episodes)) if episodes else ([], [], [])
    record = {"env_id": "CartPole-v1", "arm": arm, "seed": seed, "steps": steps,
              "config": {k: v for k, v in shared.items() if k != "policy_kwargs"} | {"net_arch": [256, 256]}
              | ({} if arm == "uniform" else {"alpha": PER["alpha"], "beta": "linear 0.4 -> 1.0 over the run",
                                              "priority_eps": PER["priority_eps"]}),
              "versions": versions,
              "episodes": {"step": step, "return": ret, "cpu_s": np.round(cpu, 3).tolist()},
              "evals": evals, "train_cpu_s": round(time.process_time() - cpu0 - eval_cpu, 2),
              "wall_s": round(time.perf_counter() - wall0, 1)}
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    partial.write_text(json.dumps(record, separators=(",", ":")))
    os.replace(partial, out)
    return record


# ----------------------------------------------------------------------------------------------- summary
def final_greedy(record: dict) -> float:
    """The mean greedy return at the last evaluation (step = the run's steps)."""
    last = [e for e in record["evals"] if e["step"] == record["steps"]]
    return float(np.mean(last[0]["returns"])) if last else math.nan


def greedy_at(record: dict, step: int) -> float:
    found = [e for e in record["evals"] if e["step"] == step]
    return float(np.mean(found[0]["returns"])) if found else math.nan


def best_training_mean(record: dict, window: int = 20) -> float:
    """The highest mean training return over ``window`` consecutive episodes (did the run ever learn?)."""
    ret = np.asarray(record["episodes"]["return"], dtype=float)
    if len(ret) < window:
        return math.nan
    return float(np.convolve(ret, np.ones(window) / window, mode="valid").max())


def load(results: Path, arms, seeds) -> dict[tuple[str, int], dict]:
    found = {}
    for arm in arms:
        for seed in seeds:
            path = record_path(results, arm, seed)
            if path.exists():
                found[arm, seed] = json.loads(path.read_text())
    return found


def paired(a: list[float], b: list[float]) -> str:
    """b - a paired by seed: mean, two-sided paired t 95% CI and p, exact two-sided sign-flip p, b ahead/behind."""
    from scipy import stats

    d = np.asarray(b, dtype=float) - np.asarray(a, dtype=float)
    if len(d) < 2:
        return f"{d.mean():+.1f} ({len(d)} pair)" if len(d) else "no pair"
    if np.allclose(d, d[0]):
        return f"{d.mean():+.1f} in every one of {len(d)} pairs"
    t = stats.ttest_1samp(d, 0.0)
    low, high = t.confidence_interval(0.95)
    flip = stats.permutation_test((d,), np.mean, permutation_type="samples", n_resamples=np.inf).pvalue
    return (f"{d.mean():+.1f} [{low:+.1f}, {high:+.1f}], paired t p = {t.pvalue:.3g}, sign-flip p = {flip:.3g}; "
            f"ahead in {(d > 0).sum()}, behind in {(d < 0).sum()}, tied in {(d == 0).sum()} of {len(d)}")


def summary(results: Path, arms, seeds) -> str:
    records = load(results, arms, seeds)
    done = [s for s in seeds if all((arm, s) in records for arm in arms)]
    lines = [f"Seeds with every arm finished: {len(done)} of {len(seeds)} ({', '.join(map(str, done))})", "",
             "### Greedy return at the end (mean of 10 episodes per run; 500 is the maximum)", "",
             "| seed | " + " | ".join(arms) + " |", "|---:|" + "---:|" * len(arms)]
    lines += [f"| {s} | " + " | ".join(f"{final_greedy(records[a, s]):.1f}" for a in arms) + " |" for s in done]
    finals = {a: [final_greedy(records[a, s]) for s in done] for a in arms}
    lines += ["| mean | " + " | ".join(f"{np.mean(finals[a]):.1f}" for a in arms) + " |",
              "| median | " + " | ".join(f"{np.median(finals[a]):.1f}" for a in arms) + " |",
              "| runs at 500 | " + " | ".join(f"{sum(v == 500 for v in finals[a])} of {len(done)}" for a in arms)
              + " |", ""]
    for a, b in (("uniform", "per"), ("uniform", "cpprb"), ("cpprb", "per")):
        if a in arms and b in arms:
            lines.append(f"- {b} - {a}: {paired(finals[a], finals[b])}")
    steps = sorted({e["step"] for r in records.values() for e in r["evals"]})
    lines += ["", "### Greedy return during training (mean over seeds of each run's 10-episode mean)", "",
              "| step | " + " | ".join(arms) + " |", "|---:|" + "---:|" * len(arms)]
    lines += [f"| {step:,} | " + " | ".join(f"{np.mean([greedy_at(records[a, s], step) for s in done]):.1f}"
                                            for a in arms) + " |" for step in steps]
    lines += ["", "### Training returns and cost (means over seeds)", "",
              "| arm | best 20-episode mean training return | last 20 episodes | episodes | training CPU s |",
              "|---|---:|---:|---:|---:|"]
    for a in arms:
        rs = [records[a, s] for s in done]
        lines.append(f"| {a} | {np.mean([best_training_mean(r) for r in rs]):.1f} | "
                     f"{np.mean([np.mean(r['episodes']['return'][-20:]) for r in rs]):.1f} | "
                     f"{np.mean([len(r['episodes']['return']) for r in rs]):.0f} | "
                     f"{np.mean([r['train_cpu_s'] for r in rs]):.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=list(range(10)))
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--eval-every", type=int, default=5_000)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--summary", action="store_true")
    parser.add_argument("--out", type=Path, help="with --summary: also write the tables here")
    args = parser.parse_args(argv)
    if args.summary:
        text = summary(args.results, args.arms, args.seeds)
        print(text)
        if args.out is not None:
            seeds = " ".join(map(str, args.seeds))
            args.out.write_text("# SB3 DQN on CartPole-v1: uniform vs two PER implementations (issue 42, generated)"
                                f"\n\nMade by `python -m experiments.sb3_cartpole_per --summary --seeds {seeds} "
                                f"--out {args.out.as_posix()}` from the records beside it. Settings: the script's "
                                f"docstring (RL Zoo's CartPole-v1 DQN settings, {args.steps:,} steps).\n\n{text}\n")
        return
    for seed in args.seeds:  # seed by seed, the arms of a seed next to each other: one at a time
        for arm in args.arms:
            out = record_path(args.results, arm, seed)
            if out.exists():
                print(f"{out.name}: done, skipped", flush=True)
                continue
            r = run(arm, seed, args.steps, out, eval_every=args.eval_every, eval_episodes=args.eval_episodes)
            print(f"{out.name}: greedy {final_greedy(r):.1f}, {r['train_cpu_s']:.1f} training CPU s, "
                  f"{r['wall_s']:.0f} wall s", flush=True)


if __name__ == "__main__":
    main()

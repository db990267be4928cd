"""PER vs uniform replay inside Stable-Baselines3's DQN on MinAtar Breakout: a resumable driver (issue 30).

    python -m experiments.sb3_minatar                      # the protocol's grid: arms uniform per, seeds 0-4
    python -m experiments.sb3_minatar --list               # each run, done or not, and its command; runs nothing
    python -m experiments.sb3_minatar --summary            # the protocol's endpoints from the finished records
    python -m experiments.sb3_minatar --summary --out results/sb3_minatar/sb3_minatar.md   # ... also written, with a figure
    python -m experiments.sb3_minatar --arm per --seed 0   # one run in this process (what the driver starts)
    python -m experiments.sb3_minatar --seeds 100-114 --results results/sb3_seconds   # issue 42's grid
                                                           # (its endpoints: experiments/sb3_seconds_summary.py)

Protocol: results/sb3_minatar/sb3_minatar_protocol.md. The driver starts one process per (arm, seed), seed by seed with
both arms of a seed next to each other (finished pairs arrive early), ``--parallel`` at a time (default 2, so
the two arms of a seed run side by side on the same load), under ``nice``. A run
writes its record ``<results>/breakout_<arm>_seed<seed>.json.gz`` only when it finishes (atomically), so
starting the driver again skips finished runs; an interrupted run starts again from frame 0 (SB3 cannot save
the environments' state mid-episode, so a mid-run resume would not be identical to an uninterrupted run).

Arms: ``uniform`` is `stable_baselines3.DQN` with SB3's own `ReplayBuffer`; ``per`` is
`replayloader.sb3.PrioritizedDQN` (alpha 0.6, beta 0.4 -> 1 over the run, priority |TD| + 1e-3). Everything
else is shared.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

GAME, ENV_ID = "breakout", "MinAtar/Breakout-v1"
ARMS = ("uniform", "per")
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "sb3_minatar"


def record_path(results: Path, arm: str, seed: int) -> Path:
    return results / f"{GAME}_{arm}_seed{seed}.json.gz"


def parse_seeds(text: str) -> list[int]:
    """One ``--seeds`` word: ``7`` or an inclusive range ``100-114``."""
    first, dash, last = text.partition("-")
    if not dash:
        return [int(text)]
    if int(last) < int(first):
        raise argparse.ArgumentTypeError(f"empty seed range {text!r}")
    return list(range(int(first), int(last) + 1))


# ----------------------------------------------------------------------------------------------- one run
def make_env(seed: int):
    import gymnasium as gym
    from minatar.gym import register_envs
    from stable_baselines3.common.monitor import Monitor

    if ENV_ID not in gym.registry:
        register_envs()
    env = Monitor(gym.make(ENV_ID))  # minimal action set, sticky actions 0.1, difficulty ramping: the defaults
    env.reset(seed=seed)
    env.action_space.seed(seed)
    return env


def young_tian_extractor():
    """Young & Tian 2019's MinAtar network body: conv 3x3, 16 channels, stride 1 -> ReLU -> linear 128 -> ReLU
    (the Q head on top is SB3's). Observations are (10, 10, channels) booleans, moved channels-first here."""
    import torch
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

    class YoungTian(BaseFeaturesExtractor):
        def __init__(self, observation_space):
            super().__init__(observation_space, features_dim=128)
            height, width, channels = observation_space.shape
            self.conv = torch.nn.Conv2d(channels, 16, kernel_size=3, stride=1)
            self.head = torch.nn.Linear(16 * (height - 2) * (width - 2), 128)

        def forward(self, observations):
            x = torch.relu(self.conv(observations.float().permute(0, 3, 1, 2)))
            return torch.relu(self.head(x.flatten(1)))

    return YoungTian


def evaluate(model, env, episodes: int, max_frames: int, rng: np.random.Generator) -> list[float]:
    """Returns of ``episodes`` episodes at epsilon 0.001 (at most ``max_frames`` frames in all)."""
    returns, frames = [], 0
    for _ in range(episodes):
        obs, _ = env.reset()
        total, done = 0.0, False
        while not done and frames < max_frames:
            if rng.random() < 0.001:
                action = env.action_space.sample()
            else:
                action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(int(action))
            total, frames, done = total + float(reward), frames + 1, terminated or truncated
        if done:
            returns.append(total)
    return returns


def run(arm: str, seed: int, frames: int, out: Path, *, learning_starts: int = 5_000, eval_every: int = 50_000,
        eval_episodes: int = 5) -> None:
    import stable_baselines3
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback

    from replayloader import LinearSchedule
    from replayloader.sb3 import PrioritizedDQN

    torch.set_num_threads(1)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    # (frame at the end, return, training CPU seconds, training wall seconds); evaluation time excluded from both
    episodes: list[tuple[int, float, float, float]] = []
    evals: list[dict] = []
    eval_env, eval_rng = make_env(seed + 10_000), np.random.default_rng(seed + 10_000)
    eval_cpu = eval_wall = 0.0

    class Record(BaseCallback):
        def _on_step(self) -> bool:
            nonlocal eval_cpu, eval_wall
            for info in self.locals["infos"]:
                if "episode" in info:
                    episodes.append((self.num_timesteps, float(info["episode"]["r"]),
                                     time.process_time() - cpu0 - eval_cpu, time.perf_counter() - wall0 - eval_wall))
            if self.num_timesteps % eval_every == 0 or self.num_timesteps == frames:
                start, start_wall = time.process_time(), time.perf_counter()
                returns = evaluate(self.model, eval_env, eval_episodes, 20_000, eval_rng)
                evals.append({"frame": self.num_timesteps, "returns": returns})
                eval_cpu += time.process_time() - start
                eval_wall += time.perf_counter() - start_wall
            return True

    shared = dict(learning_rate=2.5e-4, buffer_size=100_000, learning_starts=learning_starts, batch_size=32,
                  gamma=0.99, train_freq=4, gradient_steps=1, target_update_interval=1_000,
                  exploration_initial_eps=1.0, exploration_final_eps=0.01,
                  exploration_fraction=min(1.0, (learning_starts + 100_000) / frames),
                  policy_kwargs={"features_extractor_class": young_tian_extractor(), "net_arch": [],
                                 "optimizer_kwargs": {"eps": 3.125e-4}},
                  seed=seed, device="cpu")
    buffer = {"alpha": 0.6, "beta": LinearSchedule(0.4, 1.0, steps=1), "priority_eps": 1e-3}
    if arm == "per":
        model = PrioritizedDQN("MlpPolicy", make_env(seed), replay_buffer_kwargs=buffer, **shared)
    else:
        model = DQN("MlpPolicy", make_env(seed), **shared)
    model.learn(total_timesteps=frames, callback=Record())

    frame, ret, cpu, wall = (np.array(column) for column in zip(*episodes)) if episodes else ([], [], [], [])
    record = {
        "game": GAME, "env_id": ENV_ID, "arm": arm, "seed": seed, "frames": frames, "finished": True,
        "config": {k: v for k, v in shared.items() if k != "policy_kwargs"} | {"network": "young_tian_2019"}
        | ({"alpha": 0.6, "beta": "linear 0.4 -> 1.0 over the run", "priority_eps": 1e-3} if arm == "per"
           else {"buffer": "stable_baselines3 ReplayBuffer"}),
        "versions": {"stable_baselines3": stable_baselines3.__version__, "torch": torch.__version__,
                     "numpy": np.__version__},
        "episodes": {"frame": np.asarray(frame).tolist(), "return": np.asarray(ret).tolist(),
                     "cpu_s": np.round(cpu, 3).tolist(), "wall_s": np.round(wall, 3).tolist()},
        "evals": evals, "train_cpu_s": round(time.process_time() - cpu0 - eval_cpu, 2),
        "train_wall_s": round(time.perf_counter() - wall0 - eval_wall, 2),
        "wall_s": round(time.perf_counter() - wall0, 1),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with gzip.open(partial, "wt") as handle:
        json.dump(record, handle, separators=(",", ":"))
    os.replace(partial, out)  # a record exists only once its run finished
    print(f"{out.name}: {len(episodes)} episodes, last-10% mean return {last_tenth_mean(record):.2f}, "
          f"{record['train_cpu_s']:.0f} CPU s", flush=True)


# ------------------------------------------------------------------------------------------------ driver
def last_tenth_mean(record: dict) -> float:
    """Primary endpoint of one run: the mean return of training episodes ending in the last 10% of frames."""
    frame, ret = np.asarray(record["episodes"]["frame"]), np.asarray(record["episodes"]["return"])
    late = frame > 0.9 * record["frames"]
    return float(ret[late].mean()) if late.any() else math.nan


def learning_curve_area(record: dict, bins: int = 30) -> float:
    """Secondary 1: the mean over ``bins`` equal frame bins of the mean training return of the episodes ending in
    each bin (a bin where no episode ends is left out of the mean)."""
    frame, ret = np.asarray(record["episodes"]["frame"]), np.asarray(record["episodes"]["return"])
    which = np.minimum(((frame - 1) * bins) // record["frames"], bins - 1)
    means = [ret[which == b].mean() for b in range(bins) if (which == b).any()]
    return float(np.mean(means)) if means else math.nan


def last_evaluation_mean(record: dict) -> float:
    """Secondary 2: the mean return of the evaluation episodes at the last evaluation (frame = the run's frames)."""
    last = [e for e in record["evals"] if e["frame"] == record["frames"]]
    return float(np.mean(last[0]["returns"])) if last and last[0]["returns"] else math.nan


def equal_time_means(uniform: dict, per: dict) -> tuple[float, float]:
    """Secondary 3, for one pair: T = the smaller of the two runs' training CPU seconds; each arm's mean return of
    the training episodes ending in 0.9 T < cpu_s <= T."""
    limit = min(uniform["train_cpu_s"], per["train_cpu_s"])

    def window(record: dict) -> float:
        cpu, ret = np.asarray(record["episodes"]["cpu_s"]), np.asarray(record["episodes"]["return"])
        inside = (cpu > 0.9 * limit) & (cpu <= limit)
        return float(ret[inside].mean()) if inside.any() else math.nan

    return window(uniform), window(per)


def paired_line(diffs: list[float]) -> str:
    """Mean per - uniform difference, its paired-t 95% interval and p."""
    from scipy import stats

    d = np.asarray(diffs, dtype=float)
    if len(d) < 2:
        return f"{d.mean():+.2f} (1 pair)" if len(d) else "no pair"
    result = stats.ttest_1samp(d, 0.0)
    low, high = result.confidence_interval(0.95)
    return f"{d.mean():+.2f} [{low:+.2f}, {high:+.2f}], p = {result.pvalue:.3g}, {len(d)} pairs"


def summary(results: Path, seeds: list[int]) -> str:
    """The protocol's endpoints, per - uniform paired by seed, over the seeds with both arms finished."""
    pairs = {}
    for seed in seeds:
        paths = [record_path(results, arm, seed) for arm in ARMS]
        if all(p.exists() for p in paths):
            pairs[seed] = [json.load(gzip.open(p, "rt")) for p in paths]
    partial = "" if len(pairs) >= 5 else " (PARTIAL: fewer than 5 pairs, not a verdict)"
    endpoints = {"last 10% of frames, mean training return (primary)": lambda u, p: (last_tenth_mean(u),
                                                                                    last_tenth_mean(p)),
                 "learning-curve area, 30 frame bins (secondary 1)": lambda u, p: (learning_curve_area(u),
                                                                                   learning_curve_area(p)),
                 "last evaluation, eps 0.001 (secondary 2)": lambda u, p: (last_evaluation_mean(u),
                                                                           last_evaluation_mean(p)),
                 "equal training CPU time, last 10% of it (secondary 3)": equal_time_means}
    lines = [f"Pairs finished: {len(pairs)} of {len(seeds)}{partial}", ""]
    for name, measure in endpoints.items():
        values = {seed: measure(*records) for seed, records in pairs.items()}
        lines += [f"### {name}", "", "| seed | uniform | per | per - uniform |", "|---:|---:|---:|---:|"]
        lines += [f"| {seed} | {u:.2f} | {p:.2f} | {p - u:+.2f} |" for seed, (u, p) in values.items()]
        lines += ["", "per - uniform: " + paired_line([p - u for u, p in values.values()]), ""]
    lines += ["### Cost per run (descriptive)", "", "| seed | arm | training CPU s | wall s | episodes |",
              "|---:|---|---:|---:|---:|"]
    lines += [f"| {seed} | {r['arm']} | {r['train_cpu_s']:.0f} | {r['wall_s']:.0f} | {len(r['episodes']['frame'])} |"
              for seed, records in pairs.items() for r in records]
    return "\n".join(lines)


def shown(path: Path) -> str:
    """A path as a reader of the report wants it: relative to the checkout when inside it."""
    path, root = path.resolve(), ROOT
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)


def plot_curves(results: Path, seeds: list[int], path: Path, bins: int = 30) -> None:
    """Descriptive: each arm's training return per frame bin, mean over the seeds with a finished run, and each
    seed's curve faintly."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for color, arm in zip(("C0", "C1"), ARMS):
        curves = []
        for seed in seeds:
            path_in = record_path(results, arm, seed)
            if not path_in.exists():
                continue
            with gzip.open(path_in, "rt") as handle:
                r = json.load(handle)
            frame, ret = np.asarray(r["episodes"]["frame"]), np.asarray(r["episodes"]["return"])
            which = np.minimum(((frame - 1) * bins) // r["frames"], bins - 1)
            curve = np.array([ret[which == b].mean() if (which == b).any() else np.nan for b in range(bins)])
            x = (np.arange(bins) + 0.5) * r["frames"] / bins
            ax.plot(x, curve, color=color, alpha=0.25, linewidth=0.8)
            curves.append(curve)
        if curves:
            ax.plot(x, np.nanmean(curves, axis=0), color=color, linewidth=2, label=f"{arm} (mean of {len(curves)})")
    ax.set_xlabel("frame")
    ax.set_ylabel("training return (mean per bin)")
    ax.set_title("SB3 DQN, MinAtar Breakout")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=parse_seeds, default=[[0, 1, 2, 3, 4]],
                        help="seeds or inclusive ranges: 0 1 2, or 100-114")
    parser.add_argument("--arm", choices=ARMS, help="with --seed: one run in this process")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--frames", type=int, default=1_500_000)
    parser.add_argument("--learning-starts", type=int, default=5_000)
    parser.add_argument("--eval-every", type=int, default=50_000)
    parser.add_argument("--eval-episodes", type=int, default=5)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--nice", type=int, default=15)
    parser.add_argument("--parallel", type=int, default=2,
                        help="runs at once, in grid order (2: the two arms of a seed side by side)")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--summary", action="store_true")
    parser.add_argument("--out", type=Path, help="with --summary: write the tables here and the learning curves "
                        "beside it (same name, .png)")
    args = parser.parse_args(argv)
    args.seeds = [seed for group in args.seeds for seed in group]

    if args.summary:
        text = summary(args.results, args.seeds)
        print(text)
        if args.out is not None:
            figure = args.out.with_suffix(".png")
            plot_curves(args.results, args.seeds, figure)
            command = f"python -m experiments.sb3_minatar --summary --out {args.out.as_posix()}"
            args.out.write_text(f"# SB3 DQN on MinAtar Breakout, prioritized vs uniform replay (generated)\n\n"
                                f"Made by `{command}` from the records in `{shown(args.results)}/`; protocol: "
                                f"`results/sb3_minatar/sb3_minatar_protocol.md`. Learning curves: `{figure.name}`.\n\n"
                                f"{text}\n")
        return
    if (args.arm is None) != (args.seed is None):
        parser.error("--arm and --seed go together (one run); leave both out to drive the grid")
    settings = ["--frames", str(args.frames), "--learning-starts", str(args.learning_starts),
                "--eval-every", str(args.eval_every), "--eval-episodes", str(args.eval_episodes),
                "--results", str(args.results.resolve())]
    if args.arm is not None:
        run(args.arm, args.seed, args.frames, record_path(args.results, args.arm, args.seed),
            learning_starts=args.learning_starts, eval_every=args.eval_every, eval_episodes=args.eval_episodes)
        return
    running: list[tuple[str, subprocess.Popen]] = []

    def wait_one() -> None:
        name, process = running.pop(0)
        if process.wait() != 0:
            for _, other in running:
                other.wait()  # let the sibling run finish and write its record before stopping
            sys.exit(f"{name}: the run failed (exit {process.returncode}); the driver stops here")

    for seed in args.seeds:
        for arm in args.arms:
            out = record_path(args.results, arm, seed)
            command = ["nice", "-n", str(args.nice), sys.executable, "-m", "experiments.sb3_minatar",
                       "--arm", arm, "--seed", str(seed), *settings]
            if args.list:
                print(f"{out.name}\t{'done' if out.exists() else 'to run'}\t{' '.join(command)}")
                continue
            if out.exists():
                print(f"{out.name}: done, skipped", flush=True)
                continue
            while len(running) >= args.parallel:
                wait_one()
            print(f"{out.name}: running", flush=True)
            running.append((out.name, subprocess.Popen(command, cwd=ROOT)))
    while running:
        wait_one()

if __name__ == "__main__":
    main()

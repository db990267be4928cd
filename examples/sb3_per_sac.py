"""Prioritized experience replay for Stable-Baselines3's SAC (continuous actions), on Pendulum.

    python examples/sb3_per_sac.py                        # both arms, 5,000 steps each (about a minute of CPU)
    python examples/sb3_per_sac.py --total-timesteps 20000 --n-steps 3

Trains SAC twice from the same seed and hyperparameters: once with SB3's own uniform `ReplayBuffer`
(`stable_baselines3.SAC`), once with `replayloader.sb3.PrioritizedSAC`, whose critics learn from squared TD errors
weighted by the importance weights and whose buffer samples transitions in proportion to the critics' mean
|TD error| ** alpha. `--n-steps 3` gives both arms n-step returns (the prioritized one then picks
`PrioritizedNStepReplayBuffer`). `PrioritizedTD3` is used the same way. One seed shows that it works, not which
arm is better: no return measurement has been made for SAC.

The hyperparameters are RL Baselines3 Zoo's for Pendulum-v1 SAC, with a smaller network.
"""
from __future__ import annotations

import argparse
import time

import torch
from stable_baselines3 import SAC
from stable_baselines3.common.evaluation import evaluate_policy

from replayloader import LinearSchedule
from replayloader.sb3 import PrioritizedSAC


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-id", default="Pendulum-v1")
    parser.add_argument("--total-timesteps", type=int, default=5_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--alpha", type=float, default=0.6, help="priority exponent (0 = uniform)")
    parser.add_argument("--beta-start", type=float, default=0.4, help="importance-weight exponent at the start, "
                        "annealed linearly to 1 by the end of training")
    parser.add_argument("--n-steps", type=int, default=1, help="n-step returns (both arms)")
    parser.add_argument("--learning-starts", type=int, default=500)
    parser.add_argument("--eval-episodes", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (small nets: 1 is fastest)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)

    # Shared by both arms, so the buffer and the critics' weighted loss are the only differences.
    hyperparameters = dict(learning_rate=1e-3, buffer_size=50_000, learning_starts=args.learning_starts,
                           batch_size=256, n_steps=args.n_steps, policy_kwargs={"net_arch": [64, 64]},
                           seed=args.seed, device="cpu")
    prioritized_buffer = {"alpha": args.alpha, "beta": LinearSchedule(args.beta_start, 1.0, steps=1)}
    arms = {"uniform": (SAC, {}), "prioritized": (PrioritizedSAC, {"replay_buffer_kwargs": prioritized_buffer})}

    returns = {}
    for name, (algorithm, extra) in arms.items():
        model = algorithm("MlpPolicy", args.env_id, **hyperparameters, **extra)
        start = time.perf_counter()
        model.learn(total_timesteps=args.total_timesteps)
        seconds = time.perf_counter() - start
        mean, std = evaluate_policy(model, model.get_env(), n_eval_episodes=args.eval_episodes,
                                    deterministic=True)
        returns[name] = float(mean)
        print(f"{name:>11}: greedy return {mean:7.1f} ± {std:5.1f} over {args.eval_episodes} episodes, "
              f"{args.total_timesteps / seconds:,.0f} env steps/s", flush=True)

    buffer = model.replay_buffer  # the prioritized arm's: priorities are the critics' mean |TD errors|
    masses = buffer.priorities()
    print(f"prioritized buffer ({type(buffer).__name__}): {buffer.stored_slots()} transitions, sampling mass "
          f"max/min {masses.max() / masses.min():.3g}, beta now {buffer.current_beta():.2f}")
    return returns


if __name__ == "__main__":
    main()

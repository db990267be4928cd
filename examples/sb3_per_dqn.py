"""Prioritized experience replay for Stable-Baselines3's DQN, on CartPole.

    python examples/sb3_per_dqn.py                       # both arms, 10,000 steps each (about 20 s of CPU)
    python examples/sb3_per_dqn.py --total-timesteps 50000 --seed 1

Trains DQN twice from the same seed and hyperparameters: once with SB3's own uniform `ReplayBuffer`
(`stable_baselines3.DQN`), once with `replayloader.sb3.PrioritizedDQN`, whose buffer samples transitions in
proportion to |TD error| ** alpha and whose loss is weighted by the importance weights. Each is then evaluated
greedily. One seed and a short run show that it works, not which arm is better: for that, see
results/sb3_minatar/sb3_minatar_protocol.md.

The hyperparameters are RL Baselines3 Zoo's for CartPole-v1 DQN, with a smaller network.
"""
from __future__ import annotations

import argparse
import time

import torch
from stable_baselines3 import DQN
from stable_baselines3.common.evaluation import evaluate_policy

from replayloader import LinearSchedule
from replayloader.sb3 import PrioritizedDQN


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--total-timesteps", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--alpha", type=float, default=0.6, help="priority exponent (0 = uniform)")
    parser.add_argument("--beta-start", type=float, default=0.4, help="importance-weight exponent at the start, "
                        "annealed linearly to 1 by the end of training")
    parser.add_argument("--learning-starts", type=int, default=1_000)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (small nets: 1 is fastest)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)

    # Shared by both arms, so the buffer is the only difference.
    hyperparameters = dict(
        learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=args.learning_starts,
        gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
        exploration_fraction=0.16, exploration_final_eps=0.04, policy_kwargs={"net_arch": [64, 64]},
        seed=args.seed, device="cpu",
    )

    # The prioritized arm's buffer options travel through replay_buffer_kwargs, as for any SB3 buffer.
    # beta is a schedule of training progress (0 at the start of learn(), 1 at its end).
    prioritized_buffer = {"alpha": args.alpha, "beta": LinearSchedule(args.beta_start, 1.0, steps=1)}
    arms = {
        "uniform": (DQN, {}),
        "prioritized": (PrioritizedDQN, {"replay_buffer_kwargs": prioritized_buffer}),
    }

    returns = {}
    for name, (algorithm, extra) in arms.items():
        model = algorithm("MlpPolicy", args.env_id, **hyperparameters, **extra)
        start = time.perf_counter()
        model.learn(total_timesteps=args.total_timesteps)
        seconds = time.perf_counter() - start
        mean, std = evaluate_policy(model, model.get_env(), n_eval_episodes=args.eval_episodes,
                                    deterministic=True)
        returns[name] = float(mean)
        print(f"{name:>11}: greedy return {mean:6.1f} ± {std:5.1f} over {args.eval_episodes} episodes, "
              f"{args.total_timesteps / seconds:,.0f} env steps/s", flush=True)

    # What the prioritized buffer learned: its priorities are the |TD errors| fed back by each update.
    buffer = model.replay_buffer
    masses = buffer.priorities()
    print(f"prioritized buffer: {buffer.stored_slots()} transitions, largest priority seen "
          f"{buffer.max_priority:.3g}, sampling mass max/min {masses.max() / masses.min():.3g}, "
          f"beta now {buffer.current_beta():.2f}")
    return returns


if __name__ == "__main__":
    main()

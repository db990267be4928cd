"""DQN with prioritized experience replay (PER, Schaul et al. 2016) on CartPole-v1, with a ReplayBuffer.

    python examples/dqn_per.py                         # 8,000 environment steps, well under a minute
    python examples/dqn_per.py --alpha 0               # the same agent with uniform replay

PER as in the paper: a transition is stored at the largest priority so far, sampled with P(i) = p_i^alpha /
sum_j p_j^alpha, its TD loss weighted by (P_min / P_i)^beta with beta annealed from 0.4 to 1, and its priority
set to |TD error| + 1e-3 after each update; the oldest transition is evicted when the buffer is full. The
priorities are the strategy `by_name("per")` (MaxWeight + SetWeight + FIFO); beta's annealing is the buffer's
`LinearSchedule` over its sample calls, so ``batch.weights`` are already (P_min / P_i)^beta.

Prints the mean return of recent episodes as it trains, then the greedy policy's mean return over a few episodes.
"""
import argparse
import copy
import time

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from replayloader import LinearSchedule, ReplayBuffer
from replayloader.strategies import by_name


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-steps", type=int, default=8000)
    parser.add_argument("--alpha", type=float, default=0.6, help="priority exponent (0: uniform replay)")
    parser.add_argument("--beta", type=float, default=0.4, help="importance exponent at the start, annealed to 1")
    parser.add_argument("--capacity", type=int, default=10000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=500, help="transitions stored before learning starts")
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--target-every", type=int, default=250, help="updates between target-network copies")
    parser.add_argument("--eval-episodes", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=args.seed)

    q = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    target = copy.deepcopy(q)
    optimizer = torch.optim.Adam(q.parameters(), lr=1e-3)
    updates_planned = max(1, args.env_steps - args.warmup)  # one sample call per step after the warm-up
    buffer = ReplayBuffer(args.capacity, alpha=args.alpha, beta=LinearSchedule(args.beta, 1.0, updates_planned),
                          strategy=by_name("per"), seed=args.seed)

    returns, episode_return, updates, started = [], 0.0, 0, time.perf_counter()
    for step in range(args.env_steps):
        epsilon = max(0.05, 1.0 - step / (0.3 * args.env_steps))  # linear decay over the first 30% of steps
        if rng.random() < epsilon:
            action = int(rng.integers(2))
        else:
            with torch.no_grad():
                action = int(q(torch.as_tensor(obs, dtype=torch.float32)).argmax())
        next_obs, reward, terminated, truncated, _ = env.step(action)
        buffer.add({"obs": np.asarray([obs], np.float32), "action": np.asarray([action]),
                    "reward": np.asarray([reward], np.float32), "next_obs": np.asarray([next_obs], np.float32),
                    "done": np.asarray([terminated], np.float32)})  # a batch of one transition
        episode_return += reward
        obs = next_obs
        if terminated or truncated:
            returns.append(episode_return)
            episode_return = 0.0
            obs, _ = env.reset()
            if len(returns) % 20 == 0:
                print(f"step {step + 1}: {len(returns)} episodes, mean return of the last 20 "
                      f"{np.mean(returns[-20:]):.1f}", flush=True)
        if len(buffer) < args.warmup:
            continue

        batch = buffer.sample(args.batch_size)  # data, ids, probabilities, weights = (P_min / P_i)^beta
        data = {k: torch.as_tensor(v) for k, v in batch.data.items()}
        with torch.no_grad():  # double DQN: the online network picks the next action, the target scores it
            best = q(data["next_obs"]).argmax(1, keepdim=True)
            y = data["reward"] + args.gamma * (1 - data["done"]) * target(data["next_obs"]).gather(1, best)[:, 0]
        predicted = q(data["obs"]).gather(1, data["action"][:, None])[:, 0]
        importance = torch.as_tensor(batch.weights, dtype=torch.float32)
        loss = (importance * nn.functional.smooth_l1_loss(predicted, y, reduction="none")).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        buffer.feedback(batch.ids, weight=(y - predicted).detach().abs() + 1e-3)  # the new priorities
        updates += 1
        if updates % args.target_every == 0:
            target.load_state_dict(q.state_dict())
    seconds = time.perf_counter() - started

    greedy = []
    for episode in range(args.eval_episodes):  # the learned policy without exploration
        obs, _ = env.reset(seed=10_000 + episode)
        done, total = False, 0.0
        while not done:
            with torch.no_grad():
                obs, reward, terminated, truncated, _ = env.step(int(q(torch.as_tensor(obs)).argmax()))
            total += reward
            done = terminated or truncated
        greedy.append(total)
    stats = buffer.stats()
    print(f"alpha {args.alpha}: {args.env_steps} environment steps, {len(returns)} episodes, {updates} updates "
          f"in {seconds:.1f} s; mean return of the last 20 training episodes {np.mean(returns[-20:]):.1f}")
    print(f"greedy policy: mean return {np.mean(greedy):.1f} over {args.eval_episodes} episodes; buffer "
          f"{len(buffer)} transitions, priority max {stats['weight_max']:.2f} mean {stats['weight_mean']:.3f}")
    return {"episodes": len(returns), "updates": updates, "last_returns": float(np.mean(returns[-20:])),
            "greedy_return": float(np.mean(greedy)), "buffer_size": len(buffer), "seconds": seconds}


if __name__ == "__main__":
    main()

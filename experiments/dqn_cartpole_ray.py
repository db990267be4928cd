"""DQN with prioritized replay on CartPole, on Ray: environment actors feed one buffer actor, one learner trains.

    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 python -m experiments.dqn_cartpole_ray --actors 4 --env-steps 30000

The agent of `experiments/dqn_cartpole.py` (same Q-network, actor, double-DQN update and PER settings, imported
from there), in the Ape-X shape: each environment actor is a Ray actor stepping its own CartPole with an
epsilon-greedy copy of the Q-network and sending each batch of transitions with its initial priorities
(|TD error| + 1e-3 under its copy), the buffer is a Ray actor (`RemoteBuffer`), and the learner samples it
through a `RayReplayLoader` whose `RateLimiter` holds 32 sampled transitions per inserted one. The learner sends
new weights to the actors every 250 updates. On a cluster, start Ray on every node first (README, "Replay
across machines (Ray)") and pass ``--address auto``.
"""
from __future__ import annotations

import argparse
import copy
import time

import numpy as np

import ray  # noqa: E402
import torch  # noqa: E402

from experiments import dqn_cartpole  # noqa: E402
from experiments.dqn_cartpole import BATCH, STEPS_PER_CALL, WARMUP, Actor, learn, q_network, td_errors  # noqa: E402
from replayloader.loader import RateLimiter  # noqa: E402
from replayloader.ray import RayReplayLoader, RemoteBuffer  # noqa: E402
from replayloader.strategies import by_name  # noqa: E402

ray.cloudpickle.register_pickle_by_value(dqn_cartpole)  # actors get the example's code, wherever they run


@ray.remote(num_cpus=0)
class EnvironmentActor:
    """A Ray actor around the example's environment `Actor`, adding Ape-X initial priorities."""

    def __init__(self, seed: int, total_steps: int) -> None:
        torch.set_num_threads(1)
        torch.manual_seed(seed)
        self.actor = Actor(q_network(), seed, total_steps)

    def produce(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        batch = self.actor()
        y, predicted = td_errors(self.actor.policy, self.actor.policy,
                                 {k: torch.as_tensor(v) for k, v in batch.items()})
        return batch, (y - predicted).detach().abs().numpy().astype(np.float64) + 1e-3

    def refresh(self, weights: dict) -> None:
        with self.actor.lock:
            self.actor.policy.load_state_dict(weights)

    def episodes(self) -> list[tuple[int, float]]:
        return self.actor.episodes


def train(seed: int, env_steps: int, actors: int) -> dict:
    torch.manual_seed(seed)
    q = q_network()
    target = copy.deepcopy(q)
    optimizer = torch.optim.Adam(q.parameters(), lr=1e-3)
    calls = env_steps // STEPS_PER_CALL
    producers = [EnvironmentActor.remote(seed * 100 + i, env_steps // actors) for i in range(actors)]
    buffer = RemoteBuffer(20000, alpha=0.6, beta=0.4, strategy=by_name("per"), seed=seed)
    limiter = RateLimiter(samples_per_insert=BATCH / STEPS_PER_CALL, min_size=min(WARMUP, env_steps // 2),
                          error_buffer=4 * BATCH)
    loader = RayReplayLoader(producers, buffer, BATCH, steps=calls, rate_limiter=limiter)
    start = time.perf_counter()
    updates = 0
    for updates, batch in enumerate(loader, 1):
        # writable copies of the read-only arrays that came through the object store (torch wants writable)
        batch.data, batch.weights = {k: np.array(v) for k, v in batch.data.items()}, np.array(batch.weights)
        loader.feedback(batch, weight=learn(q, target, optimizer, batch).numpy().astype(np.float64))
        if updates % 250 == 0:
            weights = ray.put(q.state_dict())
            for producer in loader.producers:
                producer.refresh.remote(weights)
        if updates % 500 == 0:
            target.load_state_dict(q.state_dict())
    seconds = time.perf_counter() - start
    episodes = sorted(e for episodes in ray.get([p.episodes.remote() for p in loader.producers]) for e in episodes)
    stats = loader.stats()
    for producer in loader.producers:
        ray.kill(producer)
    buffer.kill()
    return {"episodes": episodes, "seconds": seconds, "updates": updates, "inserted": stats["inserted"],
            "learner_wait_s": stats["learner_wait_s"], "producer_wait_s": stats["producer_wait_s"]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--env-steps", type=int, default=30000, help="environment steps over all actors")
    parser.add_argument("--actors", type=int, default=4)
    parser.add_argument("--address", default=None, help="a running Ray cluster ('auto'); default: a local one")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if not ray.is_initialized():
        ray.init(address=args.address, include_dashboard=False)
    run = train(args.seed, args.env_steps, args.actors)
    last = [r for _, r in run["episodes"][-20:]]
    print(f"{args.actors} actors, seed {args.seed}: {len(run['episodes'])} episodes, mean return of the last 20 "
          f"{np.mean(last) if last else float('nan'):.1f}; {run['updates']} updates in {run['seconds']:.1f} s "
          f"({run['seconds'] / max(run['updates'], 1) * 1e3:.1f} ms per update of {BATCH}); learner waited "
          f"{run['learner_wait_s']:.1f} s, producers {run['producer_wait_s']:.1f} s", flush=True)
    return run


if __name__ == "__main__":
    main()

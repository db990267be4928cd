"""Does a call made right after killing a buffer actor still get an answer? Bare `ray.kill` against
`RemoteBuffer.kill()`.

    python -m checks.ray_kill_race              # 30 fresh actors per arm, prints how many calls were answered

Why it exists: a CI run failed `tests/ray/test_remote_buffer.py` once because `ray.kill` returned while the
actor still answered a call made at once. This script measures how often that happens on the machine it runs on,
before (bare `ray.kill`) and after (`RemoteBuffer.kill()`, which waits until calls fail) the fix. A count above 0
for the bare kill shows the race; `RemoteBuffer.kill()` must give 0.
"""
from __future__ import annotations

import argparse

import numpy as np
import ray

from replayloader.ray import RemoteBuffer


def answered_after(kill, trials: int) -> int:
    answered = 0
    for seed in range(trials):
        buffer = RemoteBuffer(8, alpha=1.0, seed=seed)
        buffer.add({"x": np.arange(4.0)[:, None]})
        kill(buffer)
        try:
            ray.get(buffer.handle.mass.remote(), timeout=10)
            answered += 1
        except ray.exceptions.RayActorError:
            pass
    return answered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30)
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    bare = answered_after(lambda buffer: ray.kill(buffer.handle), args.trials)
    waited = answered_after(lambda buffer: buffer.kill(), args.trials)
    print(f"bare ray.kill: {bare} of {args.trials} immediate calls answered")
    print(f"RemoteBuffer.kill(): {waited} of {args.trials} immediate calls answered")
    ray.shutdown()


if __name__ == "__main__":
    main()

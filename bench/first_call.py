"""First-call cost of the compiled kernels: `import replayloader` plus the first add / sample / update of a new
buffer, in a fresh process, with an empty Numba cache (first use after install) and with the cache filled
(every later process). Kernels are compiled lazily on first use and cached on disk; nothing runs at import.
`python -m bench.first_call` prints seconds.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

PROGRAM = """
import time
start = time.perf_counter()
import numpy as np
import replayloader
imported = time.perf_counter()
buf = replayloader.ReplayBuffer(64, alpha=0.6, beta=0.4, seed=0)
ids = buf.add({"x": np.zeros((8, 4))})
buf.feedback(buf.sample(8).ids, loss=np.ones(8))
done = time.perf_counter()
print(f"{imported - start:.2f} {done - imported:.2f}")
"""


def run(cache_dir: str) -> tuple[float, float]:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, check=True)
    imported, first_step = out.stdout.split()
    return float(imported), float(first_step)


def main() -> None:
    with tempfile.TemporaryDirectory() as cache:
        cold = run(cache)
        warm = run(cache)
    print("| Numba cache | import replayloader (s) | first add + sample + update (s) |")
    print("|---|---|---|")
    print(f"| empty (first use) | {cold[0]:.2f} | {cold[1]:.2f} |")
    print(f"| filled (later processes) | {warm[0]:.2f} | {warm[1]:.2f} |")


if __name__ == "__main__":
    main()

"""Nightly-style fuzzing: the CI state machine over the buffer and loader API, with many more and longer runs.

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 nice -n 10 python -m checks.fuzz_api --examples 20000 --steps 50

Prints how many runs passed and how long they took; a failure prints hypothesis' shrunk counterexample and
exits non-zero. Unlike CI (derandomized), each invocation draws new cases.
"""
import argparse
import datetime
import os
import platform
import time

from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis.stateful import run_state_machine_as_test  # noqa: E402

from tests.core.api_machine import BufferAPIMachine  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=20000)
    parser.add_argument("--steps", type=int, default=50, help="rules per run")
    args = parser.parse_args()
    config = settings(max_examples=args.examples, stateful_step_count=args.steps, deadline=None,
                      suppress_health_check=list(HealthCheck), database=None)
    print(f"Command: `OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 nice -n 10 python -m checks.fuzz_api --examples "
          f"{args.examples} --steps {args.steps}`  ")
    print(f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC  ")
    print(f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, no GPU, Python {platform.python_version()}\n",
          flush=True)
    start = time.perf_counter()
    run_state_machine_as_test(BufferAPIMachine, settings=config)
    print(f"{args.examples} runs of up to {args.steps} rules each, every strategy of `strategy_names()`, checked "
          f"against the numpy reference model after every rule: 0 failures in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()

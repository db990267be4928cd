"""Seconds per pretraining step of the main job's config at 1 and 2 torch threads, idle and beside a busy process.

The main job (`python examples/electra_tmr.py`) pretrains the tiny preset on the embedded corpus. This runs its
``pretrain`` command for a few dozen steps per setting, alternating the settings round by round so that a change
in the machine's load hits every setting alike, and prints the mean ``step_seconds`` (all steps but the first)
of each run, the median per setting, and the 1-minute load average when each run started.

    python -m bench.thread_count --steps 40 --rounds 3 --out /tmp/thread_count.jsonl

"Busy" starts one pure-Python spinning process (one core's worth of load) for the length of the run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPIN = "while True: pass"


def one_run(threads: int, busy: bool, steps: int, cache: Path, out: Path) -> dict:
    command = [sys.executable, str(REPO / "examples" / "electra_tmr.py"), "pretrain", "--variant", "tmr-loss_diff",
               "--steps", str(steps), "--threads", str(threads), "--no-progress", "--no-export-hf",
               "--cache-dir", str(cache), "--output-dir", str(out)]
    load = os.getloadavg()[0]
    spinner = subprocess.Popen([sys.executable, "-c", SPIN]) if busy else None
    try:
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    summary = json.loads((out / "summary.json").read_text())
    return {"threads": threads, "busy": busy, "steps": steps, "seconds_per_step": summary["seconds_per_step"],
            "load_1min_at_start": load}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", default=None, help="append one JSON line per run to this file")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        one_run(1, False, 2, cache, Path(tmp) / "warmup")  # builds the tokenizer and example cache once
        for round_ in range(args.rounds):
            for busy in (False, True):
                for threads in args.threads:
                    row = {"round": round_, **one_run(threads, busy, args.steps, cache, Path(tmp) / "run")}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    if args.out:
                        with open(args.out, "a", encoding="utf-8") as handle:
                            handle.write(json.dumps(row) + "\n")
    print("\n| threads | competing busy process | median s/step | runs (s/step) |\n|---|---|---|---|")
    for busy in (False, True):
        for threads in args.threads:
            mine = [r["seconds_per_step"] for r in rows if r["threads"] == threads and r["busy"] == busy]
            print(f"| {threads} | {'yes' if busy else 'no'} | {statistics.median(mine):.3f} | "
                  + ", ".join(f"{v:.3f}" for v in mine) + " |")


if __name__ == "__main__":
    main()

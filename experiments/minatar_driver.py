"""Run the MinAtar DQN grid (game x arm x seed) through the resumable job queue, one run per job.

    python -m experiments.minatar_driver --games breakout --arms uniform per --seeds 0 1 2 3 4 --parallel 1 --nice 15
    python -m experiments.minatar_driver --list    # every job, its status and its command; runs nothing

Jobs go game by game, then seed by seed (both arms of a seed next to each other), so finished pairs arrive
early. A finished run is skipped; a stopped one resumes from its last checkpoint (`experiments/minatar_dqn.py`);
a run another driver holds is left alone (`experiments/run_queue.py`). As soon as a run finishes, its records
are copied to ``RESULTS/<game>_<arm>_seed<seed>.jsonl.gz``, the files `minatar_summary.py` reads.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from experiments.minatar_dqn import ARMS, GAMES, run_name  # noqa: E402
from experiments.run_queue import REPO, Job, run_jobs  # noqa: E402

def jobs(games: list[str], arms: list[str], seeds: list[int], runs: Path, nice: int) -> list[Job]:
    out = []
    for game in games:
        for seed in seeds:
            for arm in arms:
                name = run_name(game, arm, seed)
                command = ["nice", "-n", str(nice), sys.executable, "-m", "experiments.minatar_dqn", "--game", game, "--arm", arm,
                           "--seed", str(seed), "--run-dir", str(runs / name)]
                out.append(Job(name, runs / name, command, resume=command))  # the script resumes by itself
    return out


def export(job: Job, results: Path) -> None:
    results.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(job.run_dir / "records.jsonl.gz", results / f"{job.name}.jsonl.gz")
    print(f"exported {results / job.name}.jsonl.gz", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", nargs="+", choices=GAMES, default=["breakout"])
    parser.add_argument("--arms", nargs="+", choices=sorted(ARMS), default=["uniform", "per"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--parallel", type=int, default=1, help="runs at once (counted over every driver)")
    parser.add_argument("--nice", type=int, default=15)
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "minatar", help="run folders (checkpoints)")
    parser.add_argument("--results", type=Path, default=REPO / "results" / "minatar", help="finished records")
    parser.add_argument("--list", action="store_true", help="print every job and its status; run nothing")
    args = parser.parse_args(argv)
    if args.parallel < 1:
        parser.error(f"--parallel must be >= 1, got {args.parallel}")
    grid = jobs(args.games, args.arms, args.seeds, args.runs.resolve(), args.nice)
    if args.list:
        for job in grid:
            print(f"{job.name}\t{job.status()}\t{' '.join(job.start)}")
        return
    done = run_jobs(grid, args.runs.resolve(), args.parallel, on_done=lambda job: export(job, args.results))
    for job in grid:  # runs finished by another driver, or before their export existed
        if job.name in done and not (args.results / f"{job.name}.jsonl.gz").exists():
            export(job, args.results)
    print(f"{len(done)}/{len(grid)} runs done", flush=True)


if __name__ == "__main__":
    main()

"""Issue 11, phase 2: TMR against ELECTRA where the tiny discriminator learns (python-docs), paired by seed.

Every table and figure of results/reproduce_tmr/REPRODUCTION.md comes from this one script, in resumable stages:

1. ``reference``: one ELECTRA run (seed 1000, not an arm's seed) whose final generator is the fixed reference
   corruptor; ``heldout`` then corrupts python-docs' last lines (never trained on: the arms use the first
   16,600) once with it, seed 0, into ``OUT/heldout.safetensors``. That file is committed (gzip) under
   results/reproduce_tmr/ with the records, and restored from there, so a fresh machine skips this stage.
2. ``pretrain``: every arm x seed, 5,000 tiny steps, scored on that held-out file every 250 steps; checkpoints
   every 625 steps are all kept (fine-tuning starts from 25/50/100% of the steps).
3. ``finetune``: the discriminators at 25, 50 and 100% of every finished run, exported from its checkpoints,
   fine-tuned on the GLUE tasks available offline (CoLA, SST-2, MRPC, STS-B, RTE): 2,000-example training
   subsets, full dev sets, fine-tuning seeds 0-2, lr 1e-3 (the tiny model's rate).
4. ``export``: as each run or fine-tuning job finishes, its compact record is written under
   results/reproduce_tmr/ (experiments/reproduce_tmr_data.py); commit those files: they are the raw data.
5. ``summary``: experiments/reproduce_tmr_summary.py writes the tables and plots from the committed records alone.

    python -m experiments.reproduce_tmr_cpu                     # everything not done yet, 2 runs at a time
    python -m experiments.reproduce_tmr_cpu --seeds 0 1 2       # a chunk: the first three paired seeds
    python -m experiments.reproduce_tmr_cpu --stages pretrain   # only pretraining (then finetune, later)
    python -m experiments.reproduce_tmr_cpu --list              # every job and its status; nothing runs
    python -m experiments.reproduce_tmr_cpu --stages pretrain --arms tmr-fifo-uniform delay-15 delay-31 --seeds 0 1 2
                                                                # measurement 3: delay line vs window
    python -m experiments.reproduce_tmr_cpu --export            # only (re)write the compact records of finished runs

Stop it at any time (the runs checkpoint every 625 steps and resume exactly); start it again to continue.
"""
from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from experiments.reproduce_tmr_data import RESULTS, export_finished, restore_heldout  # noqa: E402
from experiments.run_queue import REPO, Job, pretrain_command, run_jobs  # noqa: E402

ARMS = ("electra", "tmr-loss_diff", "tmr-grad_norm", "tmr-grad_bound")
EXTRA_ARMS = ("tmr-lsr", "tmr-linucb")  # the paper's Fig. 4 initializers, when the budget allows
# Ablations: arm name -> (variant, extra flags). Uniform replay keeps TMR's buffer, eviction and weight updates
# but samples it uniformly (alpha 0): is what helps the replay itself, or the learned importance?
# With FIFO eviction as well, the buffer is a plain window of recent examples: the weights decide nothing.
# Measurement 3 (REPRODUCTION.md): a fixed-age delay line, ELECTRA whose discriminator trains on the batch made D
# steps earlier, against that window: delay-15 has the window's mean age, delay-31 its memory (31 batches of 32).
ABLATIONS = {"tmr-loss_diff-uniform": ("tmr-loss_diff", ("--alpha", "0")),
             "tmr-fifo-uniform": ("tmr-loss_diff", ("--alpha", "0", "--eviction", "fifo")),
             "delay-15": ("electra", ("--delay-steps", "15")),
             "delay-31": ("electra", ("--delay-steps", "31"))}
SEEDS = (0, 1, 2, 3, 4)
STEPS = 5000
TRAIN_LINES = 16_600  # of python-docs' 18,479 non-blank lines (snapshot v1); the rest is the held-out text
REFERENCE_SEED = 1000
HELDOUT_EVERY = 250
CHECKPOINT_EVERY = 625  # 1/8 of the steps: 25, 50 and 100% are among them
# The regime chosen in results/regime_search/regime_search.md: tiny preset, python-docs' first 90%, mask 0.15, lr 2e-3.
REGIME = ("--preset", "tiny", "--corpus", "python-docs", "--max-lines", str(TRAIN_LINES), "--steps", str(STEPS))


def pretrain_job(out: Path, name: str, variant: str, seed: int, *extra: str, nice: int = 15) -> Job:
    run = out / "pretrain" / name
    common = ("--output-dir", str(run), "--checkpoint-every", str(CHECKPOINT_EVERY), "--keep-checkpoints", "0")
    start = pretrain_command("--variant", variant, "--seed", str(seed), *REGIME, "--cache-dir", str(out / "cache"),
                             *extra, *common, nice=nice)
    return Job(name, run, start, resume=pretrain_command("--resume", str(run), *common, nice=nice))


def reference_job(out: Path, nice: int = 15) -> Job:
    return pretrain_job(out, "reference", "electra", REFERENCE_SEED, nice=nice)


def arm_jobs(out: Path, arms: list[str], seeds: list[int], nice: int = 15) -> list[Job]:
    """Seed by seed, so that the paired sets complete in order."""
    heldout = ("--heldout", str(out / "heldout.safetensors"), "--heldout-every", str(HELDOUT_EVERY))
    jobs = []
    for seed in seeds:
        for arm in arms:
            variant, extra = ABLATIONS.get(arm, (arm, ()))
            jobs.append(pretrain_job(out, f"{arm}-seed{seed}", variant, seed, *heldout, *extra, nice=nice))
    return jobs


MARKS = (STEPS // 4, STEPS // 2, STEPS)  # fine-tuned checkpoints: 25, 50, 100% of the steps
GLUE_TASKS = ("cola", "sst2", "mrpc", "stsb", "rte")
FINETUNE = ("--task", *GLUE_TASKS, "--max-train-examples", "2000", "--seeds", "0", "1", "2", "--lr", "1e-3")


def finetune_job(out: Path, run: Job, step: int, nice: int = 15) -> Job:
    """Export the run's checkpoint at ``step`` and fine-tune its discriminator on the GLUE tasks."""
    name = f"{run.name}-at{step}"
    target = out / "finetune" / name
    cli = [sys.executable, str(REPO / "examples" / "electra_tmr.py")]
    export = [*cli, "export", "--checkpoint", str(run.run_dir / "checkpoints" / f"step-{step:08d}"),
              "--output-dir", str(target / "model")]
    finetune = ["nice", "-n", str(nice), *cli, "finetune", "--checkpoint", f"{name}={target / 'model' / 'discriminator'}",
                *FINETUNE, "--output-dir", str(target), "--threads", "1", "--no-progress"]
    return Job(name, target, ["sh", "-c", f"{shlex.join(export)} && {shlex.join(finetune)}"], done_file="results.md")


def make_heldout_file(out: Path) -> None:
    """Corrupt python-docs' held-out lines once with the reference run's final generator."""
    target = out / "heldout.safetensors"
    made = subprocess.run([sys.executable, str(REPO / "examples" / "electra_tmr.py"), "heldout",
                           "--run", str(out / "pretrain" / "reference"), "--start-line", str(TRAIN_LINES),
                           "--examples", "512", "--seed", "0", "--output", str(target)],
                          check=True, cwd=REPO, stdout=subprocess.PIPE, text=True)
    (out / "heldout.json").write_text(made.stdout)  # how it was made, for the summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "runs" / "reproduce_tmr"))
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (default 2, one thread each)")
    parser.add_argument("--nice", type=int, default=15, help="niceness of each run (default 15)")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=[*ARMS, *EXTRA_ARMS, *ABLATIONS])
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    parser.add_argument("--stages", nargs="+", default=["pretrain", "finetune"], choices=["pretrain", "finetune"],
                        help="what to run (default both; the summary follows unless --no-summary)")
    parser.add_argument("--list", action="store_true", help="print every job and its status, run nothing")
    parser.add_argument("--no-summary", action="store_true", help="do not write the summary at the end")
    parser.add_argument("--results", default=str(RESULTS), help="where the compact per-run records go")
    parser.add_argument("--export", action="store_true", help="only export the finished runs' compact records")
    parser.add_argument("--marks", nargs="+", type=int, default=list(MARKS), choices=MARKS,
                        help="the checkpoints the finetune stage fine-tunes (default all; the confirmatory protocol "
                             f"needs only {STEPS})")
    args = parser.parse_args()
    out, results = Path(args.out), Path(args.results)
    reference, arms = reference_job(out, args.nice), arm_jobs(out, args.arms, args.seeds, args.nice)

    def export(_job: Job | None = None) -> None:
        for path in export_finished(out, results):
            print(f"exported {path.relative_to(REPO) if path.is_relative_to(REPO) else path}", flush=True)

    if args.export:
        export()
        return 0
    if args.list:
        for job in [reference, *arms]:
            print(f"{job.status():8s} {job.name}: {' '.join(job.start[8:])}")
        for job in arms:
            print(f"{job.name}: fine-tuning at steps {', '.join(f'{m} ({finetune_job(out, job, m).status()})' for m in args.marks)}")
        return 0
    if "pretrain" in args.stages:
        if not restore_heldout(out, results):
            if "reference" not in run_jobs([reference], out, args.parallel):
                print("the reference run did not finish; see its log", file=sys.stderr)
                return 1
            make_heldout_file(out)
        export()
        run_jobs(arms, out, args.parallel, on_done=export)
    if "finetune" in args.stages:
        run_jobs([finetune_job(out, job, m, args.nice) for job in arms if job.status() == "done" for m in args.marks], out,
                 args.parallel, on_done=export)
    export()
    if not args.no_summary:
        return subprocess.run([sys.executable, "-m", "experiments.reproduce_tmr_summary", str(results)],
                              cwd=REPO).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Issue 39's measurement: GRPO through TRL's ``GRPOTrainer`` on the addition task of ``grpo_task.py``, one
(arm, seed) per process, with uniform, prioritized or DAPO-filtered prompts. The protocol
(``results/grpo_prompts/protocol.md``) fixes the arms, seeds, budget and target. From the checkout's root:

    python -m experiments.grpo_task warmup                                  # once: runs/grpo/warmup/
    python -m experiments.grpo_prompts block --seeds 100 101 --arms uniform learnability dapo --cpu-budget 150 \
        --out results/grpo_prompts/runs                                      # the study (two runs at a time)
    python -m experiments.grpo_prompts pack results/grpo_prompts/runs      # gzip finished records to commit them
    python -m experiments.grpo_prompts run --arm dapo --seed 0 --max-steps 20 --out runs/grpo_prompts/try
    python -m experiments.grpo_prompts summary runs/grpo_prompts/pilot      # a folder's runs, described
    python -m experiments.grpo_prompts analyse runs/grpo_prompts/pilot --target 0.86 0.88 --clock cpu

Arms:

- ``uniform``: TRL's own ``GRPOTrainer`` (its ``RepeatSampler``, shuffled).
- ``learnability``: replayloader's ``PrioritizedGRPOTrainer`` (``replayloader/prompts/trl.py``) with a
  ``PromptSampler`` under the ``Learnability`` rule (p(1-p)), a prior per difficulty bucket (``labels``),
  retests every 10 batches and a 200-step staleness half-life; everything else as the uniform arm.
- ``dapo``: replayloader's ``DynamicSamplingGRPOTrainer`` (``replayloader/prompts/trl_dapo.py``), DAPO's dynamic
  sampling: each round draws 3x the groups still missing from shuffled passes (``DAPO``), generates them, keeps
  the groups with reward variance, until 16 fill the step; every generated group counts on the clocks and in the
  token count.

Shared, for a seed: the warm-started model (``runs/grpo/warmup``), the pool (20,000 prompts), TRL's settings
(``CONFIG``: 16 prompts x 8 completions a step, lr 5e-5 constant, temperature 1, beta 0, one process, one
thread), the seed (``GRPOConfig.seed``, which seeds TRL's sampler, the sampling of completions and the prompt
sampler).

**The clock.** ``clock`` = wall seconds since training began, minus every held-out evaluation (the evaluation
runs inside ``on_step_end`` and its time is subtracted), so it counts data loading, prompt drawing, generation,
rewards, the sampler's feedback, the optimizer step and TRL's logging; ``cpu`` is the same in this process's
CPU seconds (``time.process_time``), much less sensitive to other processes on a shared machine (caches and
memory bandwidth are still shared). Each step record also holds the seconds of generation + scoring
(``_generate_and_score_completions``) and the sampler's own seconds (draws + feedback; the learnability arm
only), each also in CPU seconds (``gen_cpu``, ``sampler_cpu``), and the generated tokens (every completion's
tokens, <eos> included).

Records: ``<out>/<arm>-seed<k>.jsonl``, one JSON object a line: ``meta``, then ``step`` lines (one per optimizer
step), ``eval`` lines (every ``--eval-every`` steps and at the end, greedy held-out accuracy per difficulty),
and ``end``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from experiments import grpo_task as task

REPO = Path(__file__).resolve().parents[1]

ARMS = ("uniform", "learnability", "dapo")
PILOT = REPO / "runs" / "grpo_prompts" / "pilot"
PROMPTS_PER_STEP = 16
GENERATIONS = 8
CONFIG = dict(learning_rate=5e-5, lr_scheduler_type="constant", warmup_steps=0, num_generations=GENERATIONS,
              per_device_train_batch_size=PROMPTS_PER_STEP * GENERATIONS, gradient_accumulation_steps=1,
              max_completion_length=task.MAX_COMPLETION, temperature=1.0, beta=0.0, max_grad_norm=1.0,
              disable_dropout=True, bf16=False, fp16=False, use_cpu=True, use_vllm=False,
              gradient_checkpointing=False, report_to="none", save_strategy="no", logging_steps=1,
              disable_tqdm=True, dataloader_num_workers=0)
SAMPLER = dict(retest_every=10, stale_after=200)  # PromptSampler options of the learnability arm (pilot)
DAPO = dict(oversample=3.0)  # DynamicSampling options of the dapo arm: DAPO's released generation/training ratio


def _time_calls(trainer, sampler, names: tuple[str, ...]) -> None:
    """Add the CPU and wall seconds of ``sampler``'s methods ``names`` to the trainer's sampler clocks
    (instrumentation only: each call goes to the method unchanged)."""
    for name in names:
        method = getattr(sampler, name)

        def timed(*a, _method=method, **k):
            t, c = time.perf_counter(), time.process_time()
            try:
                return _method(*a, **k)
            finally:
                trainer.sampler_seconds += time.perf_counter() - t
                trainer.sampler_cpu += time.process_time() - c

        setattr(sampler, name, timed)


def _timed(base):
    """``base`` (a GRPOTrainer class) with generation+scoring and the prompt sampler's feedback timed.
    Instrumentation only: each method calls the base class's unchanged."""

    class Timed(base):
        gen_seconds = 0.0
        gen_cpu = 0.0
        sampler_seconds = 0.0
        sampler_cpu = 0.0

        def _generate_and_score_completions(self, *args, **kwargs):
            t, c = time.perf_counter(), time.process_time()
            try:
                return super()._generate_and_score_completions(*args, **kwargs)
            finally:
                self.gen_seconds += time.perf_counter() - t
                self.gen_cpu += time.process_time() - c

        def _feed_back(self, *args, **kwargs):  # only PrioritizedGRPOTrainer has it
            t, c = time.perf_counter(), time.process_time()
            try:
                return super()._feed_back(*args, **kwargs)
            finally:
                self.sampler_seconds += time.perf_counter() - t
                self.sampler_cpu += time.process_time() - c

    Timed.__name__ = f"Timed{base.__name__}"
    return Timed


class Recorder:
    """The TrainerCallback that keeps the clock, evaluates, stops at the budget and writes the records."""

    def __init__(self, path: Path, seconds: float | None, eval_every: int, max_steps: int | None,
                 cpu_budget: float | None = None):
        from transformers import TrainerCallback

        self.path = path
        self.seconds = seconds
        self.cpu_budget = cpu_budget
        self.eval_every = eval_every
        self.max_steps = max_steps
        self.held = task.heldout_rows()
        self.eval_total = 0.0
        self.eval_cpu = 0.0
        self.tokens = 0
        self.trainer = None
        self.last = {"clock": 0.0, "gen": 0.0, "sampler": 0.0, "gen_cpu": 0.0, "sampler_cpu": 0.0}
        self.file = path.open("w")
        rec = self

        class CB(TrainerCallback):
            def on_train_begin(self, args, state, control, model=None, **kw):
                rec.t0 = time.perf_counter()
                rec.c0 = time.process_time()
                rec.evaluate(model, 0, 0.0)

            def on_step_end(self, args, state, control, model=None, **kw):
                return rec.step_end(state, control, model)

            def on_log(self, args, state, control, logs=None, **kw):
                if logs and "loss" in logs:
                    rec.write({"type": "log", "step": state.global_step, **logs})

        self.callback = CB()

    def write(self, row: dict) -> None:
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()

    def count_tokens(self, completions, completion_ids=None, **kwargs) -> list[float]:
        """A reward function of weight 0: counts the generated tokens (TRL passes every completion's ids)."""
        self.tokens += sum(len(ids) for ids in completion_ids)
        return [0.0] * len(completions)

    def clock(self) -> float:
        return time.perf_counter() - self.t0 - self.eval_total

    def cpu(self) -> float:
        return time.process_time() - self.c0 - self.eval_cpu

    def evaluate(self, model, step: int, clock: float) -> None:
        t, c = time.perf_counter(), time.process_time()
        acc = task.evaluate(model, self.held)
        took = time.perf_counter() - t
        self.eval_total += took
        self.eval_cpu += time.process_time() - c
        self.write({"type": "eval", "step": step, "clock": round(clock, 3), "cpu": round(self.cpu(), 3),
                    "tokens": self.tokens,
                    "eval_seconds": round(took, 2), **acc})

    def step_end(self, state, control, model):
        clock = self.clock()
        tr = self.trainer
        self.write({"type": "step", "step": state.global_step, "clock": round(clock, 4), "cpu": round(self.cpu(), 4),
                    "dt": round(clock - self.last["clock"], 4), "gen": round(tr.gen_seconds - self.last["gen"], 4),
                    "sampler": round(tr.sampler_seconds - self.last["sampler"], 5),
                    "gen_cpu": round(tr.gen_cpu - self.last["gen_cpu"], 4),
                    "sampler_cpu": round(tr.sampler_cpu - self.last["sampler_cpu"], 5), "tokens": self.tokens})
        self.last = {"clock": clock, "gen": tr.gen_seconds, "sampler": tr.sampler_seconds, "gen_cpu": tr.gen_cpu,
                     "sampler_cpu": tr.sampler_cpu}
        done = ((self.seconds is not None and clock >= self.seconds)
                or (self.cpu_budget is not None and self.cpu() >= self.cpu_budget)
                or (self.max_steps is not None and state.global_step >= self.max_steps))
        if done or state.global_step % self.eval_every == 0:
            self.evaluate(model, state.global_step, clock)
        if done:
            control.should_training_stop = True
        return control


def _commit() -> str:
    """HEAD of the checkout, with ``+dirty`` when replayloader/ or experiments/ differ from it."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "replayloader", "experiments"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except OSError:
        return "unknown"


def run(arm: str, seed: int, seconds: float | None, eval_every: int, out: Path, max_steps: int | None = None,
        warm: Path = task.WARMUP_DIR, cpu_budget: float | None = None) -> Path:
    import torch
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{arm}-seed{seed}.jsonl"
    model, tok = task.load_warm(warm)
    pool = task.pool_dataset()
    if seconds is None and cpu_budget is None and max_steps is None:
        raise SystemExit("give a budget: --seconds, --cpu-budget or --max-steps")
    rec = Recorder(path, seconds, eval_every, max_steps, cpu_budget)
    args = GRPOConfig(str(out / f"{arm}-seed{seed}.trainer"), seed=seed, max_steps=10 ** 6, **CONFIG)
    kwargs = dict(model=model, reward_funcs=[task.exact_answer, rec.count_tokens], args=args,
                  train_dataset=pool, processing_class=tok, callbacks=[rec.callback])
    args.reward_weights = [1.0, 0.0]
    if arm == "uniform":
        trainer = _timed(GRPOTrainer)(**kwargs)
    elif arm == "dapo":
        from replayloader.prompts import DynamicSampling
        from replayloader.prompts.trl_dapo import DynamicSamplingGRPOTrainer

        sampler = DynamicSampling(len(pool), PROMPTS_PER_STEP, group_size=GENERATIONS, seed=seed, **DAPO)
        trainer = _timed(DynamicSamplingGRPOTrainer)(dynamic_sampling=sampler, feedback_reward="exact_answer",
                                                     **kwargs)
        _time_calls(trainer, sampler, ("next_batch", "feedback"))
    else:
        from replayloader.prompts import PromptSampler
        from replayloader.prompts.trl import PrioritizedGRPOTrainer

        labels = np.asarray(pool["difficulty"]) - 1
        sampler = PromptSampler(len(pool), PROMPTS_PER_STEP, group_size=GENERATIONS, labels=labels, seed=seed,
                                **SAMPLER)
        trainer = _timed(PrioritizedGRPOTrainer)(prompt_sampler=sampler, feedback_reward="exact_answer", **kwargs)
        _time_calls(trainer, sampler, ("next_batch",))  # its feedback is timed by _timed's _feed_back
    rec.trainer = trainer
    rec.write({"type": "meta", "arm": arm, "seed": seed, "seconds": seconds, "cpu_budget": cpu_budget,
               "max_steps": max_steps, "eval_every": eval_every,
               "config": {k: str(v) for k, v in CONFIG.items()},
               "sampler": {"learnability": SAMPLER, "dapo": DAPO}.get(arm),
               "warmup": str(warm), "pool": len(pool), "torch_threads": torch.get_num_threads(),
               "nice": os.nice(0), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "commit": _commit()})
    trainer.train()
    extra = {}
    if arm != "uniform":
        stats = (trainer.dynamic_sampling if arm == "dapo" else trainer.prompt_sampler).stats()
        extra = {k: float(v) for k, v in stats.items() if np.isscalar(v)}
    rec.write({"type": "end", "clock": round(rec.clock(), 3), "cpu": round(rec.cpu(), 3),
               "steps": trainer.state.global_step,
               "tokens": rec.tokens, "gen_seconds": round(trainer.gen_seconds, 2),
               "sampler_seconds": round(trainer.sampler_seconds, 3), "gen_cpu": round(trainer.gen_cpu, 2),
               "sampler_cpu": round(trainer.sampler_cpu, 3), "eval_seconds": round(rec.eval_total, 1),
               "sampler_stats": extra})
    rec.file.close()
    return path


def finished(path: Path) -> bool:
    """Whether ``path`` (``<arm>-seed<s>.jsonl``) or its committed copy ``<arm>-seed<s>.jsonl.gz`` ends with an
    ``end`` line."""
    import gzip

    for candidate, opener in ((path, open), (path.with_name(path.name + ".gz"), gzip.open)):
        if candidate.is_file():
            with opener(candidate, "rt") as f:
                if any(json.loads(line)["type"] == "end" for line in f):
                    return True
    return False


def pack(folder: Path) -> list[Path]:
    """Write ``<record>.jsonl.gz`` beside every finished ``<record>.jsonl`` of ``folder`` that has none (the form
    committed under results/; gzip with a zero timestamp, so the same record packs to the same bytes)."""
    import gzip

    written = []
    for path in sorted(folder.glob("*.jsonl")):
        target = path.with_name(path.name + ".gz")
        if finished(path) and not target.exists():
            with open(path, "rb") as src, open(target, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                                                                    filename="") as dst:
                dst.write(src.read())
            written.append(target)
    return written


def block(seeds: list[int], arms: list[str], cpu_budget: float, eval_every: int, out: Path, nice: int,
          jobs: int = 2) -> None:
    """Run the (seed, arm) runs seed by seed, arms in the order given, at most ``jobs`` processes at a time (one
    thread each), so the runs of a seed start together or right after one another and share the machine's load.
    A run with a finished record (an ``end`` line) is skipped; an unfinished one restarts from step 0."""
    import subprocess

    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    todo = [(seed, arm) for seed in seeds for arm in arms]
    running: list[tuple[int, str, subprocess.Popen]] = []
    while todo or running:
        while todo and len(running) < jobs:
            seed, arm = todo.pop(0)
            if finished(out / f"{arm}-seed{seed}.jsonl"):
                print(f"{arm} seed {seed}: finished, skipped", flush=True)
                continue
            cmd = ["nice", "-n", str(nice), sys.executable, "-m", "experiments.grpo_prompts", "run", "--arm", arm,
                   "--seed", str(seed), "--cpu-budget", str(cpu_budget), "--eval-every", str(eval_every),
                   "--out", str(out.resolve())]
            log = (out / f"{arm}-seed{seed}.log").open("w")
            print(f"{arm} seed {seed}: started {time.strftime('%H:%M:%S')}", flush=True)
            running.append((seed, arm, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                                        cwd=REPO)))
        time.sleep(2)
        for item in [r for r in running if r[2].poll() is not None]:
            running.remove(item)
            print(f"{item[1]} seed {item[0]}: exit {item[2].returncode} {time.strftime('%H:%M:%S')}", flush=True)


# ------------------------------------------------------------------------------------------------ summary
def read(path: Path) -> dict[str, list]:
    out: dict[str, list] = {"meta": [], "step": [], "eval": [], "log": [], "end": []}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        out[row["type"]].append(row)
    return out


def summary(folder: Path) -> str:
    lines = []
    for path in sorted(folder.glob("*.jsonl")):
        r = read(path)
        steps, evals, logs = r["step"], r["eval"], r["log"]
        if not steps:
            continue
        dt = np.array([s["dt"] for s in steps[1:]] or [steps[0]["dt"]])
        gen = np.array([s["gen"] for s in steps[1:]] or [steps[0]["gen"]])
        smp = np.array([s["sampler"] for s in steps[1:]] or [steps[0]["sampler"]])
        cpu = np.diff([s["cpu"] for s in steps]) if len(steps) > 1 else np.array([steps[0]["cpu"]])
        zero = np.array([g["frac_reward_zero_std"] for g in logs])
        reward = np.array([g.get("rewards/exact_answer/mean", np.nan) for g in logs])
        lines.append(f"## {path.stem}: {len(steps)} steps, clock {steps[-1]['clock']:.0f} s, "
                     f"{steps[-1]['tokens']} generated tokens")
        if "sampler_cpu" in steps[-1]:
            scpu = np.array([s["sampler_cpu"] for s in steps[1:]] or [steps[0]["sampler_cpu"]])
            lines.append(f"- sampler CPU ms/step: median {np.median(scpu) * 1e3:.2f}, mean {scpu.mean() * 1e3:.2f} "
                         f"({scpu.sum() / max(steps[-1]['cpu'], 1e-9):.2%} of the training CPU seconds)")
        lines.append(f"- s/step: median {np.median(dt):.3f}, mean {dt.mean():.3f} (generation+scoring median "
                     f"{np.median(gen):.3f}, {np.median(gen / dt):.0%} of a step); CPU s/step median "
                     f"{np.median(cpu):.3f}; sampler {np.median(smp) * 1e3:.2f} ms/step median "
                     f"({np.median(smp / dt):.2%})")
        q = max(1, len(zero) // 4)
        lines.append(f"- frac_reward_zero_std: mean {zero.mean():.3f}; first quarter {zero[:q].mean():.3f}, "
                     f"last quarter {zero[-q:].mean():.3f}; train reward mean {np.nanmean(reward):.3f}")
        lines.append("- held-out greedy accuracy (step, clock s: d1 d2 d3 d4 d5 | mean d2-5):")
        for e in evals:
            lines.append(f"  - {e['step']:>4} {e['clock']:>6.0f}: " + " ".join(f"{e[f'acc_d{d}']:.3f}" for d in
                         task.DIFFICULTIES) + f" | {e['acc_2_5']:.3f}")
        if r["end"] and r["end"][0].get("sampler_stats"):
            st = r["end"][0]["sampler_stats"]
            lines.append("- sampler: " + ", ".join(f"{k} {v:g}" for k, v in sorted(st.items())))
    return "\n".join(lines)


def time_to_target(path: Path, metric: str, target: float, window: int = 2, clock: str = "clock",
                   budget: float | None = None) -> tuple[float, bool]:
    """(seconds, reached) for one run: the ``clock`` (or ``cpu``) seconds of the first evaluation at which the mean
    of ``metric`` over it and the ``window - 1`` evaluations before it (step 0 included) is >= ``target``; a run
    that never gets there within ``budget`` (default: its whole run) gives the budget and False (censored)."""
    evals = read(path)["eval"]
    values = np.array([e[metric] for e in evals], dtype=float)
    seconds = np.array([e[clock] for e in evals], dtype=float)
    for i in range(window - 1, len(evals)):
        if budget is not None and seconds[i] > budget:
            break
        if values[i - window + 1:i + 1].mean() >= target - 1e-12:
            return float(seconds[i]), True
    return float(budget if budget is not None else seconds[-1]), False


def analyse(folder: Path, metric: str, target: float, window: int, clock: str, budget: float | None,
            prioritized: str = "learnability") -> str:
    """The primary comparison on whatever pairs ``folder`` holds: time to target per seed, the geometric-mean
    ratio prioritized / uniform, one-sided paired t and exact sign-flip p (issue 42's implementation)."""
    from experiments.sb3_seconds_summary import ratio_test

    lines = [f"{metric} >= {target} (mean of {window} evaluations), {clock} seconds, budget {budget}", "",
             f"| seed | uniform s | {prioritized} s | ratio |", "|---:|---:|---:|---:|"]
    uni, pri = [], []
    for path in sorted(folder.glob("uniform-seed*.jsonl")):
        other = folder / path.name.replace("uniform", prioritized)
        if not other.exists():
            continue
        (tu, ru), (tp, rp) = (time_to_target(q, metric, target, window, clock, budget) for q in (path, other))
        uni.append(tu)
        pri.append(tp)
        lines.append(f"| {path.stem.split('seed')[1]} | {tu:.0f}{'' if ru else ' (censored)'} | "
                     f"{tp:.0f}{'' if rp else ' (censored)'} | {tp / tu:.3f} |")
    if uni:
        t = ratio_test(uni, pri)
        lines += ["", f"geometric-mean ratio {t['ratio']:.3f}" + (
            f" [{t['low']:.3f}, {t['high']:.3f}], sd(log) {t['sd_log']:.3f}, one-sided paired t p {t['p_t']:.3g}, "
            f"exact sign-flip p {t['p_flip']:.3g}, {prioritized} faster in {t['ahead']} of {t['n']}"
            if t["n"] >= 2 else "")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--arm", choices=ARMS, required=True)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--seconds", type=float, default=None, help="training budget in wall seconds (evaluation excluded)")
    r.add_argument("--cpu-budget", type=float, default=None,
                   help="training budget in this process's CPU seconds (evaluation excluded)")
    r.add_argument("--max-steps", type=int, default=None)
    r.add_argument("--eval-every", type=int, default=50)
    r.add_argument("--out", type=Path, default=PILOT)
    r.add_argument("--warmup", type=Path, default=task.WARMUP_DIR)
    b = sub.add_parser("block", help="for each seed in turn, its arms side by side (one process each); finished "
                                     "runs (a record with an 'end' line) are skipped")
    b.add_argument("--seeds", type=int, nargs="+", required=True)
    b.add_argument("--arms", nargs="+", choices=ARMS, default=["uniform", "learnability"])
    b.add_argument("--cpu-budget", type=float, required=True)
    b.add_argument("--eval-every", type=int, default=25)
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--nice", type=int, default=5)
    b.add_argument("--jobs", type=int, default=2, help="runs at a time")
    k = sub.add_parser("pack", help="gzip every finished record of a folder (the committed form)")
    k.add_argument("folder", type=Path)
    s = sub.add_parser("summary")
    s.add_argument("folder", type=Path, nargs="?", default=PILOT)
    n = sub.add_parser("analyse", help="time to a held-out target, paired by seed")
    n.add_argument("folder", type=Path, nargs="?", default=PILOT)
    n.add_argument("--metric", default="acc_2_5")
    n.add_argument("--target", type=float, nargs="+", required=True)
    n.add_argument("--window", type=int, default=2)
    n.add_argument("--clock", choices=("clock", "cpu"), default="clock")
    n.add_argument("--budget", type=float, default=None)
    n.add_argument("--arm", default="learnability")
    a = p.parse_args(argv)
    if a.cmd == "analyse":
        print("\n\n".join(analyse(a.folder, a.metric, t, a.window, a.clock, a.budget, a.arm) for t in a.target))
    elif a.cmd == "run":
        print(run(a.arm, a.seed, a.seconds, a.eval_every, a.out, a.max_steps, a.warmup, a.cpu_budget))
    elif a.cmd == "pack":
        print("\n".join(str(q) for q in pack(a.folder)))
    elif a.cmd == "block":
        block(a.seeds, a.arms, a.cpu_budget, a.eval_every, a.out, a.nice, a.jobs)
    else:
        print(summary(a.folder))


if __name__ == "__main__":
    main()

"""One command that says whether replayloader works on a CUDA machine, and how fast.

    python bench/gpu_check.py              # on a GPU: tests/gpu, then timings -> results/gpu_check.md (< 8 min)
    python bench/gpu_check.py --dry-run    # anywhere: the same plumbing at toy sizes on the CPU, in seconds

What it measures:
(a) the paper's runtime table (TMR, Table 2): ELECTRA-Small (the `small` preset: hidden 256, 12 layers), batch 128,
    sequence 128; seconds per step of electra and the tmr variants, and their ratios to electra (paper: loss_diff
    1.016, grad_norm 2.49, grad_bound 1.15); tmr-loss_diff again with ``defer_feedback``.
(b) buffer operations with storage on the device: add / sample / update of K examples at N = 1e3..1e6.
(c) where a TMR step's time goes: each part timed between device synchronisations (producer, buffer add + sample,
    discriminator forward, feedback signals + update; the rest is backward, optimizer and logging), and the
    number of host transfers per step (`replayloader.host_sync`), synchronous vs deferred feedback, logging every
    step vs every `LOG_EVERY` steps.
(d) what per-step logging costs: a tmr-loss_diff step with ``--log-every 1`` vs ``--log-every LOG_EVERY``, with and
    without deferred feedback, timed as the wall-time difference of a short and a long run (no per-step timer
    can see the device work a step leaves queued).
It needs torch with CUDA, numba, numpy and scipy; parts (a), (c) and (d) pretrain, so they also need the
integration (``pip install -e .``), transformers, tokenizers, safetensors and `datasets` (the corpus is packed as
Arrow). Without them those parts are skipped and the report says why; (b) and the library's tests still run.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from replayloader import ReplayBuffer  # noqa: E402
from replayloader.loader.host_sync import count_host_transfers  # noqa: E402
from replayloader.strategies import by_name  # noqa: E402

PAPER_RATIOS = {"tmr-loss_diff": 1.016, "tmr-grad_norm": 2.49, "tmr-grad_bound": 1.15}
LOG_EVERY = 50  # (c), (d): the sparse logging compared with logging every step
LOGGING_RUNS = {(False, 1): "synchronous", (True, 1): "deferred",
                (False, LOG_EVERY): f"synchronous, --log-every {LOG_EVERY}",
                (True, LOG_EVERY): f"deferred, --log-every {LOG_EVERY}"}  # (defer_feedback, log_every) -> label


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------------------------- sizes
def sizes(dry_run: bool) -> dict:
    if dry_run:
        return {"pretrain": dict(preset="tiny", batch_size=8, max_len=32, vocab_size=200, steps=3, max_lines=200),
                "skip_steps": 1, "buffer_n": [1_000], "buffer_k": [128], "buffer_reps": 3, "breakdown_steps": 2,
                "logging_steps": (2, 4)}
    return {"pretrain": dict(preset="small", batch_size=128, max_len=128, vocab_size=30_522, steps=60),
            "skip_steps": 10, "buffer_n": [1_000, 10_000, 100_000, 1_000_000], "buffer_k": [128, 1024],
            "buffer_reps": 50, "breakdown_steps": 20, "logging_steps": (20, 20 + LOG_EVERY)}


def pretrain_config(size: dict, out: Path, cache: Path, device: str, **overrides):
    from replayloader_electra.pretrain.config import PretrainConfig

    settings = dict(size["pretrain"], output_dir=str(out), cache_dir=str(cache), device=device, progress=False,
                    export_hf=False, buffer_size=1000, seed=0)
    settings.update(overrides)
    return PretrainConfig(**settings)


# ----------------------------------------------------------------------------------------------- (a)
def runtime_table(size: dict, device: str, work: Path) -> list[dict]:
    from replayloader_electra.pretrain.loop import pretrain
    from replayloader_electra.pretrain.metrics import read_metrics

    rows = []
    runs = [("electra", {}), ("tmr-loss_diff", {}), ("tmr-loss_diff", {"defer_feedback": True}),
            ("tmr-grad_norm", {}), ("tmr-grad_bound", {})]
    for variant, extra in runs:
        label = variant + (" (deferred feedback)" if extra else "")
        result = pretrain(pretrain_config(size, work / label.replace(" ", "_"), work / "cache", device,
                                          variant=variant, **extra))
        seconds = [r["step_seconds"] for r in read_metrics(result.metrics_path)][size["skip_steps"]:]
        rows.append({"variant": label, "median_s": statistics.median(seconds), "steps": len(seconds)})
    base = rows[0]["median_s"]
    for row in rows:
        row["ratio"] = row["median_s"] / base
        row["paper"] = PAPER_RATIOS.get(row["variant"])
    return rows


# ----------------------------------------------------------------------------------------------- (b)
def buffer_ops(size: dict, device: torch.device) -> list[dict]:
    rows = []
    for n in size["buffer_n"]:
        for k in size["buffer_k"]:
            if k > n:
                continue
            buffer = ReplayBuffer(n, strategy=by_name("loss_diff"), seed=0)
            make = lambda: {"input_ids": torch.randint(0, 30_000, (k, 128), device=device)}  # noqa: E731
            for _ in range(-(-n // k)):  # fill it, so adds evict
                buffer.add(make())
            timings = {"add": [], "sample": [], "update": []}
            for _ in range(size["buffer_reps"]):
                batch, loss = make(), torch.rand(k, device=device)
                for name, call in (("add", lambda: buffer.add(batch)), ("sample", lambda: buffer.sample(k))):
                    sync(device)
                    start = time.perf_counter()
                    out = call()
                    sync(device)
                    timings[name].append(time.perf_counter() - start)
                sync(device)
                start = time.perf_counter()
                buffer.feedback(out.ids, loss=loss)  # includes the feedback's copy to the host
                timings["update"].append(time.perf_counter() - start)
            rows.append({"N": n, "K": k, **{f"{name}_us": 1e6 * statistics.median(v) for name, v in timings.items()}})
    return rows


# ----------------------------------------------------------------------------------------------- (c)
@contextlib.contextmanager
def timed_parts(device: torch.device, parts: dict[str, list[float]]):
    """Wrap the step's parts in timers that synchronise the device before and after each call."""
    from replayloader_electra.pretrain import feedback as feedback_module
    from replayloader_electra.pretrain import loop as loop_module
    from replayloader_electra.pretrain.corruption import CorruptionProducer

    def timer(name, function):
        def timed(*args, **kwargs):
            sync(device)
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                sync(device)
                parts.setdefault(name, []).append(time.perf_counter() - start)
        return timed

    patches = [(CorruptionProducer, "__call__", "producer"), (ReplayBuffer, "add", "buffer add + sample"),
               (ReplayBuffer, "sample", "buffer add + sample"), (ReplayBuffer, "update", "feedback"),
               (feedback_module.LossFeedback, "signals", "feedback"),
               (loop_module, "discriminator_losses", "discriminator forward")]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for owner, name, label in patches:
            setattr(owner, name, timer(label, getattr(owner, name)))
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


def breakdown(size: dict, device_name: str, work: Path) -> dict:
    from replayloader_electra.pretrain.loop import pretrain
    from replayloader_electra.pretrain.metrics import read_metrics

    device = torch.device(device_name)
    steps = size["breakdown_steps"]
    parts: dict[str, list[float]] = {}
    with timed_parts(device, parts):
        result = pretrain(pretrain_config(size, work / "breakdown", work / "cache", device_name,
                                          variant="tmr-loss_diff", steps=steps))
    step_seconds = [r["step_seconds"] for r in read_metrics(result.metrics_path)]
    per_step = {name: sum(values) / steps for name, values in parts.items()}
    per_step["backward, optimizer, logging (the rest)"] = max(sum(step_seconds) / steps - sum(per_step.values()), 0)
    transfers = {}
    for (defer, log_every), label in LOGGING_RUNS.items():
        counts = []
        for n in (steps // 2, steps):  # the difference of two runs: per step, without set-up and export
            with count_host_transfers(device.type if device.type == "cuda" else None) as moves:
                pretrain(pretrain_config(size, work / f"sync{defer}{log_every}-{n}", work / "cache", device_name,
                                         variant="tmr-loss_diff", steps=n, defer_feedback=defer,
                                         log_every=log_every))
            counts.append(sum(moves.values()))
        transfers[label] = (counts[1] - counts[0]) / (steps - steps // 2)
    return {"seconds_per_step": per_step, "host_transfers_per_step": transfers}


# ----------------------------------------------------------------------------------------------- (d)
def logging_cost(size: dict, device_name: str, work: Path) -> list[dict]:
    """Seconds per tmr-loss_diff step for each of `LOGGING_RUNS`: (wall of the long run - wall of the short run) /
    the steps between, so set-up, export and the device work still queued cancel out (a run ends with a
    checkpoint, which waits for the device)."""
    from replayloader_electra.pretrain.loop import pretrain

    short, long = size["logging_steps"]
    rows = []
    for (defer, log_every), label in LOGGING_RUNS.items():
        walls = []
        for n in (short, long):
            config = pretrain_config(size, work / f"logging{defer}{log_every}-{n}", work / "cache", device_name,
                                     variant="tmr-loss_diff", steps=n, defer_feedback=defer, log_every=log_every)
            started = time.perf_counter()
            pretrain(config)
            walls.append(time.perf_counter() - started)
        rows.append({"run": label, "seconds_per_step": (walls[1] - walls[0]) / (long - short),
                     "steps_timed": long - short})
    base = rows[0]["seconds_per_step"]
    for row in rows:
        row["ratio"] = row["seconds_per_step"] / base
    return rows


# ----------------------------------------------------------------------------------------------- report
def pretraining_missing() -> list[str]:
    """What parts (a), (c) and (d) need and this machine lacks: they pretrain the integration's ELECTRA."""
    import importlib.util

    return [name for name in ("replayloader_electra", "transformers", "tokenizers", "safetensors", "datasets")
            if importlib.util.find_spec(name) is None]


def run_gpu_tests() -> str:
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "tests/gpu")],
                          cwd=ROOT, capture_output=True, text=True)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return "\n".join(lines[-25:])


def report(args, env: dict, tests: str, table: list[dict], ops: list[dict], parts: dict | None,
           logging_rows: list[dict], seconds: float, missing: list[str]) -> str:
    out = [f"# GPU check{' (dry run on the CPU: plumbing only, not a measurement)' if args.dry_run else ''}", "",
           f"Command: `python bench/gpu_check.py{' --dry-run' if args.dry_run else ''}`  ",
           f"Date: {env['date']}  ", f"Machine: {env['device']}; torch {env['torch']}, CUDA {env['cuda']}, "
           f"Python {env['python']}, {env['platform']}  ", f"Wall time: {seconds:.0f} s", "",
           "## tests/gpu", "", "```", tests, "```", ""]
    if missing:
        out += [f"Parts (a), (c) and (d) were skipped: they pretrain, and this machine lacks {', '.join(missing)}.", ""]
    if table:
        out += ["## (a) Runtime per step (paper Table 2 setting)", "",
                "| variant | median s/step | ratio to electra | paper ratio | steps timed |", "|---|---|---|---|---|"]
        for row in table:
            paper = "" if row["paper"] is None else f"{row['paper']:.3f}"
            out.append(f"| {row['variant']} | {row['median_s']:.4f} | {row['ratio']:.3f} | {paper} | {row['steps']} |")
        out.append("")
    out += ["## (b) Buffer operations, storage on the device (median µs)", "",
            "| N | K | add | sample | update (incl. feedback copy) |", "|---|---|---|---|---|"]
    for row in ops:
        out.append(f"| {row['N']:,} | {row['K']} | {row['add_us']:.0f} | {row['sample_us']:.0f} | "
                   f"{row['update_us']:.0f} |")
    if parts is None:
        out.append("")
        return "\n".join(out)
    out += ["", "## (c) Where a tmr-loss_diff step's time goes (parts timed between device synchronisations)", "",
            "| part | ms/step |", "|---|---|"]
    for name, value in parts["seconds_per_step"].items():
        out.append(f"| {name} | {1e3 * value:.2f} |")
    what = ("on the CPU every tensor counts, the optimizer's host-side step counters too: only the difference "
            "means something" if args.dry_run else "calls on CUDA tensors")
    out += ["", f"Host transfers per step ({what}): "
            + ", ".join(f"{k} {v:.1f}" for k, v in parts["host_transfers_per_step"].items()), ""]
    out += ["## (d) What logging every step costs (tmr-loss_diff; wall-time difference of a short and a long run, "
            f"{logging_rows[0]['steps_timed']} steps apart)",
            "", "| feedback, logging | s/step | ratio to synchronous, every step |", "|---|---|---|"]
    for row in logging_rows:
        out.append(f"| {row['run']} | {row['seconds_per_step']:.4f} | {row['ratio']:.3f} |")
    out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="toy sizes on the CPU: checks the plumbing only")
    parser.add_argument("--out", default=None, help="markdown report (default: results/gpu_check.md on a GPU; "
                                                    "a temporary file with --dry-run)")
    parser.add_argument("--skip-tests", action="store_true", help="do not run tests/gpu first")
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device here: run on a GPU machine, or pass --dry-run to check the plumbing")
    device = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
    if args.dry_run:
        torch.set_num_threads(1)
    env = {"date": datetime.date.today().isoformat(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "python": platform.python_version(), "platform": platform.platform(),
           "device": torch.cuda.get_device_name() if device == "cuda" else f"CPU ({platform.processor() or 'cpu'})"}
    size = sizes(args.dry_run)
    started = time.perf_counter()
    tests = "skipped (--skip-tests)" if args.skip_tests else run_gpu_tests()
    print(tests, flush=True)
    missing = pretraining_missing()
    table, parts, logging_rows = [], None, []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if not missing:
            table = runtime_table(size, device, work)
            print(json.dumps(table, indent=1), flush=True)
        ops = buffer_ops(size, torch.device(device))
        print(json.dumps(ops, indent=1), flush=True)
        if not missing:
            parts = breakdown(size, device, work)
            print(json.dumps(parts, indent=1), flush=True)
            logging_rows = logging_cost(size, device, work)
            print(json.dumps(logging_rows, indent=1), flush=True)
    text = report(args, env, tests, table, ops, parts, logging_rows, time.perf_counter() - started, missing)
    out = Path(args.out) if args.out else (Path(tempfile.mkdtemp()) / "gpu_check.md" if args.dry_run
                                           else ROOT / "results" / "gpu_check.md")
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

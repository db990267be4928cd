"""One prepared command that checks the flagship on a bare CUDA machine, pretrains, fine-tunes, and times it.

    python -m checks.gpu_check --prepare              # here, once: the folder that travels (.gpu_bundle), sized
    bash checks/gpu_check.sh                          # there: every part below, report in $OUT (< 8 min)
    bash checks/gpu_check.sh --dry-run                # anywhere: the same command at toy sizes on the CPU

Nothing is installed on the GPU machine: the library and the integration run from the working tree
(``replayloader_electra`` is imported from ``integrations/electra``), the pretraining corpus and GLUE are read
from local files without `datasets` (which that machine lacks), and the data travels in ``.gpu_bundle/`` (SST-2
and the Wikipedia text of the SQuAD train articles, copied by ``--prepare`` from ``$REPLAYLOADER_DATA``).

Each part runs in its own process with a time limit, so one that fails or hangs costs only itself, and the
report is rewritten after every part. The parts, in order (``--parts`` picks some):
nccl      ``replayloader.distributed.session("nccl")`` with world size 1 and one `DistributedPrioritizedSampler`
          step, checked against a plain `PrioritizedSampler` doing the same.
speed     (a) the paper's runtime table (TMR Table 2): the ``small`` preset (ELECTRA-Small), batch 128, sequence
          128, bf16 autocast: seconds per step of electra and the tmr variants (wall time between synchronised
          logged steps), ratios to electra beside the paper's (loss_diff 1.016, grad_norm 2.49, grad_bound 1.15),
          tokens per second and peak memory; and the reference loop: a plain generator + discriminator step of
          HF's ``ElectraForMaskedLM`` / ``ElectraForPreTraining`` at the same shapes on the same batches.
syncs     (c) host synchronisations per step at steady state, counted by ``torch.cuda.set_sync_debug_mode("warn")``
          over N steps, grouped by the line that caused them (goal: none in the replay path).
real      a short real run: ELECTRA and TMR (loss_diff) at ``small``, as many steps as fit in about two minutes
          each, held-out AUC at matched steps and at matched wall time (the held-out set is corrupted once by the
          generator of a short reference ELECTRA run, from text neither run trains on).
finetune  SST-2 fine-tuned from each discriminator of ``real`` (one seed).
logging   (d) what logging every step costs (wall-time difference of a short and a long run); if time is left.
tests     ``tests/gpu`` (pytest), with the time that is left.
buffer    (b) buffer operations with storage on the device; if time is left.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

STARTED = time.perf_counter()  # this process's start: a part's time limit counts from it
ROOT = Path(__file__).resolve().parents[1]  # run as python -m checks.gpu_check from here (gpu_check.sh does)
BUNDLE = ROOT / ".gpu_bundle"  # ignored by git; `--prepare` fills it, the device call carries it
LIMIT_BYTES = 64 * 2 ** 20  # what may travel to the device machine: code, data and wheels together
WIKI_FILES = ("squad-train-articles.part1of2.txt.gz", "squad-train-articles.part2of2.txt.gz")  # never the dev text
SST2_FILES = ("train.tsv", "dev.tsv")
PAPER_RATIOS = {"tmr-loss_diff": 1.016, "tmr-grad_norm": 2.49, "tmr-grad_bound": 1.15}
LOG_EVERY = 50  # (d): the sparse logging compared with logging every step
LOGGING_RUNS = {(False, 1): "synchronous", (True, 1): "deferred",
                (False, LOG_EVERY): f"synchronous, --log-every {LOG_EVERY}",
                (True, LOG_EVERY): f"deferred, --log-every {LOG_EVERY}"}  # (defer_feedback, log_every) -> label
ORDER = ("nccl", "speed", "syncs", "real", "finetune", "logging", "tests", "buffer")


def import_integration() -> None:
    """Make ``replayloader_electra`` importable from this checkout's integrations/electra (no install needed),
    as tests/conftest.py does."""
    name, folder = "replayloader_electra", ROOT / "integrations" / "electra"
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, folder / "__init__.py", submodule_search_locations=[str(folder)])
    sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules[name])


# ----------------------------------------------------------------------------------------------- sizes
def sizes(dry_run: bool) -> dict:
    """Every size of the check: the GPU's, or toy ones for the CPU (`--dry-run`), with each part's time limit."""
    if dry_run:
        return {"pretrain": dict(preset="tiny", batch_size=8, max_len=32, vocab_size=200, amp="none"),
                "max_lines": {"wiki": 200, "python-docs": 200}, "heldout_lines": 60, "heldout_examples": 8,
                "table_steps": 4, "table_warm": 1, "table_log_every": 1, "reference_steps": 3, "reference_warm": 1,
                "reference_repeats": 1,
                "sync_warm": 1, "sync_steps": 2, "real_seconds": 1.0, "real_steps": (6, 6), "reference_run": 3,
                "finetune": dict(max_train_examples=64, max_eval_examples=32, epochs=1, batch_size=16),
                "logging_steps": (2, 4), "buffer_n": [1_000], "buffer_k": [128], "buffer_reps": 3,
                "nccl": (256, 32), "budget": 600, "finetune_reserve": 60, "minimum": {"any": 5},
                "limits": {"nccl": 60, "speed": 120, "syncs": 90, "real": 150, "finetune": 90, "logging": 120,
                           "tests": 300, "buffer": 60}}
    return {"pretrain": dict(preset="small", batch_size=128, max_len=128, vocab_size=30_522, amp="bf16"),
            "max_lines": {"wiki": 18_500, "python-docs": 16_600}, "heldout_lines": 3_000, "heldout_examples": 512,
            "table_steps": 60, "table_warm": 10, "table_log_every": 10, "reference_steps": 60, "reference_warm": 10,
            "reference_repeats": 2,
            "sync_warm": 10, "sync_steps": 20, "real_seconds": 120.0, "real_steps": (200, 20_000), "reference_run": 300,
            "finetune": dict(max_train_examples=8_000, max_eval_examples=None, epochs=1, batch_size=32),
            "logging_steps": (20, 20 + LOG_EVERY), "buffer_n": [1_000, 100_000, 1_000_000], "buffer_k": [128, 1024],
            "buffer_reps": 30, "nccl": (100_000, 128), "budget": 480, "finetune_reserve": 90,
            "minimum": {"any": 20, "logging": 40, "tests": 120},  # a part with less time left is skipped
            "limits": {"nccl": 60, "speed": 150, "syncs": 90, "real": 330, "finetune": 100, "logging": 90,
                       "tests": 240, "buffer": 45}}


def corpus_of(bundle: Path, size: dict) -> dict:
    """The pretraining corpus: the bundle's Wikipedia text (SQuAD train articles) when it holds them, else the
    embedded python-docs; the runs train on the first ``max_lines`` lines, the held-out set comes from the rest."""
    wiki = [bundle / "data" / "wikipedia-squad" / name for name in WIKI_FILES]
    if all(path.is_file() for path in wiki):
        return {"corpus": ",".join(str(path) for path in wiki), "max_lines": size["max_lines"]["wiki"],
                "name": "Wikipedia (SQuAD train articles)"}
    return {"corpus": "python-docs", "max_lines": size["max_lines"]["python-docs"], "name": "python-docs"}


# ----------------------------------------------------------------------------------------------- helpers
def sync(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def pretrain_config(ctx: dict, out: Path, **overrides):
    from replayloader_electra.pretrain.config import PretrainConfig

    settings = dict(ctx["size"]["pretrain"], corpus=ctx["corpus"]["corpus"], max_lines=ctx["corpus"]["max_lines"],
                    output_dir=str(out), cache_dir=str(ctx["work"] / "cache"), device=ctx["device"], progress=False,
                    export_hf=False, buffer_size=1000, seed=0, checkpoint_every=0, keep_checkpoints=1)
    settings.update(overrides)
    return PretrainConfig(**settings)


@contextlib.contextmanager
def write_times(sink: list[dict], start: dict | None = None):
    """Record when each metrics record is written (after its values are read off the device, so the device has
    finished every step up to it) and the held-out scoring time in it: the run's wall time at its logged steps.
    ``start["time"]`` is set when the first step begins (the producer's first call: after data and models are
    ready)."""
    from replayloader_electra.pretrain.corruption import CorruptionProducer
    from replayloader_electra.pretrain.metrics import MetricsLog

    original_write, original_call = MetricsLog.write, CorruptionProducer.__call__
    start = {} if start is None else start

    def write(self, record):
        sink.append({"time": time.perf_counter(), "step": record["step"],
                     "scoring": record.get("heldout_seconds") or 0.0, "heldout_auc": record.get("heldout_auc")})
        return original_write(self, record)

    def call(self, raw):
        start.setdefault("time", time.perf_counter())
        return original_call(self, raw)

    MetricsLog.write, CorruptionProducer.__call__ = write, call
    try:
        yield
    finally:
        MetricsLog.write, CorruptionProducer.__call__ = original_write, original_call


def training_clock(marks: list[dict], started: float) -> list[dict]:
    """Each mark with ``elapsed``: seconds since ``started`` (the first step's start) without the held-out
    scoring done so far."""
    scoring, out = 0.0, []
    for mark in marks:
        scoring += mark["scoring"]
        out.append({**mark, "elapsed": mark["time"] - started - scoring})
    return out


def peak_memory_start(device: str) -> None:
    import torch

    if device == "cuda":
        import gc

        gc.collect()  # the models of the runs before
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_memory_gib(device: str) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2 ** 30 if device == "cuda" else None


@contextlib.contextmanager
def row_errors(results: Results, key: str, label: str):
    """A row that fails is recorded as failed (with its error) and the part goes on with its next row."""
    try:
        yield
    except Exception as error:
        traceback.print_exc()
        results.append(key, {"variant": label, "run": label, "error": f"{type(error).__name__}: {error}"})
        results.append("row_errors", f"{label}: {type(error).__name__}: {error}")


class Results:
    """A part's results, rewritten to its JSON file after every row, so a part stopped at its limit keeps what it
    measured."""

    def __init__(self, path: Path):
        self.path, self.data = path, {"status": "running"}
        self.save()

    def __setitem__(self, key, value):
        self.data[key] = value
        self.save()

    def append(self, key, row):
        self.data.setdefault(key, []).append(row)
        self.save()

    def save(self):
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)


# ----------------------------------------------------------------------------------------------- nccl
def part_nccl(ctx: dict, results: Results) -> None:
    """``session("nccl")`` in one process (gloo on the CPU) and one `DistributedPrioritizedSampler` step: a draw,
    feedback gathered through the backend, and the weights after it equal to a plain sampler's."""
    backend = "nccl" if ctx["device"] == "cuda" else "gloo"
    n, k = ctx["size"]["nccl"]
    settings = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    before = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    try:
        nccl_step(backend, n, k, results)
    finally:  # the parts after this one (with --in-process) are single processes again
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def nccl_step(backend: str, n: int, k: int, results: Results) -> None:
    import numpy as np
    import torch

    from replayloader import PrioritizedSampler
    from replayloader.distributed import DistributedPrioritizedSampler, session

    kwargs = {"device_id": torch.device("cuda", 0)} if backend == "nccl" else {}
    if backend == "nccl":
        torch.cuda.set_device(0)
    started = time.perf_counter()
    with session(backend, **kwargs):
        import torch.distributed as dist

        shared = DistributedPrioritizedSampler(PrioritizedSampler(n, k, seed=0, warmup_epochs=0), dataset_size=n)
        plain = PrioritizedSampler(n, k, seed=0, warmup_epochs=0)
        batch, expected = shared.next_batch(), plain.next_batch()
        loss = np.random.default_rng(0).random(len(batch.indices)) + 0.1
        changed = shared.feedback(batch, loss=loss)
        plain.feedback(expected, loss=loss)
        shared.settle()
        same = bool(np.array_equal(batch.indices, expected.indices)
                    and np.allclose(shared.probabilities(), plain.probabilities()))
        after, again = shared.next_batch(), plain.next_batch()
        results.data.update(backend=dist.get_backend(), world_size=dist.get_world_size(),
                            gathers=shared.stats()["feedback_gathers"], weights_changed=changed,
                            same_as_plain_sampler=same and bool(np.array_equal(after.indices, again.indices)),
                            N=n, K=k, seconds=time.perf_counter() - started)
    results["initialised_after"] = dist.is_initialized()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------------------------- speed: (a)
TABLE_RUNS = (("electra", {}), ("tmr-loss_diff", {}), ("tmr-loss_diff", {"defer_feedback": True}),
              ("tmr-grad_norm", {}), ("tmr-grad_bound", {}))


def table_label(variant: str, extra: dict) -> str:
    """A row's name in the runtime table and the sync counts (`--table` spells its spaces as underscores)."""
    return variant + (" (deferred feedback)" if extra else "")


def table_runs(chosen: str | None) -> list[tuple[str, dict]]:
    """The rows of `TABLE_RUNS` that ``--table`` names (all when None); electra always, the ratios' base."""
    if not chosen:
        return list(TABLE_RUNS)
    spelled = {table_label(v, e).replace(" ", "_"): (v, e) for v, e in TABLE_RUNS}
    names = {name.strip().replace(" ", "_") for name in chosen.split(",") if name.strip()}
    unknown = sorted(names - set(spelled))
    if unknown:
        raise ValueError(f"--table names unknown rows {unknown}; the rows are {', '.join(sorted(spelled))}")
    return [run for name, run in spelled.items() if run[0] == "electra" or name in names]


def time_row(ctx: dict, folder: str, variant: str, extra: dict) -> tuple[float, int]:
    """(seconds per step, steps timed) of one pretraining run of the runtime table: the wall time between its
    first logged step after the warm-up and its last, over the steps between (each logged step reads its values
    off the device, so the interval covers the device work of every step in it)."""
    from replayloader_electra.pretrain.loop import pretrain

    size = ctx["size"]
    marks: list[dict] = []
    with write_times(marks):
        pretrain(pretrain_config(ctx, ctx["work"] / "speed" / folder, variant=variant, steps=size["table_steps"],
                                 log_every=size["table_log_every"], **extra))
    timed = [m for m in marks if m["step"] >= size["table_warm"]]
    steps = timed[-1]["step"] - timed[0]["step"]
    return (timed[-1]["time"] - timed[0]["time"]) / steps, steps


def part_speed(ctx: dict, results: Results) -> None:
    """(a) the runtime table, with the reference loop on the same batches right after the electra row (so that a
    part stopped at its limit keeps the comparison), then ``reference_repeats`` more electra / reference pairs in
    turn: one run of each decided 0.81x on one machine and 1.00x on another, so the verdict takes their median."""
    from replayloader_electra.pretrain.loop import pretrain

    size, device = ctx["size"], ctx["device"]
    tokens = size["pretrain"]["batch_size"] * size["pretrain"]["max_len"]
    # an untimed run first: in both runs on an H200 the first row (electra) timed slower than tmr-loss_diff,
    # which does more work, so the first process-wide warm-up (allocator, kernels, clocks) may not end in its
    # own warm-up steps
    with row_errors(results, "warm_up_errors", "untimed warm-up run"):  # a failure here still lets the rows run
        pretrain(pretrain_config(ctx, ctx["work"] / "speed" / "warm-up", variant="electra",
                                 steps=size["table_warm"] * 2, log_every=10 ** 6))
    base = None
    for variant, extra in table_runs(ctx["table"]):
        label = table_label(variant, extra)
        with row_errors(results, "table", label):
            peak_memory_start(device)
            seconds, steps = time_row(ctx, label.replace(" ", "_"), variant, extra)
            base = seconds if variant == "electra" else base
            results.append("table", {"variant": label, "seconds_per_step": seconds,
                                     "ratio": seconds / base if base else None, "paper": PAPER_RATIOS.get(label),
                                     "tokens_per_second": tokens / seconds, "peak_memory_gib": peak_memory_gib(device),
                                     "steps_timed": steps})
        if variant == "electra":
            with row_errors(results, "reference_errors", "reference loop"):
                results["reference"] = reference_loop(ctx)
                if base:
                    results.append("reference_pairs", {"electra": base,
                                                       "reference": results.data["reference"]["seconds_per_step"]})
    for repeat in range(size["reference_repeats"] if results.data.get("reference_pairs") else 0):
        with row_errors(results, "reference_errors", f"electra / reference pair {repeat + 2}"):
            electra, _ = time_row(ctx, f"electra_again_{repeat + 2}", "electra", {})
            results.append("reference_pairs", {"electra": electra,
                                               "reference": reference_loop(ctx)["seconds_per_step"]})
    if results.data.get("row_errors"):
        raise RuntimeError(f"{len(results.data['row_errors'])} row(s) failed: {'; '.join(results.data['row_errors'])}")


def reference_loop(ctx: dict) -> dict:
    """A plain ELECTRA step written directly on HF's classes, as a user would without this project: the
    generator's MLM loss over full-vocabulary logits at every position (``labels=``), a Gumbel-max sample at the
    masked positions, the discriminator's own loss (``labels=``), ``L_G + 50 L_D``, clip 1.0, AdamW; the same
    configs (shared embeddings, as ELECTRA), batches, autocast and step count as the electra row."""
    import torch
    from transformers import ElectraForMaskedLM, ElectraForPreTraining

    from replayloader_electra.runtime import Autocast
    from replayloader_electra.data import prepare_pretraining_data
    from replayloader_electra.models import electra_configs, share_embeddings
    from replayloader_electra.pretrain.config import model_preset

    size, device = ctx["size"], torch.device(ctx["device"])
    cfg = pretrain_config(ctx, ctx["work"] / "reference").filled()
    data = prepare_pretraining_data(cfg.corpus, cfg.cache_dir, cfg.vocab_size, cfg.max_len, max_lines=cfg.max_lines)
    tok = data.tokenizer
    generator_config, discriminator_config = electra_configs(model_preset(cfg), len(tok), tok.pad_token_id,
                                                             cfg.dropout)
    torch.manual_seed(0)
    discriminator = ElectraForPreTraining(discriminator_config).to(device)
    generator = ElectraForMaskedLM(generator_config).to(device)
    share_embeddings(generator, discriminator)
    parameters = list({id(p): p for p in [*discriminator.parameters(), *generator.parameters()]}.values())
    optimizer = torch.optim.AdamW(parameters, lr=cfg.learning_rate, eps=1e-6, weight_decay=0.01)
    autocast = Autocast.choose(device, cfg.amp)
    special = torch.tensor([tok.pad_token_id, tok.cls_token_id, tok.sep_token_id], device=device)
    rng = torch.Generator().manual_seed(0)
    ids_all = torch.from_numpy(data.examples["input_ids"][:].astype("int64"))

    def step():
        rows = torch.randint(len(ids_all), (cfg.batch_size,), generator=rng)
        ids = ids_all[rows].to(device, non_blocking=True)
        attention = (ids != tok.pad_token_id).long()
        candidates = ~torch.isin(ids, special)
        masked = (torch.rand(ids.shape, device=device) < cfg.mask_prob) & candidates
        to_mask = masked & (torch.rand(ids.shape, device=device) < cfg.mask_token_prob)
        generator_input = ids.masked_fill(to_mask, tok.mask_token_id)
        with autocast():
            g = generator(input_ids=generator_input, attention_mask=attention, labels=ids.masked_fill(~masked, -100))
        with torch.no_grad():
            logits = g.logits[masked].float()
            noise = -torch.log(-torch.log(torch.rand_like(logits).clamp_min(1e-9)).clamp_min(1e-9))
            corrupted = ids.clone()
            corrupted[masked] = (logits + noise).argmax(-1)
        with autocast():
            d = discriminator(input_ids=corrupted, attention_mask=attention, labels=(corrupted != ids).long())
        loss = g.loss + 50.0 * d.loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()

    for _ in range(size["reference_warm"]):
        step()
    sync(device)
    peak_memory_start(ctx["device"])
    started = time.perf_counter()
    steps = size["reference_steps"] - size["reference_warm"]
    for _ in range(steps):
        step()
    sync(device)
    seconds = (time.perf_counter() - started) / steps
    return {"seconds_per_step": seconds, "tokens_per_second": cfg.batch_size * cfg.max_len / seconds,
            "peak_memory_gib": peak_memory_gib(ctx["device"]), "steps_timed": steps}


# ----------------------------------------------------------------------------------------------- syncs: (c)
SYNC_RUNS = (("electra", {}), ("tmr-loss_diff", {"defer_feedback": True}), ("tmr-loss_diff", {}))


@contextlib.contextmanager
def sync_window(device: str, warm: int, steps: int, window: dict):
    """Turn ``torch.cuda.set_sync_debug_mode("warn")`` on from the start of step ``warm + 1`` to the start of step
    ``warm + steps + 1`` (the producer's calls mark the steps), and record the warnings it raises.

    The debug mode does not flag ``torch.cuda.Event.synchronize()`` (deferred feedback waits on its copy's event
    once per step), so that call is counted here too, as a warning from its caller's line. On the CPU the whole
    block is the window."""
    import torch

    from replayloader_electra.pretrain.corruption import CorruptionProducer

    original = CorruptionProducer.__call__
    event_synchronize = torch.cuda.Event.synchronize
    calls = {"n": 0}
    on_cuda = device == "cuda"
    counting = {"on": not on_cuda}

    def counted(self, raw):
        calls["n"] += 1
        if on_cuda and calls["n"] == warm + 1:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("warn")
            counting["on"] = True
        if calls["n"] == warm + steps + 1:
            if on_cuda:
                torch.cuda.set_sync_debug_mode("default")
                counting["on"] = False
            window["steps"] = steps
        return original(self, raw)

    def flagged_event_synchronize(self, *args, **kwargs):
        if counting["on"]:
            warnings.warn("waited on a CUDA event: torch.cuda.Event.synchronize() (a synchronizing call the debug "
                          "mode does not flag)", stacklevel=2)
        return event_synchronize(self, *args, **kwargs)

    CorruptionProducer.__call__ = counted
    torch.cuda.Event.synchronize = flagged_event_synchronize
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
        found = [w for w in caught if "synchroniz" in str(w.message).lower()]
        window["syncs"] = len(found)
        where: dict[str, int] = {}
        for w in found:
            key = f"{shorten(w.filename)}:{w.lineno}"
            where[key] = where.get(key, 0) + 1
        window["where"] = dict(sorted(where.items(), key=lambda item: -item[1]))
        window["messages"] = sorted({str(w.message).splitlines()[0][:120] for w in found})
    finally:
        CorruptionProducer.__call__ = original
        torch.cuda.Event.synchronize = event_synchronize
        if on_cuda:
            torch.cuda.set_sync_debug_mode("default")


def shorten(filename: str) -> str:
    """A path from the package it is in (site-packages/transformers/... -> transformers/...; ours from ROOT)."""
    path = Path(filename)
    with contextlib.suppress(ValueError):
        return str(path.resolve().relative_to(ROOT))
    parts = path.parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return "/".join(parts[parts.index(marker) + 1:])
    return filename


SYNC_SOURCES = (("replayloader/", "library"), ("integrations/electra/", "integration"),
                ("transformers/", "transformers"), ("", "other"))  # first match wins


def sync_source(where: str) -> str:
    """Which code a sync came from: the library (replay buffer, loader: the goal is 0 there), the integration's
    step (masking, sampling, losses), transformers, or other (torch and the rest)."""
    return next(label for prefix, label in SYNC_SOURCES if where.startswith(prefix))


def part_syncs(ctx: dict, results: Results) -> None:
    from replayloader_electra.pretrain.loop import pretrain

    size = ctx["size"]
    warm, steps = size["sync_warm"], size["sync_steps"]
    results["mode"] = ("torch.cuda.set_sync_debug_mode('warn'), plus each torch.cuda.Event.synchronize() (which it "
                       "does not flag)" if ctx["device"] == "cuda"
                       else "not available on the CPU: plumbing only, no syncs can be seen")
    for variant, extra in SYNC_RUNS:
        label = table_label(variant, extra)
        window: dict = {}
        with row_errors(results, "runs", label), sync_window(ctx["device"], warm, steps, window):
            pretrain(pretrain_config(ctx, ctx["work"] / "syncs" / label.replace(" ", "_"), variant=variant,
                                     steps=warm + steps + 2, log_every=10 ** 6, **extra))
        if "syncs" not in window:
            continue
        by_source = dict.fromkeys((label for _, label in SYNC_SOURCES), 0)
        for where, count in (window.get("where") or {}).items():
            by_source[sync_source(where)] += count
        results.append("runs", {"run": label, "steps": window.get("steps"), "syncs": window.get("syncs"),
                                "per_step": window.get("syncs", 0) / steps,
                                "per_step_by_source": {k: v / steps for k, v in by_source.items()},
                                "where": window.get("where"), "messages": window.get("messages")})
    if results.data.get("row_errors"):
        raise RuntimeError(f"{len(results.data['row_errors'])} run(s) failed: {'; '.join(results.data['row_errors'])}")


# ----------------------------------------------------------------------------------------------- real run
def part_real(ctx: dict, results: Results) -> None:
    """A reference ELECTRA run whose generator corrupts the held-out text once, then ELECTRA and TMR(loss_diff)
    for the same number of steps (sized from the speed part's electra step, to fill ``real_seconds`` each),
    scored on the held-out set 8 times (and at the last step); both export their discriminators for ``finetune``."""
    from transformers import ElectraForMaskedLM

    from replayloader_electra.tokenizer import load_tokenizer
    from replayloader_electra.data import corpus_lines, resolve_corpus
    from replayloader_electra.pretrain.heldout import build_heldout_set
    from replayloader_electra.pretrain.loop import pretrain

    size, work = ctx["size"], ctx["work"]
    speed = read_json(work / "speed.json").get("table") or []
    per_step = next((row["seconds_per_step"] for row in speed if row["variant"] == "electra" and "error" not in row),
                    None)
    results.data.update(electra_seconds_per_step_from_speed=per_step, corpus=ctx["corpus"]["name"],
                        trained_lines=ctx["corpus"]["max_lines"], amp=size["pretrain"]["amp"])
    started = time.perf_counter()
    marks: list[dict] = []
    first_step: dict = {}
    with write_times(marks, first_step):
        reference = pretrain(pretrain_config(ctx, work / "real" / "reference", variant="electra",
                                             steps=size["reference_run"], log_every=10 ** 6, export_hf=True))
    if per_step is None:  # no (a) in this call: the reference run's own pace (its first step's warm-up included)
        per_step = (marks[-1]["time"] - first_step["time"]) / size["reference_run"]
    low, high = size["real_steps"]
    # this part's time, less ~50 s for its start, the reference run, the held-out set and the exports, for two
    # runs of `seconds` each, with some margin
    left = ctx["seconds_left"] - (time.perf_counter() - ctx["started"])
    seconds = min(size["real_seconds"], max(left - 30.0, 10.0) / 2.25)
    steps = max(low, min(high, int(seconds / (1.12 * per_step))))
    results.data.update(steps=steps, target_seconds=seconds, electra_seconds_per_step=per_step)
    results.save()
    generator_dir = Path(reference.output_dir) / "generator"
    tokenizer = load_tokenizer(str(generator_dir), need_mask=True)
    lines = corpus_lines(resolve_corpus(ctx["corpus"]["corpus"]), work / "cache",
                         start=ctx["corpus"]["max_lines"])["text"][:size["heldout_lines"]]
    cfg = reference.config
    heldout = build_heldout_set(ElectraForMaskedLM.from_pretrained(str(generator_dir)), tokenizer, lines, cfg.max_len,
                                size["heldout_examples"], cfg.mask_prob, cfg.mask_token_prob, seed=0,
                                info={"generator": "reference electra run", "reference_steps": cfg.steps})
    heldout_path = work / "real" / "heldout.safetensors"
    heldout.save(heldout_path)
    results.data.update(reference_steps=cfg.steps, heldout_examples=len(heldout),
                        reference_and_heldout_seconds=time.perf_counter() - started)
    results.save()

    every = max(1, steps // 8)
    for variant in ("electra", "tmr-loss_diff"):
        with row_errors(results, "runs", variant):
            marks: list[dict] = []
            first_step: dict = {}
            run_started = time.perf_counter()
            with write_times(marks, first_step):
                result = pretrain(pretrain_config(ctx, work / "real" / variant, variant=variant, steps=steps,
                                                  heldout=str(heldout_path), heldout_every=every,
                                                  log_every=LOG_EVERY, defer_feedback=True, export_hf=True))
            clock = training_clock(marks, first_step["time"])
            points = [{"step": m["step"], "elapsed": m["elapsed"], "auc": m["heldout_auc"]} for m in clock
                      if m["heldout_auc"] is not None]
            results.append("runs", {"variant": variant, "steps": steps, "training_seconds": clock[-1]["elapsed"],
                                    "wall_seconds": time.perf_counter() - run_started, "points": points,
                                    "discriminator": result.discriminator_dir,
                                    "final_loss": result.summary.get("final_loss")})
    if results.data.get("row_errors"):
        raise RuntimeError(f"{len(results.data['row_errors'])} run(s) failed: {'; '.join(results.data['row_errors'])}")


def auc_at(points: list[dict], elapsed: float) -> float | None:
    """The held-out AUC at training time ``elapsed``, linear between scoring points (None before the first)."""
    before = [p for p in points if p["elapsed"] <= elapsed]
    after = [p for p in points if p["elapsed"] > elapsed]
    if not before:
        return None
    a = before[-1]
    if not after:
        return a["auc"]
    b = after[0]
    return a["auc"] + (b["auc"] - a["auc"]) * (elapsed - a["elapsed"]) / (b["elapsed"] - a["elapsed"])


# ----------------------------------------------------------------------------------------------- finetune
def part_finetune(ctx: dict, results: Results) -> None:
    from replayloader_electra.finetune.api import finetune_glue_task

    runs = read_json(ctx["work"] / "real.json").get("runs") or []
    checkpoints = {run["variant"]: run["discriminator"] for run in runs if run.get("discriminator")}  # those that ran
    if not checkpoints:
        raise RuntimeError("the real part left no discriminator to fine-tune")
    glue_dir = ctx["bundle"] / "data" / "glue"
    options = dict(ctx["size"]["finetune"])
    train_examples, eval_examples = options.pop("max_train_examples"), options.pop("max_eval_examples")
    started = time.perf_counter()
    for name, location in checkpoints.items():  # one at a time: a part stopped at its limit keeps the rows done
        rows = finetune_glue_task({name: location}, "sst2", str(glue_dir), train_examples, eval_examples, [0],
                                  str(ctx["work"] / "finetune"), write_tables=False, amp=ctx["device"] == "cuda",
                                  device=ctx["device"], progress=False, **options)
        for row in rows:
            results.append("rows", {k: row.get(k) for k in ("checkpoint", "accuracy", "train_examples",
                                                            "train_steps", "train_seconds", "eval_examples",
                                                            "epochs", "batch_size", "learning_rate")})
        results.data["seconds"] = time.perf_counter() - started
        results.save()


# ----------------------------------------------------------------------------------------------- (d), (b), tests
def part_logging(ctx: dict, results: Results) -> None:
    """(d) Seconds per tmr-loss_diff step for each of `LOGGING_RUNS`: (wall of the long run - wall of the short
    run) / the steps between, so set-up, export and the device work still queued cancel out."""
    from replayloader_electra.pretrain.loop import pretrain

    short, long = ctx["size"]["logging_steps"]
    for (defer, log_every), label in LOGGING_RUNS.items():
        walls = []
        for n in (short, long):
            config = pretrain_config(ctx, ctx["work"] / "logging" / f"{defer}{log_every}-{n}", variant="tmr-loss_diff",
                                     steps=n, defer_feedback=defer, log_every=log_every)
            started = time.perf_counter()
            pretrain(config)
            walls.append(time.perf_counter() - started)
        results.append("rows", {"run": label, "seconds_per_step": (walls[1] - walls[0]) / (long - short),
                                "steps_timed": long - short})
    base = results.data["rows"][0]["seconds_per_step"]
    for row in results.data["rows"]:
        row["ratio"] = row["seconds_per_step"] / base
    results.save()


def part_buffer(ctx: dict, results: Results) -> None:
    """(b) add / sample / update of K examples with storage on the device, median µs."""
    import torch

    from replayloader import ReplayBuffer
    from replayloader.strategies import by_name

    size, device = ctx["size"], torch.device(ctx["device"])
    for n in size["buffer_n"]:
        for k in size["buffer_k"]:
            if k > n:
                continue
            buffer = ReplayBuffer(n, strategy=by_name("loss_diff"), seed=0)
            make = lambda: {"input_ids": torch.randint(0, 30_000, (k, 128), device=device)}  # noqa: E731
            for _ in range(-(-n // k)):  # fill it, so adds evict
                buffer.add(make())
            timings: dict[str, list[float]] = {"add": [], "sample": [], "update": []}
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
            results.append("rows", {"N": n, "K": k, **{f"{name}_us": 1e6 * statistics.median(v)
                                                       for name, v in timings.items()}})


def run_gpu_tests(timeout: float, log) -> dict:
    """pytest tests/gpu in its own process group, stopped at ``timeout``."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "tests/gpu")]
    code, output, seconds = run_process(command, timeout, capture=True)
    lines = output.strip().splitlines()
    log(output)
    return {"status": "ok" if code == 0 else ("timed out" if code is None else f"exit {code}"),
            "seconds": seconds, "summary": "\n".join(lines[-25:])}


# ----------------------------------------------------------------------------------------------- orchestration
PARTS = {"nccl": part_nccl, "speed": part_speed, "syncs": part_syncs, "real": part_real, "finetune": part_finetune,
         "logging": part_logging, "buffer": part_buffer}


def run_part(name: str, args, started: float | None = None) -> int:
    """One part in this process (the orchestrator starts each so): results in WORK/NAME.json. Its time limit
    (``args.seconds_left``) counts from ``started`` (default: this process's start)."""
    sys.modules["datasets"] = None  # the check proves the flagship needs no `datasets`: importing it fails here
    import_integration()
    import torch

    if name not in ("nccl", "buffer"):  # the parts that pretrain
        from replayloader_electra.pretrain import loop

        loop.plot_metrics = lambda runs, path: None  # a run's loss plot (2-3 s of matplotlib) is not part of the check

    work, bundle = Path(args.work), Path(args.bundle)
    size = sizes(args.dry_run)
    device = "cpu" if args.dry_run else "cuda"
    if args.dry_run:
        torch.set_num_threads(1)
    ctx = {"size": size, "device": device, "work": work, "bundle": bundle, "corpus": corpus_of(bundle, size),
           "seconds_left": args.seconds_left, "started": STARTED if started is None else started,
           "table": args.table}
    results = Results(work / f"{name}.json")
    started = time.perf_counter()
    try:
        PARTS[name](ctx, results)
    except BaseException as error:  # reported in the results file, and the part fails
        results.data.update(status="failed", error=f"{type(error).__name__}: {error}",
                            traceback=traceback.format_exc()[-3000:], part_seconds=time.perf_counter() - started)
        results.save()
        traceback.print_exc()
        return 1
    results.data.update(status="ok", part_seconds=time.perf_counter() - started)
    results.save()
    return 0


def run_process(command: list[str], timeout: float, env: dict | None = None, capture: bool = False):
    """(exit code or None when stopped at ``timeout``, captured output, seconds); the whole process group is
    stopped at the limit."""
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True, text=True,
                               stdout=subprocess.PIPE if capture else None,
                               stderr=subprocess.STDOUT if capture else None)
    try:
        output, _ = process.communicate(timeout=max(timeout, 1.0))
        code = process.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        code = None
    return code, output or "", time.perf_counter() - started


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def environment(device: str) -> dict:
    import torch

    env = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
           "platform": platform.platform(),
           "device": torch.cuda.get_device_name() if device == "cuda" else f"CPU ({platform.processor() or 'cpu'})"}
    for package in ("transformers", "tokenizers", "numpy", "numba"):
        with contextlib.suppress(Exception):
            env[package] = __import__(package).__version__
    env["datasets"] = "installed" if importlib.util.find_spec("datasets") else "not installed"
    with contextlib.suppress(Exception):
        env["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                       text=True, timeout=10).stdout.strip() or None
    return env


def run_check(args) -> int:
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device here: run on a GPU machine, or pass --dry-run to check the plumbing", file=sys.stderr)
        return 2
    size = sizes(args.dry_run)
    budget = args.budget or size["budget"]
    bundle = Path(args.bundle)
    parts = [p for p in ORDER if p in (args.parts.split(",") if args.parts else ORDER)]
    if args.skip_tests and "tests" in parts:
        parts.remove("tests")
    out = Path(args.out) if args.out else ROOT / "results" / "gpu_check" / "gpu_check.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    env = environment("cpu" if args.dry_run else "cuda")
    prepared = read_json(bundle / "prepared.json")  # the device machine's copy may have no git history
    if prepared:  # a device machine's copy of .git may be stale, and a kept bundle may be: the report names both
        env["git_commit"] = env.get("commit")
        env["commit"] = env.get("commit") or prepared.get("commit")
        env["prepared"] = prepared
    started = time.perf_counter()
    deadline = started + budget
    outcomes: dict[str, dict] = {}
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    child_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
                 "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "true"}
    if (bundle / "data").is_dir():
        child_env["REPLAYLOADER_DATA"] = str((bundle / "data").resolve())
    if args.dry_run:
        child_env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    print(f"gpu_check: parts {', '.join(parts)}; budget {budget:.0f} s; work {work}", flush=True)
    for name in parts:
        left = deadline - time.perf_counter()
        limit = min(size["limits"][name], left)
        if name == "real":  # leave the fine-tune its time
            limit = min(limit, left - (size["finetune_reserve"] if "finetune" in parts else 0))
        if limit < size["minimum"].get(name, size["minimum"]["any"]):
            outcomes[name] = {"status": f"skipped: {max(left, 0):.0f} s of the {budget:.0f} s budget left"}
            write_report(out, args, env, outcomes, work, time.perf_counter() - started)
            continue
        print(f"\n==== {name} (limit {limit:.0f} s)", flush=True)
        if name == "tests":
            outcomes[name] = run_gpu_tests(limit, lambda text: print(text, flush=True))
        elif args.in_process:  # one process for every part: no time limit, no second import (the CPU test)
            part_started = time.perf_counter()
            run_part(name, argparse.Namespace(work=str(work), bundle=str(bundle), dry_run=args.dry_run,
                                              seconds_left=limit, table=args.table), started=part_started)
            outcomes[name] = {**read_json(work / f"{name}.json"), "seconds": time.perf_counter() - part_started}
        else:
            command = [sys.executable, "-m", "checks.gpu_check", "--part", name, "--work", str(work),
                       "--bundle", str(bundle), "--seconds-left", f"{limit:.1f}", *(["--dry-run"] if args.dry_run else []),
                       *(["--table", args.table] if args.table else [])]
            code, _, seconds = run_process(command, limit, env=child_env)
            result = read_json(work / f"{name}.json")
            status = result.get("status", "no result")
            if code is None:
                status = f"stopped at its limit of {limit:.0f} s (what it measured before is kept)"
            elif code != 0 and status in ("ok", "running", "no result"):  # a crash that wrote no error
                status = f"exit {code}"
            outcomes[name] = {**result, "status": status, "seconds": seconds}
        print(f"==== {name}: {outcomes[name]['status']} ({outcomes[name].get('seconds', 0):.0f} s)", flush=True)
        write_report(out, args, env, outcomes, work, time.perf_counter() - started)
    write_report(out, args, env, outcomes, work, time.perf_counter() - started)
    print(f"wrote {out} ({time.perf_counter() - started:.0f} s)", flush=True)
    if not args.work and not args.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(o["status"] == "ok" or o["status"].startswith("skipped") for o in outcomes.values()) else 1


# ----------------------------------------------------------------------------------------------- report
def fmt(value, spec: str = ".3f", empty: str = "") -> str:
    return empty if value is None else format(value, spec)


def commit_text(env: dict) -> str:
    """The commit the report names: git's, and the bundle's `--prepare` commit when that differs (on a device
    machine git's copy may be stale; here a kept bundle may be)."""
    git, prepared = env.get("git_commit"), env.get("prepared", {}).get("commit")
    if git and prepared and git != prepared:
        return f"{prepared} by the bundle's prepared.json (git here says {git}; the tree is the prepared one " \
               "unless it changed after --prepare)"
    return str(env.get("commit"))


def write_report(out: Path, args, env: dict, outcomes: dict, work: Path, seconds: float) -> None:
    """The report and every number (gpu_check.json beside it), rewritten after each part."""
    out.write_text(report(args, env, outcomes, seconds))
    (out.parent / "gpu_check.json").write_text(json.dumps({"environment": env, "parts": outcomes,
                                                           "seconds": seconds}, indent=1, default=str))


def report(args, env: dict, outcomes: dict, seconds: float) -> str:
    dry = args.dry_run
    lines = [f"# GPU check{' (dry run on the CPU: plumbing only, not a measurement)' if dry else ''}", "",
             f"Command: `bash checks/gpu_check.sh` (after `python -m checks.gpu_check --prepare` here), which ran "
             f"`python -m checks.gpu_check {getattr(args, 'argv_text', '')}`, at commit " + commit_text(env)
             + (f" with {env['prepared']['uncommitted_changes']} uncommitted change(s) when prepared"
                if env.get("prepared", {}).get("uncommitted_changes") else "") + "  ",
             f"Date: {env['date']}  ",
             f"Machine: {env['device']}; torch {env['torch']}, CUDA {env['cuda']}, Python {env['python']}, "
             f"transformers {env.get('transformers')}, tokenizers {env.get('tokenizers')}, `datasets` "
             f"{env['datasets']} (the parts run with it blocked), {env['platform']}  ",
             f"Wall time: {seconds:.0f} s", "", "| part | status | seconds |", "|---|---|---|"]
    for name, outcome in outcomes.items():
        status = outcome["status"] + (f": {outcome['error']}" if outcome.get("error") else "")
        lines.append(f"| {name} | {status.replace('|', '/')} | {fmt(outcome.get('seconds'), '.0f')} |")
    lines.append("")
    for name, render in (("nccl", report_nccl), ("speed", report_speed), ("syncs", report_syncs),
                         ("real", report_real), ("finetune", report_finetune), ("logging", report_logging),
                         ("tests", report_tests), ("buffer", report_buffer)):
        if name in outcomes:
            try:
                lines += render(outcomes[name], dry)
            except Exception as error:  # a half-written part must not cost the report
                lines += [f"({name}: could not render: {type(error).__name__}: {error})", ""]
            if outcomes[name].get("traceback"):
                lines += ["```", outcomes[name]["traceback"].strip()[-1500:], "```", ""]
    return "\n".join(lines)


def report_nccl(o: dict, dry: bool) -> list[str]:
    if "backend" not in o:
        return []
    return ["## NCCL: `session(\"nccl\")`, world size 1, one `DistributedPrioritizedSampler` step", "",
            f"Backend {o['backend']}, world size {o['world_size']}; N = {o['N']:,}, K = {o['K']}; "
            f"{o['gathers']} feedback gather(s), {o['weights_changed']} weights changed; draws and probabilities "
            f"equal to a plain `PrioritizedSampler`'s: {o['same_as_plain_sampler']}; group closed after the "
            f"session: {not o.get('initialised_after', True)}; {o['seconds']:.1f} s.", ""]


def report_speed(o: dict, dry: bool) -> list[str]:
    out = []
    if o.get("table"):
        out += ["## (a) Seconds per step, the paper's Table 2 setting (ELECTRA-Small, batch 128, seq 128, bf16)", "",
                "Wall time between logged steps (each logged step reads its values off the device, so the time "
                "between two covers every step between them), after the warm-up steps.", "",
                "| variant | s/step | ratio to electra | paper ratio | tokens/s | peak memory GiB | steps timed |",
                "|---|---|---|---|---|---|---|"]
        for row in o["table"]:
            if "error" in row:
                out.append(f"| {row['variant']} | failed: {row['error'][:200].replace('|', '/')} | | | | | |")
                continue
            out.append(f"| {row['variant']} | {row['seconds_per_step']:.4f} | {fmt(row.get('ratio'))} | "
                       f"{fmt(row.get('paper'))} | {row['tokens_per_second']:,.0f} | "
                       f"{fmt(row['peak_memory_gib'], '.2f', 'n/a')} | {row['steps_timed']} |")
        out.append("")
    ref = o.get("reference")
    ours = next((row for row in o.get("table") or [] if row["variant"] == "electra" and "error" not in row), None)
    pairs = o.get("reference_pairs") or []
    if ref and ours:
        ratio = ours["tokens_per_second"] / ref["tokens_per_second"]
        out += ["Reference loop (plain HF `ElectraForMaskedLM` + `ElectraForPreTraining` step, same configs, batches, "
                f"autocast): {ref['seconds_per_step']:.4f} s/step, {ref['tokens_per_second']:,.0f} tokens/s, peak "
                f"{fmt(ref['peak_memory_gib'], '.2f', 'n/a')} GiB. The project's electra: "
                f"{ours['tokens_per_second']:,.0f} tokens/s, {ratio:.2f}x the reference in this first pair."]
        if pairs:  # electra's tokens/s over the reference's = the reference's seconds over electra's
            ratios = [pair["reference"] / pair["electra"] for pair in pairs]
            median = statistics.median(ratios)
            out.append(f"Over {len(pairs)} electra / reference pair(s) timed in turn: "
                       + ", ".join(f"{r:.2f}x" for r in ratios) + f"; median {median:.2f}x "
                       f"({'at least as fast' if median >= 1 else 'SLOWER than the reference'}).")
        out.append("")
    return out


def report_syncs(o: dict, dry: bool) -> list[str]:
    if not o.get("runs"):
        return []
    out = ["## (c) Host synchronisations per step at steady state", "",
           f"Counted by: {o.get('mode')}; over {o['runs'][0].get('steps', '?')} steps after the warm-up, logging off "
           "(`--log-every` past the run), each sync attributed to the line that caused it. The goal is 0 in the "
           "library (replayloader/: the buffer's add, sample and feedback).", "",
           "| run | syncs/step | library | integration | transformers | other | where (count) |",
           "|---|---|---|---|---|---|---|"]
    for run in o["runs"]:
        if "error" in run:
            out.append(f"| {run['run']} | failed: {run['error'][:200].replace('|', '/')} | | | | | |")
            continue
        where = ", ".join(f"`{k}` ({v})" for k, v in list((run.get("where") or {}).items())[:6])
        by = run.get("per_step_by_source") or {}
        out.append(f"| {run['run']} | {fmt(run.get('per_step'), '.2f')} | "
                   + " | ".join(fmt(by.get(label), ".2f") for _, label in SYNC_SOURCES) + f" | {where or '-'} |")
    messages = sorted({m for run in o["runs"] for m in run.get("messages") or []})
    if messages:
        out += ["", "Messages: " + "; ".join(f"`{m}`" for m in messages)]
    return out + [""]


def report_real(o: dict, dry: bool) -> list[str]:
    runs = o.get("runs") or []
    out = ["## Short real run: ELECTRA and TMR (loss_diff), `small` preset", "",
           f"Corpus: {o.get('corpus')} (first {o.get('trained_lines'):,} lines; the held-out text is the lines after). "
           f"{o.get('steps')} steps each (sized to about {o.get('target_seconds', 0):.0f} s from the electra step of "
           f"{'(a)' if o.get('electra_seconds_per_step_from_speed') else 'the reference run'}), `--defer-feedback --log-every {LOG_EVERY} --amp {o.get('amp')}`. Held-out set: {o.get('heldout_examples')} "
           f"examples corrupted once by the generator of a {o.get('reference_steps')}-step reference ELECTRA run. "
           "A smoke test of the full path, not a verdict.", ""]
    out += [f"Run {run['variant']} failed: {run['error']}" for run in runs if "error" in run]
    runs = [run for run in runs if "error" not in run]
    if not runs:
        return out
    by = {run["variant"]: run for run in runs}
    out += ["| variant | steps | training s | wall s | final loss |", "|---|---|---|---|---|"]
    for run in runs:
        out.append(f"| {run['variant']} | {run['steps']} | {run['training_seconds']:.1f} | {run['wall_seconds']:.1f} | "
                   f"{fmt(run.get('final_loss'), '.3f')} |")
    out.append("")
    if len(by) == 2:
        e, t = by["electra"]["points"], by["tmr-loss_diff"]["points"]
        out += ["Held-out AUC at matched steps:", "", "| step | electra | tmr-loss_diff |", "|---|---|---|"]
        tmr_at = {p["step"]: p for p in t}
        for p in e:
            q = tmr_at.get(p["step"])
            out.append(f"| {p['step']} | {fmt(p['auc'], '.4f')} | {fmt(q and q['auc'], '.4f')} |")
        end = min(by["electra"]["training_seconds"], by["tmr-loss_diff"]["training_seconds"])
        marks = [end * f for f in (0.25, 0.5, 0.75, 1.0)]
        out += ["", "Held-out AUC at matched training wall time (from the first step's start, held-out scoring "
                "excluded; linear between scoring points):", "", "| seconds | electra | tmr-loss_diff |", "|---|---|---|"]
        for mark in marks:
            out.append(f"| {mark:.1f} | {fmt(auc_at(e, mark), '.4f', '-')} | {fmt(auc_at(t, mark), '.4f', '-')} |")
        out.append("")
    return out


def report_finetune(o: dict, dry: bool) -> list[str]:
    if not o.get("rows"):
        return []
    out = ["## SST-2 fine-tune from each checkpoint (one seed)", "",
           "| checkpoint | dev accuracy | train examples | steps | train s | epochs | batch | lr |",
           "|---|---|---|---|---|---|---|---|"]
    for row in o["rows"]:
        out.append(f"| {row['checkpoint']} | {fmt(row.get('accuracy'), '.4f')} | {row.get('train_examples')} | "
                   f"{row.get('train_steps')} | {fmt(row.get('train_seconds'), '.1f')} | {row.get('epochs')} | "
                   f"{row.get('batch_size')} | {row.get('learning_rate')} |")
    return out + [""]


def report_logging(o: dict, dry: bool) -> list[str]:
    if not o.get("rows"):
        return []
    out = ["## (d) What logging every step costs (tmr-loss_diff; wall-time difference of a short and a long run, "
           f"{o['rows'][0]['steps_timed']} steps apart)", "", "| feedback, logging | s/step | ratio to synchronous, "
           "every step |", "|---|---|---|"]
    for row in o["rows"]:
        out.append(f"| {row['run']} | {row['seconds_per_step']:.4f} | {fmt(row.get('ratio'))} |")
    return out + [""]


def report_tests(o: dict, dry: bool) -> list[str]:
    return ["## tests/gpu", "", "```", o.get("summary", "").strip(), "```", ""] if o.get("summary") else []


def report_buffer(o: dict, dry: bool) -> list[str]:
    if not o.get("rows"):
        return []
    out = ["## (b) Buffer operations, storage on the device (median µs)", "",
           "| N | K | add | sample | update (incl. feedback copy) |", "|---|---|---|---|---|"]
    for row in o["rows"]:
        out.append(f"| {row['N']:,} | {row['K']} | {row['add_us']:.0f} | {row['sample_us']:.0f} | "
                   f"{row['update_us']:.0f} |")
    return out + [""]


# ----------------------------------------------------------------------------------------------- prepare
def traveling_files() -> list[Path]:
    """What the device call sends besides carried paths: tracked files and untracked files git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    return [ROOT / name for name in listed if name and (ROOT / name).is_file()]


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def toy_sst2(folder: Path) -> None:
    """A small made-up SST-2 in the official layout, for a dry run where no data directory exists."""
    import random

    rng = random.Random(0)
    words = {1: "good great fine nice".split(), 0: "bad awful poor sad".split()}
    filler = "the movie film plot was very quite and".split()
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train.tsv", 200), ("dev.tsv", 60)):
        rows = ["sentence\tlabel"]
        for _ in range(n):
            label = rng.randint(0, 1)
            rows.append(" ".join(rng.sample(filler, 4) + [rng.choice(words[label])]) + f"\t{label}")
        (folder / name).write_text("\n".join(rows) + "\n")


def prepare(args) -> int:
    """Fill the bundle from the data directory (SST-2 train/dev, the two Wikipedia train-article files), then
    print the size of everything that travels and check it against the limit."""
    bundle = Path(args.bundle)
    source = Path(args.data_dir or os.environ.get("REPLAYLOADER_DATA") or "")
    have_data = bool(args.data_dir or os.environ.get("REPLAYLOADER_DATA")) and source.is_dir()
    if not have_data and not args.dry_run:
        print("--prepare needs the data directory (GLUE and wikipedia-squad): pass --data-dir DIR or set "
              "$REPLAYLOADER_DATA", file=sys.stderr)
        return 2
    shutil.rmtree(bundle / "data", ignore_errors=True)
    (bundle / "data").mkdir(parents=True, exist_ok=True)
    if have_data:
        missing = [str(source / "glue" / "SST-2" / f) for f in SST2_FILES if not (source / "glue" / "SST-2" / f).is_file()]
        if missing:
            print(f"missing: {', '.join(missing)}", file=sys.stderr)
            return 2
        (bundle / "data" / "glue" / "SST-2").mkdir(parents=True)
        for name in SST2_FILES:
            shutil.copyfile(source / "glue" / "SST-2" / name, bundle / "data" / "glue" / "SST-2" / name)
        wiki = [source / "wikipedia-squad" / name for name in WIKI_FILES]
        if all(path.is_file() for path in wiki):
            (bundle / "data" / "wikipedia-squad").mkdir(parents=True)
            for path in wiki:
                shutil.copyfile(path, bundle / "data" / "wikipedia-squad" / path.name)
        else:
            print("note: no wikipedia-squad train articles there; the runs pretrain on python-docs", flush=True)
    else:
        toy_sst2(bundle / "data" / "glue" / "SST-2")
        print("dry run without a data directory: a made-up SST-2; the runs pretrain on python-docs", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                             text=True).stdout.splitlines()
    (bundle / "prepared.json").write_text(json.dumps({
        "commit": commit.stdout.strip(), "uncommitted_changes": len(changed),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "data": "made-up SST-2 (dry run)" if not have_data else "SST-2 and wikipedia-squad from the data directory"},
        indent=1))
    code = sum(path.stat().st_size for path in traveling_files())
    data = folder_bytes(bundle)
    wheels = folder_bytes(ROOT / ".whl") if (ROOT / ".whl").is_dir() else 0
    total = code + data + wheels
    print("What travels to the device machine:")
    for label, value in (("code (tracked + untracked, not ignored)", code), (f"data ({bundle.name}/, carried)", data),
                         ("wheels (none needed: no `datasets`)", wheels), ("total", total)):
        print(f"  {label:<45} {value / 2 ** 20:8.2f} MiB")
    for path in sorted(p for p in bundle.rglob("*") if p.is_file()):
        print(f"    {path.relative_to(bundle)}  {path.stat().st_size / 2 ** 20:.2f} MiB")
    ok = total < LIMIT_BYTES
    print(f"  limit {LIMIT_BYTES / 2 ** 20:.0f} MiB: {'OK' if ok else 'TOO LARGE'}")
    return 0 if ok else 1


# ----------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepare", action="store_true", help="fill the bundle from the data directory and print "
                                                               "the size of what travels (run here, before the device)")
    parser.add_argument("--data-dir", default=None, help="--prepare: the data directory (default $REPLAYLOADER_DATA)")
    parser.add_argument("--bundle", default=str(BUNDLE), help="the carried folder (default .gpu_bundle)")
    parser.add_argument("--dry-run", action="store_true", help="toy sizes on the CPU: checks the plumbing only")
    parser.add_argument("--out", default=None, help="markdown report (default results/gpu_check/gpu_check.md); gpu_check.json "
                                                    "beside it")
    parser.add_argument("--parts", default=None, help=f"comma-separated, from {','.join(ORDER)} (default: all, "
                                                      "while the budget lasts)")
    parser.add_argument("--budget", type=float, default=None, help="seconds for the whole check (GPU 480, dry 600)")
    parser.add_argument("--skip-tests", action="store_true", help="do not run tests/gpu")
    parser.add_argument("--table", default=None,
                        help="speed: comma-separated rows of the runtime table to time (electra always; default all: "
                             + ",".join(table_label(v, e).replace(" ", "_") for v, e in TABLE_RUNS) + ")")
    parser.add_argument("--work", default=None, help="working folder (default: a temporary one, removed)")
    parser.add_argument("--keep-work", action="store_true", help="keep the temporary working folder")
    parser.add_argument("--in-process", action="store_true", help="run every part in this process, without time "
                                                                   "limits (saves an import per part: the CPU test)")
    parser.add_argument("--part", default=None, choices=sorted(PARTS), help=argparse.SUPPRESS)
    parser.add_argument("--seconds-left", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv_text = " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    if args.prepare:
        return prepare(args)
    table_runs(args.table)  # a bad --table fails here, before any part runs
    if args.part:
        return run_part(args.part, args)
    return run_check(args)


if __name__ == "__main__":
    sys.exit(main())

"""Compact, committed records of the phase-2 runs (results/reproduce_tmr/): what every table is computed from.

A run directory under ``runs/`` holds checkpoints and a 5,000-line metrics log (~5 MB) and is not committed.
When a run finishes, `export_finished` writes its compact record, gzip JSONL (deterministic bytes: re-exporting
an unchanged run changes nothing in git), one file per run:

- ``pretrain/ARM-seedS.jsonl.gz``: a ``run`` line (config, summary, window size), a ``timing`` line (every
  step's seconds and producer seconds, 0.1 ms resolution), one ``heldout`` line per held-out scoring (AUC, L_D,
  base-rate entropy, scoring seconds) and one ``window`` line per ``WINDOW`` steps (the mean and the count of
  every logged number over those steps, so any mean over whole windows is exact);
- ``finetune/ARM-seedS-atSTEP.jsonl.gz``: the fine-tuning job's per-run rows (task, seed, metrics);
- ``heldout.safetensors.gz`` and ``heldout.json``: the shared held-out set (the reference generator's corruption of
  python-docs' last lines) and how it was made;
- ``discriminators/ARM-seedS/``: the final discriminator of each confirmatory main-pair run (`KEPT_DISCRIMINATORS`),
  which its GLUE fine-tuning needs on any machine (weights and tokenizer gzipped).

`load_runs` and `load_finetuning` read them back for experiments/reproduce_tmr_summary.py.
"""
from __future__ import annotations

import gzip
import json
import math
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from replayloader_electra.pretrain.metrics import read_metrics

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results" / "reproduce_tmr"
WINDOW = 50  # steps per logged window; every window the summary uses (25/50/100%, the last 500) is a multiple
HELDOUT_KEYS = ("heldout_auc", "heldout_loss", "heldout_base_entropy", "heldout_seconds")
TIMING_KEYS = ("step_seconds", "produce_seconds")
HELDOUT_FILES = ("heldout.safetensors.gz", "heldout.json")  # committed: the shared test set and how it was made
# committed discriminators: the confirmatory main pair's (issue 31), whose 5,000-step checkpoints are fine-tuned
KEPT_DISCRIMINATORS = {f"{arm}-seed{seed}" for arm in ("electra", "tmr-loss_diff") for seed in range(5, 15)}
DISCRIMINATOR_FILES = {"config.json": False, "tokenizer_config.json": False, "model.safetensors": True,
                       "tokenizer.json": True}  # name -> gzipped


def write_jsonl_gz(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows).encode()
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(gzip.compress(text, compresslevel=9, mtime=0))
    tmp.replace(path)


def read_jsonl_gz(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def weight_ess_fraction(record: dict) -> float | None:
    """1 / (1 + CV²) of the buffer's weights: the share of the buffer that P ∝ w effectively draws from."""
    std, mean = record.get("buffer_weight_std"), record.get("buffer_weight_mean")
    return None if std is None or not mean else 1.0 / (1.0 + (std / mean) ** 2)


def compact_pretrain(run_dir: Path) -> list[dict]:
    """The compact record of a finished pretraining run directory (metrics.jsonl, config.json, summary.json)."""
    records = read_metrics(run_dir / "metrics.jsonl")  # a torn last line (a killed run) is dropped
    for r in records:
        r["weight_ess_fraction"] = weight_ess_fraction(r)
    arm, seed = run_dir.name.rsplit("-seed", 1) if "-seed" in run_dir.name else (run_dir.name, "-1")
    rows = [{"record": "run", "name": run_dir.name, "arm": arm, "seed": int(seed), "window": WINDOW,
             "config": json.loads((run_dir / "config.json").read_text()),
             "summary": json.loads((run_dir / "summary.json").read_text())},
            {"record": "timing", **{key: [round(r[key], 4) for r in records] for key in TIMING_KEYS}}]
    rows += [{"record": "heldout", "step": r["step"], **{k: r.get(k) for k in HELDOUT_KEYS}}
             for r in records if r.get("heldout_auc") is not None]
    skip = {"step", *HELDOUT_KEYS, *TIMING_KEYS}
    for first in range(1, records[-1]["step"] + 1, WINDOW):
        rows_in = [r for r in records if first <= r["step"] < first + WINDOW]
        keys = sorted({k for r in rows_in for k in r if k not in skip})
        values = {k: [float(r[k]) for r in rows_in if _finite(r.get(k))] for k in keys}
        rows.append({"record": "window", "first": first, "last": rows_in[-1]["step"],
                     "mean": {k: float(np.mean(v)) for k, v in values.items() if v},
                     "count": {k: len(v) for k, v in values.items() if v}})
    return rows


@dataclass
class RunData:
    """One pretraining run's compact record, with the views the summary needs."""

    name: str
    arm: str
    seed: int
    header: dict
    step_seconds: np.ndarray
    produce_seconds: np.ndarray
    heldout: list[dict] = field(default_factory=list)  # by step
    windows: list[dict] = field(default_factory=list)  # by first step

    @classmethod
    def from_rows(cls, rows: list[dict]) -> RunData:
        kinds: dict[str, list[dict]] = {}
        for row in rows:
            kinds.setdefault(row["record"], []).append(row)
        [header], [timing] = kinds["run"], kinds["timing"]
        return cls(header["name"], header["arm"], header["seed"], header,
                   np.asarray(timing["step_seconds"], float), np.asarray(timing["produce_seconds"], float),
                   sorted(kinds.get("heldout", []), key=lambda r: r["step"]),
                   sorted(kinds.get("window", []), key=lambda r: r["first"]))

    def heldout_curve(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        points = [(r["step"], r[key]) for r in self.heldout if r.get(key) is not None]
        return np.asarray([s for s, _ in points]), np.asarray([v for _, v in points], float)

    def heldout_at(self, key: str, step: int) -> float:
        return next((r[key] for r in self.heldout if r["step"] == step and r.get(key) is not None), float("nan"))

    def window_mean(self, key: str, first: int, last: int) -> float:
        """Mean of ``key`` over steps first..last (whole windows only, so the mean is exact)."""
        if (first - 1) % WINDOW or last % WINDOW:
            raise ValueError(f"steps {first}..{last} are not whole windows of {WINDOW} steps")
        inside = [w for w in self.windows if first <= w["first"] and w["last"] <= last and key in w["count"]]
        total = sum(w["count"][key] for w in inside)
        return sum(w["mean"][key] * w["count"][key] for w in inside) / total if total else float("nan")

    @property
    def wall_seconds(self) -> float:
        """Training steps plus held-out scoring passes (0 for runs logged before scoring was timed)."""
        scoring = sum(r.get("heldout_seconds") or 0.0 for r in self.heldout)
        return float(self.step_seconds.sum() + scoring)


def iter_records(folder: Path, pattern: str) -> Iterator[tuple[Path, list[dict]]]:
    for path in sorted(folder.glob(pattern)):
        yield path, read_jsonl_gz(path)


def load_runs(results: Path = RESULTS) -> dict[str, dict[int, RunData]]:
    """arm -> seed -> compact run record, for every committed arm run (the reference run is not an arm)."""
    runs: dict[str, dict[int, RunData]] = {}
    for _, rows in iter_records(results / "pretrain", "*-seed*.jsonl.gz"):
        run = RunData.from_rows(rows)
        runs.setdefault(run.arm, {})[run.seed] = run
    return runs


def load_finetuning(results: Path = RESULTS) -> dict[tuple[str, int], dict[int, list[dict]]]:
    """(arm, step) -> pretraining seed -> the fine-tuning rows (one per task and fine-tuning seed)."""
    jobs: dict[tuple[str, int], dict[int, list[dict]]] = {}
    for path, rows in iter_records(results / "finetune", "*-seed*-at*.jsonl.gz"):
        run, step = path.name[:-len(".jsonl.gz")].rsplit("-at", 1)
        arm, seed = run.rsplit("-seed", 1)
        jobs.setdefault((arm, int(step)), {})[int(seed)] = rows
    return jobs


def _stale(target: Path, *sources: Path) -> bool:
    return not target.exists() or any(s.stat().st_mtime > target.stat().st_mtime for s in sources)


def export_finished(out: Path, results: Path = RESULTS) -> list[Path]:
    """Write the compact record of every finished run and fine-tuning job under ``out`` that has none yet (or a
    stale one). Returns the files written."""
    written = []
    for run_dir in sorted((out / "pretrain").glob("*")):
        target = results / "pretrain" / f"{run_dir.name}.jsonl.gz"
        if (run_dir / "summary.json").exists() and _stale(target, run_dir / "summary.json"):
            write_jsonl_gz(target, compact_pretrain(run_dir))
            written.append(target)
    for job_dir in sorted((out / "finetune").glob("*-seed*-at*")):
        target = results / "finetune" / f"{job_dir.name}.jsonl.gz"
        rows_file = job_dir / "results_runs.jsonl"
        if (job_dir / "results.md").exists() and _stale(target, rows_file):
            write_jsonl_gz(target, [json.loads(line) for line in rows_file.read_text().splitlines() if line])
            written.append(target)
    for run_dir in sorted((out / "pretrain").glob("*")):
        if run_dir.name in KEPT_DISCRIMINATORS and (run_dir / "summary.json").exists():
            written += export_discriminator(run_dir / "discriminator", results / "discriminators" / run_dir.name)
    # the shared test set (gzip: 1.2 MB -> 0.14 MB), so later runs on any machine score the same tokens
    heldout, committed = out / "heldout.safetensors", results / HELDOUT_FILES[0]
    if heldout.exists() and _stale(committed, heldout):
        results.mkdir(parents=True, exist_ok=True)
        committed.write_bytes(gzip.compress(heldout.read_bytes(), compresslevel=9, mtime=0))
        written.append(committed)
    made, committed = out / HELDOUT_FILES[1], results / HELDOUT_FILES[1]
    if made.exists() and _stale(committed, made):
        shutil.copyfile(made, committed)
        written.append(committed)
    return written


def export_discriminator(source: Path, target: Path) -> list[Path]:
    """Copy a run's exported discriminator into ``target`` once (weights and tokenizer gzipped, deterministic
    bytes); a folder already there is left as it is. Returns the files written."""
    if target.exists():
        return []
    written = []
    target.mkdir(parents=True)
    for name, zipped in DISCRIMINATOR_FILES.items():
        data = (source / name).read_bytes()
        path = target / (name + ".gz" if zipped else name)
        path.write_bytes(gzip.compress(data, compresslevel=9, mtime=0) if zipped else data)
        written.append(path)
    return written


def restore_heldout(out: Path, results: Path = RESULTS) -> bool:
    """Unpack the committed held-out set into ``out`` (a fresh machine then needs no reference run); True if ``out``
    has one afterwards."""
    target = out / "heldout.safetensors"
    if not target.exists() and all((results / name).exists() for name in HELDOUT_FILES):
        out.mkdir(parents=True, exist_ok=True)
        with gzip.open(results / HELDOUT_FILES[0], "rb") as packed:
            target.write_bytes(packed.read())
        shutil.copyfile(results / HELDOUT_FILES[1], out / HELDOUT_FILES[1])
    return target.exists()

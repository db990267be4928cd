"""Checkpoints that continue a run exactly, written so that no kill or full disk can cost the last good one.

A checkpoint is a directory ``step-XXXXXXXX/`` holding, once, ``tensors.safetensors`` (parameters, optimizer
moments) and ``state.json`` (config, optimizer settings, the number of ranks, and the manifest), and per rank
``rank-RRRRR.safetensors`` + ``rank-RRRRR.json``: that rank's loader (replay buffer and data position) and its
Python, NumPy and torch generator states. No pickle. Resuming needs the same number of ranks.

The contract:

- **Atomic.** Rank 0 builds the directory under a temporary name (`replayloader.atomic.atomic_directory`), every
  rank writes its files there, rank 0 writes ``state.json`` last, fsyncs every file and renames the directory
  into place. A kill at any instant leaves the previous checkpoints untouched and the new one complete or
  absent. A write that fails (a full disk) removes the partial directory on every rank and raises
  `CheckpointNotWritten`, naming the previous checkpoint, which is intact.
- **Verified.** ``state.json`` carries a manifest: the step, preset, variant, number of ranks, the sha256 of
  every other file and of the rest of ``state.json`` itself. `verify_checkpoint` checks all of it (and that the
  directory's name, the state and every rank file agree on the step) before anything is loaded.
- **Resume picks the newest checkpoint that verifies** (`choose_checkpoint`) and says in one line which one and
  why newer ones were skipped; a run directory with no checkpoint that verifies is an error naming the files.
- **The schedule is a function of the run's options and the step** (see `loop.learning_rate_schedule`), so a
  resumed run with more ``--steps`` continues on the schedule of the new total.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file as load_numpy_file
from safetensors.numpy import save_file as save_numpy_file
from safetensors.torch import load_file as load_torch_file
from safetensors.torch import save_file as save_torch_file

from replayloader.distributed import ReplayShard
from replayloader.state import (StateFileError, atomic_directory, atomic_write_text, flatten_state, is_temporary,
                                sha256_bytes, sha256_file, unflatten_state)

from ..errors import UserError
from .distributed import World

CHECKPOINT_FORMAT = 4  # 4: a manifest of digests in state.json, the step in every rank file
STATE_FILE, TENSORS_FILE = "state.json", "tensors.safetensors"
_STEP_DIR = re.compile(r"step-(\d+)")


class CheckpointNotWritten(UserError):
    """A checkpoint could not be written (e.g. a full disk); the run stops, the earlier checkpoints are intact."""

    def __init__(self, step: int, directory: Path, error: BaseException | str) -> None:
        previous = newest_step_dir(directory, below=step)
        kept = (f"the previous checkpoint {previous} is intact" if previous is not None
                else "there is no earlier checkpoint")
        super().__init__(f"the checkpoint at step {step} was not written ({error}); {kept}; the run stops here")


# ----------------------------------------------------------------------------- saving
def save_checkpoint(directory: Path, step: int, config: Any, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, scheduler: Any, loader_state: dict,
                    world: World | None = None) -> Path:
    """Write ``directory/step-XXXXXXXX/`` atomically and return it; every rank calls this.

    Every rank takes the same collective steps whatever fails, so a full disk on one rank is reported on all
    (`CheckpointNotWritten`) instead of leaving the others waiting.
    """
    world = world or World()
    final = directory / f"step-{step:08d}"
    problem: Exception | str | None = None
    with contextlib.ExitStack() as staging:
        tmp = None
        if world.is_main:
            try:
                directory.mkdir(parents=True, exist_ok=True)
                tmp = str(staging.enter_context(atomic_directory(final)))
            except OSError as error:
                problem = error
        tmp = world.share(tmp)
        if tmp is None:
            problem = problem or "rank 0 could not create the checkpoint directory"
        else:
            problem = _attempt(_save_rank_state, Path(tmp), world.shard,
                               {"step": step, "loader": loader_state, "rng": _capture_rng()})
        everyone_wrote = world.all_agree(problem is None)
        if world.is_main and tmp is not None:
            if everyone_wrote:
                problem = _attempt(_save_shared_files, Path(tmp), step, config, model, optimizer, scheduler,
                                   world.size)
            if everyone_wrote and problem is None:
                problem = _attempt(staging.close)  # fsync every file, rename the directory into place
        if not world.all_agree(problem is None):
            # raised inside the stack: rank 0's partial directory is removed on the way out
            raise CheckpointNotWritten(step, directory, problem or "another rank could not write its files")
    return final


def _attempt(write, *args) -> Exception | None:
    """Run one write; an I/O error (full disk, permissions) is returned for the collective decision. safetensors
    reports one as a `SafetensorError` ("I/O error: No space left on device"), not as an `OSError`."""
    try:
        write(*args)
    except (OSError, SafetensorError) as error:
        return error
    return None


def _save_shared_files(path: Path, step: int, config: Any, model: torch.nn.Module,
                       optimizer: torch.optim.Optimizer, scheduler: Any, ranks: int) -> None:
    """Rank 0's part: parameters and optimizer moments, then state.json with the manifest of every file."""
    tensors = {f"model/{name}": p.detach().cpu().contiguous() for name, p in model.named_parameters()}
    optimizer_state = optimizer.state_dict()
    for index, state in optimizer_state["state"].items():
        for key, value in state.items():
            tensors[f"optimizer/{index}/{key}"] = value.detach().cpu().contiguous()
    save_torch_file(tensors, str(path / TENSORS_FILE))
    state = {
        "format": CHECKPOINT_FORMAT, "step": step, "config": config.to_json(), "world_size": ranks,
        "optimizer": {"param_groups": optimizer_state["param_groups"],
                      "state_keys": {str(i): sorted(s) for i, s in optimizer_state["state"].items()}},
        "scheduler": scheduler.state_dict(),
    }
    write_state(path, state)


def write_state(path: Path, state: dict) -> None:
    """Write ``path/state.json``: ``state`` plus the manifest of every file already in ``path``."""
    config = state["config"]
    state = dict(state, manifest={
        "step": state["step"], "preset": config["preset"], "variant": config["variant"],
        "world_size": state["world_size"], "state_sha256": _state_digest(state),
        "files": {f.name: sha256_file(f) for f in sorted(path.iterdir()) if f.is_file() and f.name != STATE_FILE},
    })
    atomic_write_text(path / STATE_FILE, json.dumps(state))  # `upgrade` rewrites it in a checkpoint in place


def _state_digest(state: dict) -> str:
    body = {k: v for k, v in state.items() if k != "manifest"}
    return sha256_bytes(json.dumps(body, sort_keys=True).encode("utf-8"))


# ----------------------------------------------------------------------------- verifying and choosing
def verify_checkpoint(path: Path) -> dict:
    """The checkpoint's state when every check passes, else `StateFileError` naming the file and the problem.

    Checked: state.json parses and is of this format; its manifest is present and matches the rest of
    state.json; the step agrees between the manifest, the state, the directory's name and every rank file;
    every file the manifest lists (the tensors and each rank's pair) exists, has the recorded sha256 and parses.
    """
    path = Path(path)
    state_file = path / STATE_FILE
    if not path.is_dir():
        raise StateFileError(path, "not a directory")
    if not state_file.is_file():
        raise StateFileError(state_file, "missing" if any(path.iterdir()) else
                             "missing (the checkpoint directory is empty)")
    state = _read_json(state_file)
    if not isinstance(state, dict):
        raise StateFileError(state_file, "is not a JSON object")
    if state.get("format") == 3:
        raise StateFileError(state_file, "is format 3, written before checkpoints carried a manifest of digests: "
                                         f"run `electra_tmr.py upgrade-checkpoint --checkpoint {path}` (or its run "
                                         "directory) once to check it and add one")
    if state.get("format") != CHECKPOINT_FORMAT:
        raise StateFileError(state_file, f"format {state.get('format')!r} is not supported (this version reads "
                                         f"format {CHECKPOINT_FORMAT}, whose manifest lets it verify every file)")
    manifest = state.get("manifest")
    needed = ("step", "preset", "variant", "world_size", "state_sha256", "files")
    if not isinstance(manifest, dict) or any(k not in manifest for k in needed):
        raise StateFileError(state_file, "has no complete manifest")
    if manifest["state_sha256"] != _state_digest(state):
        raise StateFileError(state_file, "was changed after it was written (its content does not match the "
                                         "digest in its manifest)")
    step = manifest["step"]
    named = _STEP_DIR.fullmatch(path.name)
    if state.get("step") != step or (named and int(named.group(1)) != step):
        raise StateFileError(state_file, f"says step {state.get('step')!r} (manifest: {step!r}) but lies in "
                                         f"{path.name}")
    files = manifest["files"]
    ranks = manifest["world_size"]
    expected = [TENSORS_FILE] + [f.name for rank in range(int(ranks))
                                 for f in _rank_files(path, ReplayShard(rank, int(ranks)))]
    for name in expected:
        if name not in files:
            raise StateFileError(state_file, f"its manifest does not list {name}")
    for name, digest in sorted(files.items()):
        file = path / name
        if not file.is_file():
            raise StateFileError(file, "missing")
        if sha256_file(file) != digest:
            raise StateFileError(file, f"damaged: its sha256 does not match the manifest "
                                       f"({file.stat().st_size} bytes, truncated or changed)")
    for name in expected:
        if name.endswith(".safetensors"):
            _check_safetensors(path / name)
        elif _read_json(path / name).get("step") != step:
            raise StateFileError(path / name, f"belongs to another step than {step}")
    return state


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise StateFileError(path, f"is not valid JSON ({error})") from None


def _check_safetensors(path: Path) -> None:
    try:
        with safe_open(str(path), framework="np") as handle:
            handle.keys()
    except (SafetensorError, OSError, ValueError) as error:
        raise StateFileError(path, f"is not a readable safetensors file ({error})") from None


class Skipped(NamedTuple):
    """A newer checkpoint that did not verify: the file at fault and its problem (plain data, so that rank 0's
    choice can be sent to the other ranks; `StateFileError` itself does not survive pickling)."""

    path: str
    problem: str


@dataclass
class Checkpoint:
    """A checkpoint that verified, and the newer ones that did not."""

    path: Path
    state: dict
    skipped: list[Skipped] = field(default_factory=list)

    @property
    def step(self) -> int:
        return int(self.state["step"])

    @property
    def run_dir(self) -> Path:
        """The run the checkpoint belongs to: the folder holding ``checkpoints/`` (else the step's own parent)."""
        parent = self.path.parent
        return parent.parent if parent.name == "checkpoints" else parent

    def describe(self) -> str:
        """One line: which checkpoint a run resumed from and, for each newer one skipped, the file and problem."""
        line = f"resumed from step {self.step} of {self.run_dir} ({self.path.name})"
        if self.skipped:
            line += "; skipped newer: " + "; ".join(f"{e.path}: {e.problem}" for e in self.skipped)
        return line


def step_dirs(directory: Path) -> list[Path]:
    """The ``step-N`` directories under ``directory``, newest first (temporaries of a save are not listed)."""
    found = [p for p in directory.glob("step-*") if p.is_dir() and not is_temporary(p) and _STEP_DIR.fullmatch(p.name)]
    return sorted(found, key=lambda p: int(p.name[len("step-"):]), reverse=True)


def is_step_dir(path: Path) -> bool:
    """``path`` names one checkpoint (``step-N``, or any directory holding a state.json), not a run."""
    return bool(_STEP_DIR.fullmatch(path.name)) or (path / STATE_FILE).is_file()


def run_step_dirs(run: Path) -> list[Path]:
    """A run's step directories, newest first: those under ``run/checkpoints``, else directly under ``run``."""
    return next((step_dirs(c) for c in (run / "checkpoints", run) if c.is_dir() and step_dirs(c)), [])


def newest_step_dir(directory: Path, below: int | None = None) -> Path | None:
    for path in step_dirs(directory):
        if below is None or int(path.name[len("step-"):]) < below:
            return path
    return None


def choose_checkpoint(path: str | Path) -> Checkpoint:
    """The checkpoint to resume from: ``path`` itself when it is a step directory (it must verify; newer
    siblings that fail are reported as skipped), else the newest step directory under ``path/checkpoints`` or
    ``path`` that verifies. `UserError` when there is none, naming every file that failed and why."""
    p = Path(path)
    if is_step_dir(p):
        try:
            state = verify_checkpoint(p)
        except StateFileError as error:
            raise UserError(f"checkpoint {p} cannot be resumed: {error} (pass its run directory to resume from "
                            "the newest checkpoint that verifies)") from None
        newer = [s for s in step_dirs(p.parent) if int(s.name[len("step-"):]) > int(state["step"])]
        return Checkpoint(p, state, [e for e in map(_failure, newer) if e is not None])
    candidates = run_step_dirs(p)
    if not candidates:
        raise UserError(f"no checkpoint found under {path}")
    skipped: list[Skipped] = []
    for candidate in candidates:
        try:
            return Checkpoint(candidate, verify_checkpoint(candidate), skipped)
        except StateFileError as error:
            skipped.append(Skipped(error.path, error.problem))
    raise UserError(f"no checkpoint under {path} verifies: " + "; ".join(f"{e.path}: {e.problem}" for e in skipped))


def _failure(path: Path) -> Skipped | None:
    try:
        verify_checkpoint(path)
    except StateFileError as error:
        return Skipped(error.path, error.problem)
    return None


def find_checkpoint(path: str | Path) -> Path:
    """The step directory `choose_checkpoint` picks (for commands that only read a checkpoint)."""
    return choose_checkpoint(path).path


def check_same_run(checkpoint: Checkpoint, preset: str, variant: str) -> None:
    """A checkpoint continues the run it was written by: another preset or variant cannot load it."""
    manifest = checkpoint.state["manifest"]
    if (manifest["preset"], manifest["variant"]) != (preset, variant):
        raise UserError(f"checkpoint {checkpoint.path} is preset {manifest['preset']}, variant "
                        f"{manifest['variant']}; this run asks for preset {preset}, variant {variant}: resume "
                        "without --preset/--variant, or start a new run in another --output-dir")


# ----------------------------------------------------------------------------- loading
def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    world: World | None = None, state: dict | None = None) -> tuple[int, dict]:
    """Restore model, optimizer and this rank's RNGs; return (step, this rank's loader state).

    ``state`` is what `verify_checkpoint` returned (verified again here when omitted). The learning-rate
    schedule is not restored: it is rebuilt from the run's options at the returned step.
    """
    world = world or World()
    path = Path(path)
    state = verify_checkpoint(path) if state is None else state
    check_world_size(path, state, world.size)
    tensors = load_model_weights(path, model)
    optimizer_state = {"param_groups": state["optimizer"]["param_groups"], "state": {}}
    try:
        for index, keys in state["optimizer"]["state_keys"].items():
            optimizer_state["state"][int(index)] = {key: tensors[f"optimizer/{index}/{key}"] for key in keys}
        optimizer.load_state_dict(optimizer_state)
    except (KeyError, ValueError) as error:
        raise UserError(f"{path / STATE_FILE}: its optimizer state does not fit this run's model ({error})") from None
    rank_state = _load_rank_state(path, world.shard)
    _restore_rng(rank_state["rng"])
    return int(state["step"]), rank_state["loader"]


def load_model_weights(path: Path, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Copy a checkpoint's parameters into ``model`` (built with the run's sizes); return all its tensors.
    Every name and shape is checked before the first copy, so a mismatch leaves ``model`` unchanged."""
    file = Path(path) / TENSORS_FILE
    tensors = load_torch_file(str(file))
    for name, parameter in model.named_parameters():
        saved = tensors.get(f"model/{name}")
        if saved is None or saved.shape != parameter.shape:
            found = "absent" if saved is None else f"of shape {tuple(saved.shape)}"
            raise UserError(f"{file}: parameter {name} is {found}, this run's model has {tuple(parameter.shape)} "
                            "(the checkpoint was written with other model sizes)")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(tensors[f"model/{name}"])
    return tensors


def export_pair(pair: torch.nn.Module, tokenizer: Any, out_dir: Path) -> str:
    """Hugging Face directories ``discriminator/`` and ``generator/`` (each with the tokenizer) for fine-tuning;
    returns the discriminator's."""
    for name in ("discriminator", "generator"):
        getattr(pair, name).save_pretrained(str(out_dir / name))
        tokenizer.save_pretrained(str(out_dir / name))
    return str(out_dir / "discriminator")


def check_world_size(path: Path, state: dict, ranks: int) -> None:
    """A checkpoint holds one replay shard and data position per rank, so it continues on that many ranks only."""
    saved = int(state.get("world_size", 1))
    if saved != ranks:
        how = ("one process (plain python)" if saved == 1
               else f"{saved} processes in total (e.g. torchrun with {saved} processes in total)")
        raise UserError(f"checkpoint {path} was written by {saved} rank(s) but this run has {ranks}; its replay "
                        f"shards and data positions are per rank, so resume it with {how}")


def _rank_files(path: Path, shard: ReplayShard) -> tuple[Path, Path]:
    return shard.file(path, ".safetensors"), shard.file(path, ".json")


def _save_rank_state(path: Path, shard: ReplayShard, state: dict) -> None:
    arrays, meta = flatten_state(state)
    tensors, meta_file = _rank_files(path, shard)
    save_numpy_file({k: (v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.ascontiguousarray(v))
                     for k, v in arrays.items()}, str(tensors))
    meta_file.write_text(json.dumps(meta))


def _load_rank_state(path: Path, shard: ReplayShard) -> dict:
    tensors, meta_file = _rank_files(path, shard)
    return unflatten_state(load_numpy_file(str(tensors)), json.loads(meta_file.read_text()))


def _capture_rng() -> dict:
    """Python, NumPy and torch (CPU and every CUDA device) generator states of this process."""
    python = random.getstate()
    numpy_rng = np.random.get_state()
    cuda = list(torch.cuda.get_rng_state_all()) if torch.cuda.is_available() else []
    return {"python": [python[0], list(python[1]), python[2]],
            "numpy": [numpy_rng[0], numpy_rng[1].tolist(), *numpy_rng[2:]],
            "torch": torch.get_rng_state(), "cuda": cuda}


def _restore_rng(saved: dict) -> None:
    version, internal, gauss = saved["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, *rest = saved["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(saved["torch"])
    if saved["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda"])


def prune_checkpoints(directory: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` step directories (keep <= 0 keeps all), and what killed saves left.

    Each is first renamed to a temporary name, so a kill while deleting never leaves a half-deleted
    ``step-N`` behind. Call it right after a save, when no other save is under way in ``directory``.
    """
    for old in step_dirs(directory)[keep:] if keep > 0 else []:
        doomed = old.with_name(f".{old.name}.{os.getpid()}.old")
        os.replace(old, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    for stale in directory.glob(".step-*"):  # temporaries of saves or deletions that were killed
        if is_temporary(stale):
            shutil.rmtree(stale, ignore_errors=True)

"""``upgrade-checkpoint``: give a checkpoint written before format 4 the manifest format 4 verifies.

Format 3 checkpoints (written before the integrity work of 2026-11-24) hold the same files but no manifest of
digests and no step in the rank files, so `checkpoint.verify_checkpoint` refuses them, and without this a run
made with an older version could never be resumed or exported again. The upgrade checks everything that can be
checked without a manifest (state.json is complete, the step agrees with the directory and every rank file,
every file the world size needs exists and parses), then records the step in each rank file and writes the
manifest, each file atomically; if it is stopped part-way, the checkpoint stays format 3 and the upgrade can
run again. The digests record the files as they are now: damage done before the upgrade cannot be detected.
"""
from __future__ import annotations

import json
from pathlib import Path

from replayloader.distributed import ReplayShard
from replayloader.state import StateFileError, atomic_write_text

from ..errors import UserError
from .checkpoint import (_STEP_DIR, CHECKPOINT_FORMAT, STATE_FILE, TENSORS_FILE, _check_safetensors, _rank_files,
                         _read_json, is_step_dir, run_step_dirs, verify_checkpoint, write_state)

UPGRADABLE_FORMAT = 3
_STATE_KEYS = ("step", "config", "world_size", "optimizer", "scheduler")


def upgrade_checkpoints(path: str | Path) -> list[tuple[Path, str]]:
    """Upgrade ``path`` in place: a step directory, or every step directory of a run (under ``checkpoints/``).
    Returns what happened to each directory; raises `UserError` naming the first that cannot be upgraded
    (those before it stay upgraded, those after it untouched)."""
    p = Path(path)
    targets = [p] if is_step_dir(p) else run_step_dirs(p)
    if not targets:
        raise UserError(f"no checkpoint found under {path}")
    done = []
    for target in sorted(targets):
        try:
            done.append((target, upgrade_step_dir(target)))
        except StateFileError as error:
            raise UserError(f"checkpoint {target} cannot be upgraded: {error}") from None
    return done


def upgrade_step_dir(path: Path) -> str:
    """Upgrade one step directory; a format-4 one is verified and left as it is."""
    state_file = path / STATE_FILE
    if not state_file.is_file():
        raise StateFileError(state_file, "missing")
    state = _read_json(state_file)
    if not isinstance(state, dict):
        raise StateFileError(state_file, "is not a JSON object")
    if state.get("format") == CHECKPOINT_FORMAT:
        verify_checkpoint(path)
        return f"already format {CHECKPOINT_FORMAT} (verified)"
    if state.get("format") != UPGRADABLE_FORMAT:
        raise StateFileError(state_file, f"format {state.get('format')!r} cannot be upgraded (only format "
                                         f"{UPGRADABLE_FORMAT} to {CHECKPOINT_FORMAT})")
    missing = [key for key in _STATE_KEYS if key not in state]
    if missing:
        raise StateFileError(state_file, f"lacks {', '.join(missing)}")
    step, ranks = state["step"], state["world_size"]
    named = _STEP_DIR.fullmatch(path.name)
    if not isinstance(step, int) or (named and int(named.group(1)) != step):
        raise StateFileError(state_file, f"says step {step!r} but lies in {path.name}")
    if not isinstance(ranks, int) or ranks < 1:
        raise StateFileError(state_file, f"has world_size {ranks!r}")
    if not (path / TENSORS_FILE).is_file():
        raise StateFileError(path / TENSORS_FILE, "missing")
    _check_safetensors(path / TENSORS_FILE)
    rank_meta = {}
    for rank in range(ranks):
        tensors, meta_file = _rank_files(path, ReplayShard(rank, ranks))
        for file in (tensors, meta_file):
            if not file.is_file():
                raise StateFileError(file, "missing")
        _check_safetensors(tensors)
        meta = _read_json(meta_file)
        if not isinstance(meta, dict):
            raise StateFileError(meta_file, "is not a JSON object")
        if meta.get("step", step) != step:
            raise StateFileError(meta_file, f"belongs to step {meta['step']!r}, not {step}")
        rank_meta[meta_file] = meta
    for meta_file, meta in rank_meta.items():  # all checked: now write, each file atomically
        atomic_write_text(meta_file, json.dumps({**meta, "step": step}))
    write_state(path, {key: value for key, value in state.items() if key != "manifest"} |
                {"format": CHECKPOINT_FORMAT})
    verify_checkpoint(path)
    return f"upgraded from format {UPGRADABLE_FORMAT} to {CHECKPOINT_FORMAT}"

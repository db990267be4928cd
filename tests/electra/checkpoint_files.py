"""Checkpoint helpers for tests and checks/fault_injection.py: a checkpoint that verifies without a run (built with
the writer's own manifest), and a saver killed at random instants."""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from replayloader_electra.pretrain import checkpoint
from replayloader_electra.pretrain.checkpoint import CHECKPOINT_FORMAT, write_state
from replayloader.state.atomic import is_temporary


def write_config_only_checkpoint(step_dir: Path, config, step: int, ranks: int = 1) -> Path:
    """``step_dir`` with placeholder tensors and rank files, and a state.json holding ``config`` and a manifest."""
    step_dir.mkdir(parents=True)
    save_file({"placeholder": np.zeros(1)}, str(step_dir / "tensors.safetensors"))
    for rank in range(ranks):
        save_file({"placeholder": np.zeros(1)}, str(step_dir / f"rank-{rank:05d}.safetensors"))
        (step_dir / f"rank-{rank:05d}.json").write_text(json.dumps({"step": step}))
    write_state(step_dir, {"format": CHECKPOINT_FORMAT, "step": step, "config": config.to_json(), "world_size": ranks})
    return step_dir


# ----------------------------------------------------------------------------- kill -9 during saves
WIDTH = 512  # a 512 x 512 layer: a ~1.7 MB checkpoint, so a random kill often lands inside a save


def saving_parts():
    """What `save_checkpoint` needs, for a model with nothing but one linear layer."""
    import torch

    from replayloader_electra.pretrain import PretrainConfig

    model = torch.nn.Linear(WIDTH, WIDTH)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return PretrainConfig().filled(), model, optimizer, scheduler


def save_step(directory: Path, step: int, parts) -> None:
    """Checkpoint ``step`` of a model whose every parameter (and loader position entry) equals ``step``."""
    import torch

    config, model, optimizer, scheduler = parts
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(step)
    checkpoint.save_checkpoint(directory, step, config, model, optimizer, scheduler,
                               {"position": np.full(50_000, step)})


def save_forever(directory: str) -> None:
    """Checkpoints 1, 2, 3, ... back to back (keeping the newest 2), until killed."""
    import torch

    torch.set_num_threads(1)
    parts = saving_parts()
    parent = os.getppid()
    for step in range(1, 10 ** 6):
        if os.getppid() != parent:  # the test died before it could kill us
            return
        save_step(Path(directory), step, parts)
        checkpoint.prune_checkpoints(Path(directory), keep=2)


def kill_while_saving(directory: Path, delay: float) -> list[str]:
    """Fork a `save_forever` child, SIGKILL it ``delay`` seconds after its first checkpoint; return the names of
    the temporaries it left (a kill inside a save or a prune leaves one)."""
    child = multiprocessing.get_context("fork").Process(target=save_forever, args=(str(directory),))
    child.start()
    deadline = time.monotonic() + 60
    while checkpoint.newest_step_dir(directory) is None and time.monotonic() < deadline:
        time.sleep(0.002)
    time.sleep(delay)
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    return sorted(p.name for p in directory.iterdir() if is_temporary(p))


def load_survivor(directory: Path) -> int:
    """Verify every step directory a killed saver left, load the newest into a fresh model and check that it
    holds its step's values; return that step (`StateFileError` or `AssertionError` otherwise)."""
    import torch

    steps = checkpoint.step_dirs(directory)
    assert steps, f"no checkpoint left in {directory}"
    for path in steps:
        checkpoint.verify_checkpoint(path)
    chosen = checkpoint.choose_checkpoint(directory)
    assert chosen.path == steps[0] and not chosen.skipped
    _, model, optimizer, _ = saving_parts()
    step, loader = checkpoint.load_checkpoint(chosen.path, model, optimizer, state=chosen.state)
    assert torch.all(model.weight == step) and np.all(loader["position"] == step), step
    return step

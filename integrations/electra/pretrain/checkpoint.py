"""Checkpoints that continue a run exactly: model, optimizer, schedule, loader (buffer + data position), RNGs.

A checkpoint is a directory ``step-XXXXXXXX/`` with ``tensors.safetensors`` (parameters, optimizer moments, torch
RNG states), ``loader.safetensors`` (the replay buffer's arrays) and ``state.json`` (everything else); no pickle.
The loader's state comes in as a separate piece, so a distributed run can save one per rank beside the model.
"""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import load_file as load_numpy_file
from safetensors.numpy import save_file as save_numpy_file
from safetensors.torch import load_file as load_torch_file
from safetensors.torch import save_file as save_torch_file

from replayloader.checkpoint import flatten_state, unflatten_state

from ..common import UserError

CHECKPOINT_FORMAT = 2  # 2: the data position lives in the loader state (the loader's source)


def save_checkpoint(directory: Path, step: int, config: Any, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, scheduler: Any, loader_state: dict) -> Path:
    """Write ``step-XXXXXXXX/`` under ``directory`` (atomic rename) and return it."""
    final = directory / f"step-{step:08d}"
    tmp = directory / f".tmp-step-{step:08d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tensors = {f"model/{name}": p.detach().cpu().contiguous() for name, p in model.named_parameters()}
    optimizer_state = optimizer.state_dict()
    for index, state in optimizer_state["state"].items():
        for key, value in state.items():
            tensors[f"optimizer/{index}/{key}"] = value.detach().cpu().contiguous()
    rng_tensors, rng_json = _capture_rng()
    tensors.update(rng_tensors)
    save_torch_file(tensors, str(tmp / "tensors.safetensors"))
    arrays, loader_meta = flatten_state(loader_state)
    save_numpy_file({k: (v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.ascontiguousarray(v))
                     for k, v in arrays.items()}, str(tmp / "loader.safetensors"))
    state = {
        "format": CHECKPOINT_FORMAT, "step": step, "config": config.to_json(),
        "optimizer": {"param_groups": optimizer_state["param_groups"],
                      "state_keys": {str(i): sorted(s) for i, s in optimizer_state["state"].items()}},
        "scheduler": scheduler.state_dict(), "loader": loader_meta, "rng": rng_json,
    }
    (tmp / "state.json").write_text(json.dumps(state))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any) -> tuple[int, dict]:
    """Restore model, optimizer, schedule and RNGs; return (step, loader state) for ``loader.load_state_dict``."""
    state = json.loads((path / "state.json").read_text())
    if state.get("format") != CHECKPOINT_FORMAT:
        raise UserError(f"checkpoint format {state.get('format')!r} in {path} is not supported "
                        f"(this version reads format {CHECKPOINT_FORMAT})")
    tensors = load_torch_file(str(path / "tensors.safetensors"))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(tensors[f"model/{name}"])
    optimizer_state = {"param_groups": state["optimizer"]["param_groups"], "state": {}}
    for index, keys in state["optimizer"]["state_keys"].items():
        optimizer_state["state"][int(index)] = {key: tensors[f"optimizer/{index}/{key}"] for key in keys}
    optimizer.load_state_dict(optimizer_state)
    scheduler.load_state_dict(state["scheduler"])
    loader_state = unflatten_state(load_numpy_file(str(path / "loader.safetensors")), state["loader"])
    _restore_rng(tensors, state["rng"])
    return int(state["step"]), loader_state


def _capture_rng() -> tuple[dict[str, torch.Tensor], dict]:
    """Python, NumPy and torch (CPU and every CUDA device) generator states."""
    tensors = {"rng/torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, rng in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng/cuda/{i}"] = rng
    python = random.getstate()
    numpy_rng = np.random.get_state()
    return tensors, {"python": [python[0], list(python[1]), python[2]],
                     "numpy": [numpy_rng[0], numpy_rng[1].tolist(), *numpy_rng[2:]]}


def _restore_rng(tensors: dict[str, torch.Tensor], saved: dict) -> None:
    version, internal, gauss = saved["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, *rest = saved["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(tensors["rng/torch"])
    cuda_states = [tensors[k] for k in sorted(tensors) if k.startswith("rng/cuda/")]
    if cuda_states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda_states)


def find_checkpoint(path: str | Path) -> Path:
    """Accept a step directory, a checkpoints directory or a run directory; return the newest step directory."""
    p = Path(path)
    if (p / "state.json").is_file():
        return p
    for candidate in (p / "checkpoints", p):
        steps = sorted(candidate.glob("step-*")) if candidate.is_dir() else []
        steps = [s for s in steps if (s / "state.json").is_file()]
        if steps:
            return steps[-1]
    raise UserError(f"no checkpoint found under {path}")


def prune_checkpoints(directory: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` step directories (keep <= 0 keeps all)."""
    steps = sorted(p for p in directory.glob("step-*") if p.is_dir())
    for old in steps[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)

"""Checkpoints that continue a run exactly: model, optimizer, schedule, and every rank's loader and RNGs.

A checkpoint is a directory ``step-XXXXXXXX/`` holding, once, ``tensors.safetensors`` (parameters, optimizer
moments) and ``state.json`` (config, schedule, optimizer settings, the number of ranks), and per rank
``rank-RRRRR.safetensors`` + ``rank-RRRRR.json``: that rank's loader (replay buffer and data position) and its
Python, NumPy and torch generator states. No pickle. Every rank writes into one temporary directory that rank 0
renames once all are done, so a checkpoint is complete or absent. Resuming needs the same number of ranks.
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

from replayloader import shards
from replayloader.checkpoint import flatten_state, unflatten_state

from ..common import UserError
from .distributed import World

CHECKPOINT_FORMAT = 3  # 3: one loader + RNG file per rank, and the number of ranks in state.json


def save_checkpoint(directory: Path, step: int, config: Any, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, scheduler: Any, loader_state: dict,
                    world: World | None = None) -> Path:
    """Write ``step-XXXXXXXX/`` under ``directory`` (atomic rename) and return it; every rank calls this."""
    world = world or World()
    final = directory / f"step-{step:08d}"
    tmp = directory / f".tmp-step-{step:08d}"
    if world.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    world.barrier()
    _save_rank_state(tmp, world.shard, {"loader": loader_state, "rng": _capture_rng()})
    if world.is_main:
        tensors = {f"model/{name}": p.detach().cpu().contiguous() for name, p in model.named_parameters()}
        optimizer_state = optimizer.state_dict()
        for index, state in optimizer_state["state"].items():
            for key, value in state.items():
                tensors[f"optimizer/{index}/{key}"] = value.detach().cpu().contiguous()
        save_torch_file(tensors, str(tmp / "tensors.safetensors"))
        state = {
            "format": CHECKPOINT_FORMAT, "step": step, "config": config.to_json(), "world_size": world.size,
            "optimizer": {"param_groups": optimizer_state["param_groups"],
                          "state_keys": {str(i): sorted(s) for i, s in optimizer_state["state"].items()}},
            "scheduler": scheduler.state_dict(),
        }
        (tmp / "state.json").write_text(json.dumps(state))
    world.barrier()  # every rank's files are in place
    if world.is_main:
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
    world.barrier()
    return final


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any, world: World | None = None) -> tuple[int, dict]:
    """Restore model, optimizer, schedule and this rank's RNGs; return (step, this rank's loader state)."""
    world = world or World()
    state = json.loads((path / "state.json").read_text())
    if state.get("format") != CHECKPOINT_FORMAT:
        raise UserError(f"checkpoint format {state.get('format')!r} in {path} is not supported "
                        f"(this version reads format {CHECKPOINT_FORMAT})")
    check_world_size(path, state, world.size)
    tensors = load_model_weights(path, model)
    optimizer_state = {"param_groups": state["optimizer"]["param_groups"], "state": {}}
    for index, keys in state["optimizer"]["state_keys"].items():
        optimizer_state["state"][int(index)] = {key: tensors[f"optimizer/{index}/{key}"] for key in keys}
    optimizer.load_state_dict(optimizer_state)
    scheduler.load_state_dict(state["scheduler"])
    rank_state = _load_rank_state(path, world.shard)
    _restore_rng(rank_state["rng"])
    return int(state["step"]), rank_state["loader"]


def load_model_weights(path: Path, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Copy a checkpoint's parameters into ``model`` (built with the run's sizes); return all its tensors."""
    tensors = load_torch_file(str(path / "tensors.safetensors"))
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
    try:
        shards.check_world_size(int(state.get("world_size", 1)), ranks, f"checkpoint {path}",
                                "its replay shards and data positions are per rank")
    except ValueError as exc:
        raise UserError(str(exc)) from exc


def _rank_files(path: Path, shard: shards.ReplayShard) -> tuple[Path, Path]:
    return shard.file(path, ".safetensors"), shard.file(path, ".json")


def _save_rank_state(path: Path, shard: shards.ReplayShard, state: dict) -> None:
    arrays, meta = flatten_state(state)
    tensors, meta_file = _rank_files(path, shard)
    save_numpy_file({k: (v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.ascontiguousarray(v))
                     for k, v in arrays.items()}, str(tensors))
    meta_file.write_text(json.dumps(meta))


def _load_rank_state(path: Path, shard: shards.ReplayShard) -> dict:
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

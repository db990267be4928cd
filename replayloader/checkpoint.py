"""Flatten nested state dicts into named arrays + JSON, so checkpoints need no pickle.

`flatten_state` splits a nested dict into ``arrays`` (numpy arrays and torch tensors, keyed by dotted path)
and ``meta`` (everything JSON can hold, with array leaves replaced by a marker). `save_state`/`load_state`
write them as an ``.npz`` plus a ``.json`` next to it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from .storage import is_torch_tensor

_MARK = "__array__"


class StateFileError(ValueError):
    """A state file (or checkpoint) that cannot be used: names the file and what is wrong with it."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path, self.problem = str(path), problem
        super().__init__(f"{path}: {problem}")


def flatten_state(state: dict) -> tuple[dict[str, Any], dict]:
    arrays: dict[str, Any] = {}

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, dict):
            for key in node:
                if not isinstance(key, str) or "." in key:
                    raise ValueError(f"state keys must be strings without '.', got {key!r} at {path or 'root'}")
            return {k: walk(v, f"{path}.{k}" if path else k) for k, v in node.items()}
        if isinstance(node, np.ndarray) or is_torch_tensor(node):
            arrays[path] = node
            return {_MARK: path, "torch": is_torch_tensor(node)}
        if isinstance(node, (list, tuple)):
            return [walk(v, f"{path}.{i}") for i, v in enumerate(node)]
        if isinstance(node, np.generic):
            return node.item()
        return node

    meta = walk(state, "")
    return arrays, meta


def unflatten_state(arrays: dict[str, Any], meta: dict) -> dict:
    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if _MARK in node:
                value = arrays[node[_MARK]]
                if node.get("torch") and not is_torch_tensor(value):
                    import torch

                    value = torch.as_tensor(np.asarray(value))
                return value
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(meta)


def save_state(state: dict, path: str | Path) -> None:
    """Write ``path`` (.npz of arrays, tensors copied to host) and ``path`` + '.json' (the rest)."""
    path = Path(path)
    arrays, meta = flatten_state(state)
    host = {k: (v.detach().cpu().numpy() if is_torch_tensor(v) else v) for k, v in arrays.items()}
    with open(path, "wb") as f:
        np.savez(f, **host)
    path.with_name(path.name + ".json").write_text(json.dumps(meta))


def load_state(path: str | Path) -> dict:
    path = Path(path)
    meta = json.loads(path.with_name(path.name + ".json").read_text())
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    return unflatten_state(arrays, meta)

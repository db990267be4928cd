"""Flatten nested state dicts into named arrays + JSON, so checkpoints need no pickle.

`flatten_state` splits a nested dict into ``arrays`` (numpy arrays and torch tensors, keyed by dotted path)
and ``meta`` (everything JSON can hold, with array leaves replaced by a marker). `save_state`/`load_state`
write them as one ``.npz`` whose JSON member also records a digest of every array; the write is atomic
(`atomic.atomic_write`) and the read checks every digest, so a damaged file is named, never half-used.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from .atomic import atomic_write, sha256_bytes
from .._arrays import is_torch_tensor

_MARK = "__array__"
_META = "__meta__"  # the archive member holding the JSON (`flatten_state` refuses it as a key)


class StateFileError(ValueError):
    """A state file (or checkpoint) that cannot be used: names the file and what is wrong with it. A `ValueError`,
    not an `InvalidState` (that one is a state an object refuses); catch both around a load, or `ValueError`."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path, self.problem = str(path), problem
        super().__init__(f"{path}: {problem}")


def flatten_state(state: dict) -> tuple[dict[str, Any], dict]:
    arrays: dict[str, Any] = {}

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, dict):
            for key in node:
                if not isinstance(key, str) or "." in key or key == _META:
                    raise ValueError(f"state keys must be strings without '.' (and not {_META!r}), got {key!r} at "
                                     f"{path or 'root'}")
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


FORMAT = "replayloader-state/2"


def _array_digest(array: np.ndarray) -> str:
    """sha256 over dtype, shape and bytes: a flipped bit, a changed shape or a reinterpreted dtype all differ."""
    header = f"{array.dtype.str}{array.shape}".encode()
    return sha256_bytes(header + np.ascontiguousarray(array).tobytes())


def save_state(state: dict, path: str | Path) -> None:
    """Write ``state`` to ``path`` as one ``.npz`` (tensors copied to host), atomically.

    The archive holds the arrays and a JSON member with the rest of the state and a sha256 digest of every array;
    it is written under a temporary name, fsynced and renamed over ``path``, so a kill or a full disk during the
    save leaves the previous file intact.
    """
    path = Path(path)
    arrays, meta = flatten_state(state)
    host = {k: (v.detach().cpu().numpy() if is_torch_tensor(v) else v) for k, v in arrays.items()}
    header = {"format": FORMAT, "state": meta, "digests": {k: _array_digest(v) for k, v in host.items()}}
    encoded = np.frombuffer(json.dumps(header).encode("utf-8"), np.uint8)
    atomic_write(path, lambda f: np.savez(f, **host, **{_META: encoded}))


def load_state(path: str | Path) -> dict:
    """Read a file written by `save_state`, checking every array against its digest.

    Raises `StateFileError` naming the file and the problem (missing, truncated, not an archive, damaged
    array, unreadable JSON). Files of the earlier two-file format (``.npz`` + ``.json`` beside it) still load.
    """
    path = Path(path)
    if not path.is_file():
        raise StateFileError(path, "no such file")
    try:  # the file opened here, not by np.load, which leaks its handle when the archive is unreadable
        with open(path, "rb") as f:
            data = np.load(f, allow_pickle=False)
            if not isinstance(data, np.lib.npyio.NpzFile):  # a lone .npy array: no archive at all
                raise ValueError("it holds a single array, not a zip archive")
            with data:
                arrays = {k: data[k] for k in data.files}
    except Exception as err:  # zipfile, numpy and OS errors all mean the same here: the archive is unreadable
        raise StateFileError(path, f"not a readable state archive (truncated or damaged?): {_unreadable(err)}") \
            from None
    if _META not in arrays:
        return _load_two_file_state(path, arrays)
    try:
        header = json.loads(arrays.pop(_META).tobytes().decode("utf-8"))
        meta, digests = header["state"], header["digests"]
        if header.get("format") != FORMAT:
            raise ValueError(f"unknown format {header.get('format')!r}")
    except Exception as err:
        raise StateFileError(path, f"its metadata is unreadable: {err}") from None
    if set(digests) != set(arrays):
        raise StateFileError(path, f"arrays {sorted(set(digests) ^ set(arrays))} are missing or unexpected")
    for key, array in arrays.items():
        if _array_digest(array) != digests[key]:
            raise StateFileError(path, f"array {key!r} does not match its recorded sha256 (the file is damaged)")
    try:
        return unflatten_state(arrays, meta)
    except Exception as err:
        raise StateFileError(path, f"its metadata does not match its arrays: {err!r}") from None


def _unreadable(err: Exception) -> str:
    """Why numpy could not read the archive, in this library's words. A file whose first bytes are not a zip
    header is taken by ``np.load`` for a pickle, and refused with advice to allow pickles: never the fix here."""
    if isinstance(err, ValueError) and "allow_pickle" in str(err):
        return "it does not start with a zip header"
    return " ".join(str(err).split()) or type(err).__name__


def _load_two_file_state(path: Path, arrays: dict) -> dict:
    """The format before digests: the JSON sits beside the archive as ``path`` + '.json'."""
    sidecar = path.with_name(path.name + ".json")
    try:
        meta = json.loads(sidecar.read_text())
    except FileNotFoundError:
        raise StateFileError(path, f"holds no metadata and {sidecar.name} is missing") from None
    except Exception as err:
        raise StateFileError(sidecar, f"unreadable JSON: {err}") from None
    try:
        return unflatten_state(arrays, meta)
    except Exception as err:
        raise StateFileError(path, f"{sidecar.name} does not match the archive: {err!r}") from None

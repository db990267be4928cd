"""One state file for every rank: digests compared across ranks before rank 0 writes, and again after each rank
reads it back, so a checkpoint of a distributed job is one file that resumes on any world size."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .._arrays import is_torch_tensor, to_numpy
from ..state.atomic import atomic_write
from ..state.files import StateFileError, flatten_state, unflatten_state
from .group import current_group


def state_digest(state: Mapping) -> str:
    """sha256 of a state dict's content (names, dtypes, shapes and bytes of its arrays; the rest as JSON)."""
    arrays, meta = flatten_state(dict(state))
    digest = hashlib.sha256(json.dumps(meta, sort_keys=True, default=str).encode())
    for name in sorted(arrays):
        array = to_numpy(arrays[name], name) if is_torch_tensor(arrays[name]) else np.asarray(arrays[name])
        array = np.ascontiguousarray(array)
        digest.update(f"{name}|{array.dtype.str}|{array.shape}".encode())
        digest.update(array.reshape(-1).view(np.uint8))  # the bytes in place, no copy
    return digest.hexdigest()


def verify_identical(state: Mapping, group: Any = None, what: str = "state check") -> str:
    """The state's `state_digest`; in a job of several processes (call on every rank), every rank raises unless
    all ranks' digests agree."""
    digest = state_digest(state)
    world = current_group(group)
    if world is not None:
        digests = world.all_gather_objects(digest)
        if len(set(digests)) > 1:
            listed = ", ".join(f"rank {r}: {d[:12]}" for r, d in enumerate(digests))
            raise RuntimeError(f"{what}: the ranks' states differ ({listed}); they must be identical (same "
                               f"sampler, same draws, same feedback on every rank)")
    return digest


def save_shared_state(state: Mapping, path: str | Path, group: Any = None) -> str:
    """Write a state that every rank holds identically to ONE file (call on every rank); return its digest.

    The ranks' digests are compared first: if any rank's state differs, every rank raises and nothing is written.
    Rank 0 writes the file atomically (a kill leaves the old file or the new one). In one process (no process
    group) this just writes the file, so a single-process run writes the same format.
    """
    path = Path(path)
    digest = verify_identical(state, group, f"cannot save {path}")
    world = current_group(group)
    write = (lambda: write_state_file(state, digest, path))
    if world is None:
        write()
    else:
        world.agree(write if world.rank == 0 else (lambda: None), f"writing {path}")
    return digest


def load_shared_state(path: str | Path, group: Any = None) -> dict:
    """Read a file of `save_shared_state` on every rank (it must be readable by all: a shared filesystem or a
    copy per node); every rank raises if any rank cannot read it or read different content."""
    world = current_group(group)
    if world is None:
        return read_state_file(Path(path))[0]
    loaded: list = []
    world.agree(lambda: loaded.append(read_state_file(Path(path))), f"reading {path}")
    digests = world.all_gather_objects(loaded[0][1])
    if len(set(digests)) > 1:
        raise RuntimeError(f"the ranks read different contents from {path}: {digests}")
    return loaded[0][0]


def write_state_file(state: Mapping, digest: str, path: Path) -> None:
    """One ``.npz`` (no pickle) holding the state's arrays, its other values as JSON and its `state_digest`,
    written atomically."""
    arrays, meta = flatten_state(dict(state))
    host = {name: (to_numpy(v, name) if is_torch_tensor(v) else np.asarray(v)) for name, v in arrays.items()}
    header = json.dumps({"meta": meta, "sha256": digest}).encode()
    atomic_write(path, lambda f: np.savez(f, __header__=np.frombuffer(header, np.uint8), **host))


def read_state_file(path: Path) -> tuple[dict, str]:
    """(state, digest) of a `write_state_file` file; a damaged or foreign file raises `StateFileError`.

    Every failure to read it is one error naming the file: a truncated archive or flipped bytes surface as
    zipfile's ``BadZipFile``, ``EOFError`` or ``NotImplementedError`` (a garbled compression field), a foreign
    header as a ``KeyError``, and a caller should not have to know numpy's and zipfile's exception types.
    """
    try:  # the file opened here, not by np.load, which leaks its handle when the archive is unreadable
        with open(path, "rb") as f, np.load(f, allow_pickle=False) as data:
            header = json.loads(bytes(data["__header__"]).decode())
            arrays = {name: data[name] for name in data.files if name != "__header__"}
        state = unflatten_state(arrays, header["meta"])
        recorded, digest = str(header["sha256"]), state_digest(state)
    except Exception as exc:  # noqa: BLE001 - every reason means the same: this file cannot be used
        raise StateFileError(path, f"not a shared state file ({type(exc).__name__}: {exc})".replace("\n", " ")) \
            from exc
    if digest != recorded:
        raise StateFileError(path, f"content digest {digest[:12]} does not match the recorded "
                                   f"{recorded[:12]} (a damaged file)")
    return state, digest



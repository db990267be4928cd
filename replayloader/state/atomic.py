"""Atomic file writes and content digests: the one place that decides how a state file reaches the disk.

A save must never destroy the last good state. Every writer here writes to a temporary name in the target's own
directory, flushes and fsyncs it, renames it over the target (atomic on POSIX and on Windows' ``os.replace``)
and fsyncs the directory, so a kill at any instant leaves either the old file or the new one, never a mix.
Whole directories (a training checkpoint of several files) are committed the same way by `atomic_directory`.
Digests (`sha256_file`, `sha256_bytes`) are recorded beside what is saved and checked when it is read back.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

_CHUNK = 1 << 20


def fsync_directory(path: str | Path) -> None:
    """Make a rename or a new entry in ``path`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, then move it over ``path`` in one step.

    If ``write`` raises, or the disk is full, the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_directory(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


@contextlib.contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Build a directory under a temporary name and rename it to ``path`` when the block ends without error.

    Yields the temporary directory to write into. Files written there are fsynced before the rename. An
    existing ``path`` is replaced only after the new one is complete (it is first moved aside, then removed),
    so a kill leaves the old directory, the new one, or both under distinct names, never a half-written one
    under ``path``. On an error the temporary directory is removed and ``path`` is untouched.
    """
    path = Path(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        for child in tmp.rglob("*"):
            if child.is_file():
                with open(child, "rb") as f:
                    os.fsync(f.fileno())
        fsync_directory(tmp)
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            if old.exists():
                shutil.rmtree(old)
            os.replace(path, old)
        os.replace(tmp, path)
        fsync_directory(path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def sha256_bytes(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def is_temporary(path: str | Path) -> bool:
    """True for the names the writers above use while a write is in progress (skip them when listing)."""
    name = Path(path).name
    return name.startswith(".") and (name.endswith(".tmp") or name.endswith(".old"))

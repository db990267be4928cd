"""The embedded corpora as frozen, versioned snapshots: the same text on every machine.

The default corpus used to be generated from the running interpreter's documentation, so its text depended on the
Python patch release (3.11.7 gave 18,479 lines, 3.11.2 gave 15,934) and a run's data was not reproducible across
machines. Each embedded corpus is now a gzip file in this package, built once by
``python tools/build_corpus_snapshot.py``; ``snapshots.json`` records its file and the sha256 of its text, and
`snapshot_file` refuses a copy whose text does not match, naming the file.
"""
from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

from ..errors import UserError

CORPUS_DIR = Path(__file__).resolve().parent
MANIFEST = CORPUS_DIR / "snapshots.json"


def manifest() -> dict[str, dict]:
    """corpus name -> {file, sha256 (of the uncompressed text), lines, bytes, built_with, command}."""
    return json.loads(MANIFEST.read_text(encoding="utf-8"))


def text_sha256(path: str | Path) -> str:
    """sha256 of a gzip file's uncompressed contents (stable across zlib versions, unlike the .gz bytes)."""
    digest = hashlib.sha256()
    try:
        with gzip.open(path, "rb") as text:
            for chunk in iter(lambda: text.read(1 << 20), b""):
                digest.update(chunk)
    except (OSError, EOFError) as exc:
        raise UserError(f"corpus snapshot {path} is not a readable gzip file ({exc}); restore it from git or "
                        "rebuild it with tools/build_corpus_snapshot.py") from None
    return digest.hexdigest()


def snapshot_file(name: str) -> tuple[Path, str]:
    """The snapshot of embedded corpus ``name`` and its text digest, after checking the text against the manifest."""
    entries = manifest()
    if name not in entries:
        raise UserError(f"no snapshot for embedded corpus {name!r} in {MANIFEST} (have: {', '.join(entries)})")
    entry = entries[name]
    path = CORPUS_DIR / entry["file"]
    if not path.is_file():
        raise UserError(f"corpus snapshot {path} is missing; restore it from git or rebuild it with "
                        "tools/build_corpus_snapshot.py")
    found = text_sha256(path)
    if found != entry["sha256"]:
        raise UserError(f"corpus snapshot {path} does not match {MANIFEST.name}: its text has sha256 {found}, "
                        f"the manifest records {entry['sha256']}; restore the file from git")
    return path, found

"""Build the frozen snapshots of the embedded corpora (integrations/electra/corpus/) from this interpreter.

``python-docs`` is the documentation CPython ships: the help topics of ``pydoc_data.topics``, then the docstrings
of the standard-library sources (PSF-licensed), one paragraph per line; ``python-topics`` is the help topics alone.
The text depends on the Python release it is read from, which is why pretraining reads these snapshots instead.
v1 was built with CPython 3.11.7 (python-docs: 18,479 lines), the text issue 11's phase-2 runs trained on.

    python tools/build_corpus_snapshot.py --version v1          # writes the .txt.gz files and snapshots.json
    python tools/build_corpus_snapshot.py --version v1 --check  # compare this interpreter's text, write nothing

A version's file is never overwritten with different text: a new text needs a new ``--version``, so a run's
recorded corpus digest always names the text it trained on.
"""
from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import io
import json
import re
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from replayloader_electra.corpus import CORPUS_DIR, MANIFEST, text_sha256  # noqa: E402
from replayloader.state.atomic import atomic_write_bytes, atomic_write_text  # noqa: E402

_RST_UNDERLINE = re.compile(r"^\s*([*=~^#+\-])\1{2,}\s*$")
SKIPPED_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "lib2to3"}


def paragraphs(text: str) -> Iterator[str]:
    """Join wrapped lines into one line per paragraph (blank-line separated), dropping empty ones and RST rules."""
    for block in re.split(r"\n\s*\n", text):
        kept = [line for line in block.splitlines() if not _RST_UNDERLINE.match(line)]
        line = " ".join(" ".join(kept).split())
        if line:
            yield line


def python_docs_text(include_docstrings: bool = True) -> Iterator[str]:
    """Paragraphs of CPython's own documentation: pydoc help topics, then stdlib docstrings (sorted paths)."""
    from pydoc_data.topics import topics

    for key in sorted(topics):
        yield from paragraphs(topics[key])
    if not include_docstrings:
        return
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        if SKIPPED_DIRS.intersection(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    yield from paragraphs(doc)


CORPORA = {"python-docs": True, "python-topics": False}  # name -> include the stdlib docstrings


def gzip_bytes(text: bytes) -> bytes:
    """Deterministic gzip (no file name, mtime 0): the same text gives the same file."""
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=out, mtime=0) as sink:
        sink.write(text)
    return out.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", required=True, help="snapshot version, part of the file name (e.g. v1)")
    parser.add_argument("--check", action="store_true", help="compare with the recorded snapshots, write nothing")
    args = parser.parse_args()
    if not re.fullmatch(r"v\d+", args.version):
        parser.error(f"--version must look like v1, v2, ...; got {args.version!r}")
    entries = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}
    changed = False
    for name, docstrings in CORPORA.items():
        lines = list(python_docs_text(include_docstrings=docstrings))
        text = "".join(line + "\n" for line in lines).encode("utf-8")
        digest = hashlib.sha256(text).hexdigest()
        file = f"{name}-{args.version}.txt.gz"
        path = CORPUS_DIR / file
        print(f"{name}: {len(lines):,} lines, {len(text):,} bytes, sha256 {digest} (Python {sys.version.split()[0]})")
        if path.exists() and text_sha256(path) != digest:
            print(f"  differs from the committed {file}; build a new --version instead", file=sys.stderr)
            changed = True
            continue
        if args.check:
            continue
        atomic_write_bytes(path, gzip_bytes(text))
        entries[name] = {"file": file, "sha256": digest, "lines": len(lines), "bytes": len(text),
                         "built_with": f"CPython {sys.version.split()[0]}",
                         "command": f"python tools/build_corpus_snapshot.py --version {args.version}"}
        print(f"  wrote {path} ({path.stat().st_size:,} bytes)")
    if not args.check:
        atomic_write_text(MANIFEST, json.dumps(entries, indent=1) + "\n")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())

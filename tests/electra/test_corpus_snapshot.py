"""The embedded corpora are frozen snapshots: read as recorded, digest checked, a corrupted copy refused."""
from __future__ import annotations

import gzip
import hashlib
import shutil
import sys
from pathlib import Path

import pytest

from replayloader_electra import corpus  # noqa: E402
from replayloader_electra.errors import UserError  # noqa: E402
from replayloader_electra.data import corpus_lines, resolve_corpus  # noqa: E402


def test_default_corpus_reads_the_recorded_snapshot(tmp_path):
    entry = corpus.manifest()["python-docs"]
    path, digest = corpus.snapshot_file("python-docs")
    assert path.name == entry["file"] and digest == entry["sha256"]
    with gzip.open(path, "rb") as text:
        assert hashlib.sha256(text.read()).hexdigest() == entry["sha256"]
    assert resolve_corpus("python-docs").fingerprint()["snapshot_sha256"] == entry["sha256"]
    lines = corpus_lines(resolve_corpus("python-docs"), tmp_path)
    assert len(lines) == entry["lines"]  # the same 18,479 lines on every interpreter
    with gzip.open(path, "rt", encoding="utf-8") as text:
        first = text.readline().strip()
    assert lines[0]["text"] == first


@pytest.fixture
def copied_snapshots(tmp_path, monkeypatch):
    """A private copy of the corpus folder, so a test can damage it."""
    for source in corpus.CORPUS_DIR.iterdir():
        if source.name.endswith((".gz", ".json")):
            shutil.copy(source, tmp_path / source.name)
    monkeypatch.setattr(corpus, "CORPUS_DIR", tmp_path)
    monkeypatch.setattr(corpus, "MANIFEST", tmp_path / "snapshots.json")
    return tmp_path


def test_a_changed_snapshot_is_refused_naming_the_file(copied_snapshots):
    target = copied_snapshots / corpus.manifest()["python-topics"]["file"]
    with gzip.open(target, "rb") as text:
        lines = text.read().splitlines(keepends=True)
    with gzip.open(target, "wb") as sink:
        sink.writelines(lines[:-1])  # a valid gzip file whose text lost its last line
    with pytest.raises(UserError, match=f"{target}.*does not match"):
        corpus.snapshot_file("python-topics")
    with pytest.raises(UserError, match=f"{target}.*does not match"):
        resolve_corpus("python-topics").fingerprint()


def test_a_damaged_or_missing_snapshot_is_refused_naming_the_file(copied_snapshots):
    target = copied_snapshots / corpus.manifest()["python-topics"]["file"]
    target.write_bytes(target.read_bytes()[:1000])  # truncated gzip stream
    with pytest.raises(UserError, match=f"{target} is not a readable gzip file"):
        corpus.snapshot_file("python-topics")
    target.unlink()
    with pytest.raises(UserError, match=f"{target} is missing"):
        corpus.snapshot_file("python-topics")
    with pytest.raises(UserError, match="no snapshot for embedded corpus 'nope'"):
        corpus.snapshot_file("nope")


def test_heldout_scoring_reads_the_same_snapshot_lines_the_runs_never_trained_on(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from experiments.heldout_auc import heldout_lines

    held = heldout_lines("python-docs", 16_600)
    assert held == corpus_lines(resolve_corpus("python-docs"), tmp_path, start=16_600)["text"]
    assert len(held) == corpus.manifest()["python-docs"]["lines"] - 16_600

"""JSON-lines logs that a kill cannot garble: one ``write`` per record, fsynced, and readers that drop a torn tail.

A run appends one record per step to ``metrics.jsonl`` while summaries and job queues may read it. Each record
goes out as a single ``os.write`` of one complete line on an ``O_APPEND`` descriptor, then ``fsync``, so after a
kill the file holds whole lines plus at most one unterminated last line. Readers (`read_json_lines`) drop that
torn last line; a damaged line anywhere else is an error naming the file and the line.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from replayloader.state import StateFileError, atomic_write_text


class JsonLinesWriter:
    """Append records to ``path``; a torn last line left by a killed writer is cut off when the file is opened."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        _cut_torn_tail(self._fd)

    def write(self, record: dict) -> None:
        data = (json.dumps(record) + "\n").encode("utf-8")
        written = os.write(self._fd, data)
        while written < len(data):  # a short write happens only on a full disk, which the next call reports
            written += os.write(self._fd, data[written:])
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _cut_torn_tail(fd: int) -> None:
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    block = 1 << 16
    end = size
    while end > 0:  # find the last newline: everything after it is a torn record
        start = max(0, end - block)
        chunk = os.pread(fd, end - start, start)
        cut = chunk.rfind(b"\n")
        if cut >= 0:
            os.ftruncate(fd, start + cut + 1)
            return
        end = start
    os.ftruncate(fd, 0)


def read_json_lines(path: str | Path) -> list[dict]:
    """Every record of a JSON-lines file; an unterminated last line (a writer killed mid-write) is dropped."""
    path = Path(path)
    text = path.read_bytes().decode("utf-8", errors="replace")
    lines = text.split("\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if number == len(lines):  # no newline after it: torn by a kill, never a complete record
                break
            raise StateFileError(path, f"line {number} is not JSON ({exc.msg})") from None
    return records


def rewrite_json_lines(path: str | Path, records: list[dict]) -> None:
    """Replace the file with ``records`` in one atomic step (a kill leaves the old file or the new one)."""
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))

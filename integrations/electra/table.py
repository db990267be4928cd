"""`Columns`: a small in-memory table of named columns, what the integration reads local files into.

Local text and GLUE TSV files need no `datasets`: they are read into a `Columns`, which answers the few calls the
pipeline makes on a table, the same way a `datasets.Dataset` does (``len``, a column by name as a list, a row by
index as a dict, a slice as a dict of lists, ``select``, ``select_columns``, ``column_names``). Hub data still
loads through `datasets` when online (`from_dataset` turns a small one into a `Columns`).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


class Columns:
    """Named columns of equal length, held as Python lists."""

    def __init__(self, columns: Mapping[str, Sequence[Any]]):
        self._columns = {name: list(values) for name, values in columns.items()}
        lengths = {len(values) for values in self._columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"columns differ in length: {({n: len(v) for n, v in self._columns.items()})}")
        self._length = lengths.pop() if lengths else 0

    @classmethod
    def from_dataset(cls, dataset: Any, columns: Iterable[str] | None = None) -> Columns:
        """A `datasets.Dataset`'s columns (all, or ``columns``), read into memory."""
        names = list(dataset.column_names if columns is None else columns)
        return cls({name: dataset[name] for name in names})

    @property
    def column_names(self) -> list[str]:
        return list(self._columns)

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, key: str | int | slice) -> Any:
        if isinstance(key, str):
            if key not in self._columns:
                raise KeyError(f"no column {key!r} (columns: {', '.join(self._columns)})")
            return list(self._columns[key])
        if isinstance(key, slice):
            return {name: values[key] for name, values in self._columns.items()}
        index = range(self._length)[key]  # an IndexError past the end, negative indices from the end
        return {name: values[index] for name, values in self._columns.items()}

    def select(self, indices: Iterable[int]) -> Columns:
        """The rows at ``indices``, in that order."""
        rows = [range(self._length)[int(i)] for i in indices]
        return Columns({name: [values[i] for i in rows] for name, values in self._columns.items()})

    def select_columns(self, names: Iterable[str]) -> Columns:
        names = list(names)
        missing = [name for name in names if name not in self._columns]
        if missing:
            raise KeyError(f"no column(s) {', '.join(missing)} (columns: {', '.join(self._columns)})")
        return Columns({name: self._columns[name] for name in names})

    def __repr__(self) -> str:
        return f"Columns({', '.join(self._columns)}; {self._length} rows)"

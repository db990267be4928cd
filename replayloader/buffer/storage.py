"""Preallocated field arrays, written and gathered by slot index.

Storage keeps data where it was produced: numpy arrays stay numpy, torch tensors stay on their device (a GPU
buffer never copies examples to the host; only slot indices cross). The schema (field names, per-example shape,
dtype, device) is fixed by the first add; later adds must match it exactly.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .._arrays import is_torch_tensor, to_numpy  # noqa: F401 (re-exported: the old home)
from ..state.checks import field, require


class FieldSpec:
    """Shape, dtype and kind of one field; used to check that every add matches the first."""

    __slots__ = ("name", "shape", "dtype", "kind", "device")

    def __init__(self, name: str, value: Any) -> None:
        self.name = name
        self.kind = "torch" if is_torch_tensor(value) else "numpy"
        self.shape = tuple(value.shape[1:])
        self.dtype = value.dtype
        self.device = str(value.device) if self.kind == "torch" else "cpu"

    def describe(self) -> str:
        where = f" on {self.device}" if self.kind == "torch" else ""
        return f"{self.kind} {self.dtype} per-example shape {self.shape}{where}"

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "shape": list(self.shape), "dtype": str(self.dtype),
                "device": self.device}


class Storage:
    """Arrays of shape (capacity, *field_shape), created lazily from the first batch."""

    def __init__(self, capacity: int, device: Any = None) -> None:
        self.capacity = capacity
        self.device = device  # optional override for torch storage (e.g. keep a CPU-produced batch on cuda)
        self.specs: dict[str, FieldSpec] = {}
        self.fields: dict[str, Any] = {}

    @property
    def initialized(self) -> bool:
        return bool(self.specs)

    def check_batch(self, batch: Mapping[str, Any]) -> int:
        """Validate a batch against the schema (or as a first schema) and return its batch size.

        Raises before anything is written, so a bad add leaves the buffer untouched.
        """
        specs = self.specs
        if specs and type(batch) is dict and len(batch) == len(specs):  # fast path: numpy fields as before
            size = -1
            for name, value in batch.items():
                spec = specs.get(name)
                if (spec is None or type(value) is not np.ndarray or spec.kind != "numpy" or value.dtype != spec.dtype
                        or value.ndim != len(spec.shape) + 1 or value.shape[1:] != spec.shape
                        or (size >= 0 and value.shape[0] != size)):
                    break
                size = value.shape[0]
            else:
                return size
        return self._check_batch_slowly(batch)

    def _check_batch_slowly(self, batch: Mapping[str, Any]) -> int:
        if not isinstance(batch, Mapping) or not batch:
            raise TypeError(f"batch must be a non-empty mapping of field name -> array, got {type(batch).__name__}")
        size = None
        for name, value in batch.items():
            if not isinstance(name, str):
                raise TypeError(f"batch field names must be strings, got {name!r}")
            if not (is_torch_tensor(value) or isinstance(value, np.ndarray)):
                raise TypeError(f"batch[{name!r}] must be a numpy array or torch tensor, got {type(value).__name__}")
            if value.ndim < 1:
                raise ValueError(f"batch[{name!r}] needs a leading batch dimension, got a scalar")
            if size is None:
                size = int(value.shape[0])
            elif value.shape[0] != size:
                raise ValueError(f"batch[{name!r}] has {value.shape[0]} examples but other fields have {size}")
        if self.specs:
            if len(batch) != len(self.specs) or any(name not in self.specs for name in batch):
                raise ValueError(f"batch fields {sorted(batch)} do not match the buffer's fields {sorted(self.specs)}")
            for name, value in batch.items():
                want = self.specs[name]
                if (value.shape[1:] != want.shape or value.dtype != want.dtype
                        or (want.kind == "torch") != is_torch_tensor(value)):
                    got = FieldSpec(name, value)
                    raise ValueError(f"batch[{name!r}] is {got.describe()}, but the buffer stores {want.describe()}")
        return size

    def _allocate(self, batch: Mapping[str, Any]) -> None:
        for name, value in batch.items():
            spec = FieldSpec(name, value)
            if spec.kind == "torch":
                import torch

                device = self.device if self.device is not None else value.device
                self.fields[name] = torch.zeros((self.capacity, *spec.shape), dtype=value.dtype, device=device)
                spec.device = str(self.fields[name].device)
            else:
                self.fields[name] = np.zeros((self.capacity, *spec.shape), dtype=value.dtype)
            self.specs[name] = spec

    def write(self, slots: np.ndarray, batch: Mapping[str, Any], run_start: int = -1) -> None:
        """Write row j of every field to slot ``slots[j]``; ``run_start >= 0`` says the slots are consecutive
        from there (a slice copy, cheaper than a scatter)."""
        if not self.specs:
            self._allocate(batch)
        for name, value in batch.items():
            store = self.fields[name]
            if self.specs[name].kind == "torch":
                index = _torch_index(slots, store.device)
                store.index_copy_(0, index, value.detach().to(store.device))
            elif run_start >= 0:
                store[run_start: run_start + len(slots)] = value
            else:
                store[slots] = value

    def gather(self, slots: np.ndarray) -> dict[str, Any]:
        out = {}
        for name, store in self.fields.items():
            if self.specs[name].kind == "torch":
                out[name] = store.index_select(0, _torch_index(slots, store.device))
            else:
                out[name] = store.take(slots, axis=0)
        return out

    def state_dict(self) -> dict:
        """A snapshot: fields are copied (on their device), so later writes do not leak into a saved state."""
        fields = {k: (v.clone() if is_torch_tensor(v) else v.copy()) for k, v in self.fields.items()}
        return {"specs": [s.to_json() for s in self.specs.values()], "fields": fields}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a `state_dict`: all or nothing (see `checked_state`)."""
        self.commit_state(self.checked_state(state))

    def checked_state(self, state: Any) -> tuple[dict[str, FieldSpec], dict[str, Any]]:
        """The specs and fields a `state_dict` describes, each field checked against its spec (name, kind,
        dtype, per-example shape, ``capacity`` rows) and copied; raises `InvalidState` before anything changes."""
        where = "storage state"
        spec_list = field(state, "specs", where)
        stored = field(state, "fields", where)
        require(isinstance(spec_list, list) and isinstance(stored, Mapping),
                f"{where} must hold a list of 'specs' and a mapping of 'fields'")
        names = [spec.get("name") if isinstance(spec, Mapping) else None for spec in spec_list]
        require(all(isinstance(name, str) for name in names) and len(set(names)) == len(names)
                and set(names) == set(stored), f"{where}: spec names {names} must be distinct and match the "
                                               f"fields {sorted(map(str, stored))}")
        specs, fields = {}, {}
        for spec_json in spec_list:
            name = spec_json["name"]
            kind, shape, dtype = (spec_json.get(key) for key in ("kind", "shape", "dtype"))
            require(kind in ("numpy", "torch") and isinstance(shape, list)
                    and all(isinstance(d, int) and d >= 0 for d in shape) and isinstance(dtype, str),
                    f"{where}: spec of field {name!r} is malformed: {spec_json!r}")
            value = stored[name]
            if kind == "torch":
                value = self._checked_tensor(name, value, shape, dtype, spec_json.get("device"))
            else:
                require(isinstance(value, np.ndarray) and value.dtype.kind not in "OV" and str(value.dtype) == dtype,
                        f"{where}: field {name!r} must be a numpy array of dtype {dtype}, got "
                        f"{getattr(value, 'dtype', type(value).__name__)}")
                value = np.array(value, copy=True)
            require(tuple(value.shape) == (self.capacity, *shape),
                    f"{where}: field {name!r} has shape {tuple(value.shape)}, expected {(self.capacity, *shape)}")
            spec = FieldSpec(name, value[:1])
            specs[name], fields[name] = spec, value
        return specs, fields

    def _checked_tensor(self, name: str, value: Any, shape: list, dtype: str, device: Any) -> Any:
        import torch

        if not is_torch_tensor(value):
            require(isinstance(value, np.ndarray) and value.dtype.kind not in "OV",
                    f"storage state: field {name!r} must be a tensor or array, got {type(value).__name__}")
            value = torch.as_tensor(np.asarray(value))
        require(str(value.dtype) == dtype, f"storage state: field {name!r} has dtype {value.dtype}, expected {dtype}")
        device = self.device if self.device is not None else device
        if device is None or (str(device).startswith("cuda") and not torch.cuda.is_available()):
            device = "cpu"
        return value.to(device).clone()

    def commit_state(self, checked: tuple[dict[str, FieldSpec], dict[str, Any]]) -> None:
        """Take what `checked_state` returned (cannot fail)."""
        self.specs, self.fields = checked


def _torch_index(slots: np.ndarray, device: Any):
    import torch

    return torch.from_numpy(np.ascontiguousarray(slots, np.int64)).to(device, non_blocking=True)

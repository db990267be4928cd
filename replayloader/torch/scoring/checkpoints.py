"""The checks both scorers' ``load_state_dict`` share: the state version, a model's layout (the state-dict keys
and shapes a refresh or a checkpoint must match) and the counters and seconds of `stats`."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ...state.checks import field, integer as state_integer, number as state_number, require

STATE_VERSION = 1


def layout(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """The model's state-dict keys and shapes: what a refresh or a checkpoint must match."""
    return {key: tuple(value.shape) for key, value in model.state_dict().items()}


def check_layout(state: Mapping, expected: Mapping[str, tuple[int, ...]], name: str, error=ValueError) -> None:
    """Raise ``error`` naming ``name`` unless ``state`` has exactly the keys and shapes of ``expected``."""
    missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or extra:
        raise error(f"{name} does not match the scorer's model: missing keys {missing[:5]}, unexpected keys "
                    f"{extra[:5]}")
    for key, shape in expected.items():
        value = state[key]
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
            got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise error(f"{name}[{key!r}] must be a tensor of shape {shape}, got {got}")


def meters(state: Mapping, where: str, counter_keys: Sequence[str],
            second_keys: Sequence[str]) -> tuple[dict[str, int], dict[str, float]]:
    """A scorer state's ``counters`` (integers >= 0) and ``seconds`` (numbers >= 0), each with exactly its keys:
    the one check both scorers' loads share."""
    out = []
    for key, names, read in (("counters", counter_keys, state_integer), ("seconds", second_keys, state_number)):
        part = field(state, key, where)
        require(isinstance(part, Mapping) and set(part) == set(names), f"{where}['{key}'] must have the keys "
                f"{sorted(names)}")
        out.append({name: read(part, name, f"{where}['{key}']", 0) for name in names})
    return out[0], out[1]

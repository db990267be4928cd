"""The one check of a feedback call: prompt indices and their rewards, read into one row of G rewards per group.

Every prompt sampler and baseline of this package reads its feedback here, before anything changes, so the same
bad input gets the same sentence everywhere (naming the argument and the value). Two layouts are accepted,
because trainers hold rewards both ways:

- group level: ``prompt_indices`` of shape (k,) and ``rewards`` of shape (k, G), one row per prompt;
- completion level (TRL's ``inputs``): ``prompt_indices`` and ``rewards`` of shape (k·G,), each prompt's index
  ``G`` times in a row, as `trl.trainer.utils.RepeatSampler` lays them out; ``G`` must then be known.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import _checks as checks
from .._arrays import to_numpy


def read_groups(prompt_indices: Any, rewards: Any, *, group_size: int | None, binary: bool, num_prompts: int | None,
                drawn: Any = None, rule_name: str = "") -> tuple[np.ndarray, np.ndarray]:
    """``(indices (k,) int64, rewards (k, G) float64)`` from one feedback call, every value checked; else a
    ValueError naming the argument and the value. ``num_prompts``: N (None: any index >= 0); ``drawn``: which
    prompts the caller ever handed out (feedback for any other is refused: it cannot come from its batches), a
    boolean mask or anything that gives one at an index array (read only at the indices checked)."""
    indices, values = _read(prompt_indices, rewards, num_prompts, drawn)
    given = values  # as the caller shaped it: errors name its positions
    if values.ndim == 2:
        if values.shape[0] != len(indices):
            raise ValueError(f"rewards must have one row per prompt, shape ({len(indices)}, G) for "
                             f"{len(indices)} prompt_indices, got {values.shape}")
    elif values.ndim == 1:
        indices, values = _completion_level(indices, values, group_size)
    else:
        raise ValueError(f"rewards must have shape (prompts, G) or (completions,), got {values.shape}")
    size = values.shape[1]
    if size < 2:
        raise ValueError(f"rewards must hold at least 2 completions per group (one has no spread), got groups of "
                         f"{size}")
    if group_size is not None and size != group_size:
        raise ValueError(f"rewards has groups of {size} completions but group_size={group_size}")
    bad = np.flatnonzero(~np.isfinite(given))
    if len(bad):
        raise ValueError(f"rewards must be finite; rewards[{_position(given, bad[0])}] = "
                         f"{float(given.reshape(-1)[bad[0]])}")
    if binary:
        bad = np.flatnonzero((given != 0) & (given != 1))
        if len(bad):
            value = float(given.reshape(-1)[bad[0]])
            raise ValueError(f"rewards must be 0 or 1 for {rule_name or 'this rule'} (a pass rate); rewards"
                             f"[{_position(given, bad[0])}] = {value!r} (use RewardSpread for graded rewards)")
    return indices, values


def _position(values: np.ndarray, flat: int) -> str:
    """Where the ``flat``-th entry (C order) of ``values`` is, as its index would be written: ``9`` or ``2, 1``."""
    return ", ".join(str(int(i)) for i in np.unravel_index(flat, values.shape))


def read_completions(prompt_indices: Any, rewards: Any, *, group_size: int, num_prompts: int,
                     drawn: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One rank's share of a generation batch as ``(indices, rewards)``, one entry per completion: what each rank
    of a distributed sampler checks before the shares are gathered. A share may start or end inside a group (TRL
    splits the generation batch by completions), so whole groups are checked only after the gather, by
    `read_groups` on the concatenated shares. Rows of a (k, ``group_size``) reward array are flattened."""
    indices, values = _read(prompt_indices, rewards, num_prompts, drawn)
    if values.ndim == 2 and values.shape == (len(indices), group_size):
        indices, values = np.repeat(indices, group_size), values.reshape(-1)
    elif values.ndim == 2:
        raise ValueError(f"rewards must have shape ({len(indices)}, {group_size}) (a row of group_size rewards "
                         f"per prompt) or ({len(indices)},) (one per completion), got {values.shape}")
    elif values.shape != indices.shape:
        raise ValueError(f"rewards must have one value per completion, shape ({len(indices)},) for "
                         f"{len(indices)} prompt_indices, got {values.shape}")
    checks.all_finite("rewards", values)
    return indices, values


def _read(prompt_indices: Any, rewards: Any, num_prompts: int | None, drawn: Any) -> tuple[np.ndarray, np.ndarray]:
    """The indices (1-D integers in range, each drawn) and the rewards (numbers, as a float64 copy)."""
    indices = checks.index_array("prompt_indices", prompt_indices)
    bad = np.flatnonzero((indices < 0) | (indices >= num_prompts if num_prompts is not None else False))
    if len(bad):
        bound = f"in [0, {num_prompts})" if num_prompts is not None else ">= 0"
        raise ValueError(f"prompt_indices must lie {bound}; prompt_indices[{bad[0]}] = {indices[bad[0]]}")
    never = np.flatnonzero(~drawn[indices]) if drawn is not None else ()
    if len(never):
        raise ValueError(f"prompt_indices[{never[0]}] = {indices[never[0]]} was never drawn by this sampler")
    values = to_numpy(rewards, "rewards")
    if values.dtype.kind not in "fiub":
        raise ValueError(f"rewards must be numbers, got dtype {values.dtype}")
    return indices, np.array(values, np.float64)  # a copy: the caller's array is never kept


def _completion_level(indices: np.ndarray, values: np.ndarray, group_size: int | None) -> tuple[np.ndarray, np.ndarray]:
    """One index and one reward per completion, each prompt ``group_size`` times in a row → one row per group."""
    if len(values) != len(indices):
        raise ValueError(f"rewards must have one value per completion, shape ({len(indices)},) for "
                         f"{len(indices)} prompt_indices, got {values.shape}")
    if group_size is None:
        raise ValueError("rewards has one value per completion, so the group size must be known: build the "
                         "sampler with group_size=G, or pass rewards of shape (prompts, G)")
    if len(values) % group_size:
        raise ValueError(f"rewards holds {len(values)} completions, not a multiple of group_size={group_size}")
    rows = indices.reshape(-1, group_size)
    odd = np.flatnonzero((rows != rows[:, :1]).any(axis=1))
    if len(odd):
        row = rows[odd[0]]
        at = odd[0] * group_size + int(np.flatnonzero(row != row[0])[0])
        raise ValueError(f"prompt_indices must repeat each prompt group_size={group_size} times in a row; "
                         f"prompt_indices[{at}] = {indices[at]} differs from prompt_indices[{at - 1}] = "
                         f"{indices[at - 1]} inside one group")
    return np.ascontiguousarray(rows[:, 0]), values.reshape(-1, group_size)

"""The cost model of a selection step, as two functions (docs/selection.md, "Cost model").

Counting in forward-row units (one forward pass over one row = 1; a backward = ``backward_cost`` forwards, about 2),
a uniform step of n_b rows costs (1 + b)·n_b. A selection step scores a pool of n_B rows once for every m steps
(`ReusedPool`) and trains n_b rows: n_B / m + (1 + b)·n_b. Per trained row that is (n_B / n_b) / m scoring
forward rows (what ``stats()["forward_rows_per_trained_row"]`` reports) plus the row's own forward + backward.

Selection pays in time when it needs enough fewer steps to make up for its dearer step and for the one-time
irreducible-loss model:

    steps_uniform / steps_select  >  cost_select / cost_uniform  +  IL / (steps_select · cost_uniform)

where IL is the irreducible-loss model's cost (its fit, or its fit / R when R runs share it). Background scoring
(`replayloader.torch.scoring`) takes the n_B / m term off the critical path while the scorer keeps up; the
ratio then nears 1 in wall time (not in CPU time).
"""
from __future__ import annotations

from .. import _checks as checks


def step_cost_ratio(pool: int, chosen: int, *, reuse: int = 1, backward_cost: float = 2.0) -> float:
    """cost_select / cost_uniform of one step in forward-row units: (n_B / m + (1 + b) n_b) / ((1 + b) n_b), for a
    pool of n_B = ``pool`` rows, n_b = ``chosen`` trained rows, m = ``reuse`` steps per pool, b = ``backward_cost``.
    E.g. n_B = 320, n_b = 32, m = 1, b = 2: 4.33; m = 4: 1.83."""
    pool = checks.integer("pool", pool, 1)
    chosen = checks.integer("chosen", chosen, 1, pool)
    reuse = checks.integer("reuse", reuse, 1)
    backward_cost = checks.number("backward_cost", backward_cost, 0.0)
    train = (1.0 + backward_cost) * chosen
    return (pool / reuse + train) / train


def break_even_step_ratio(cost_ratio: float, *, il_cost: float = 0.0, select_steps: int | None = None) -> float:
    """The smallest steps_uniform / steps_select at which selection pays in time: ``cost_ratio`` (a selection
    step's cost over a uniform step's, measured or `step_cost_ratio`) plus the irreducible-loss model's share,
    ``il_cost / select_steps`` with ``il_cost`` in uniform-step units (its seconds / a uniform step's seconds;
    divide by the number of runs that share it to amortize it). ``select_steps`` is needed when ``il_cost`` > 0."""
    cost_ratio = checks.number("cost_ratio", cost_ratio, 0.0, low_open=True)
    il_cost = checks.number("il_cost", il_cost, 0.0)
    if il_cost > 0:
        if select_steps is None:
            raise ValueError("select_steps is needed to share il_cost over the selection run's steps")
        return cost_ratio + il_cost / checks.integer("select_steps", select_steps, 1)
    return cost_ratio

"""The cost model of a selection step, as two functions (docs/selection.md, "Cost model").

Counting in forward-row units (one forward pass over one row = 1; a backward = ``backward_cost`` forwards, about 2),
a uniform step of n_b rows costs (1 + b)·n_b. A selection step scores a pool of n_B rows once for every m steps
(`ReusedPool`) and trains n_b rows: n_B / m + (1 + b)·n_b. Per trained row that is (n_B / n_b) / m scoring
forward rows (what ``stats()["forward_rows_per_trained_row"]`` reports) plus the row's own forward + backward.

Selection pays in time when it needs enough fewer steps to make up for its dearer step and for the one-time
irreducible-loss model:

    steps_uniform / steps_select  >  cost_select / cost_uniform  +  IL / (steps_select · cost_uniform)

where IL is the irreducible-loss model's cost (its fit, or its fit / R when R runs share it), in the units of the
step costs: seconds on one clock, or forward-row units. `break_even_step_ratio` takes IL in seconds together with
a uniform step's seconds (``il_seconds``, ``uniform_step_seconds``), or already in uniform steps (``il_cost``).
`step_cost_ratio` is the model, not a measurement: a real step also pays work that does not grow with rows, so
measure your own (``bench/selection_step_cost.py``; docs/selection.md quotes what it measured). Background
scoring (`replayloader.torch.scoring`) takes the n_B / m term off the critical path while the scorer keeps up;
the ratio then nears 1 in wall time (not in CPU time).
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


def break_even_step_ratio(cost_ratio: float, *, il_seconds: float | None = None,
                          uniform_step_seconds: float | None = None, select_steps: int | None = None,
                          il_cost: float | None = None) -> float:
    """The smallest steps_uniform / steps_select at which selection pays in time: ``cost_ratio`` (a selection
    step's cost over a uniform step's, measured or `step_cost_ratio`) plus the irreducible-loss (IL) model's
    share, C_IL / (steps_select · cost_uniform).

    Give the IL model's cost in seconds, with the seconds of one uniform step measured on the same clock:
    ``il_seconds`` (`IrreducibleModel.cpu_s` with ``uniform_step_seconds`` from ``time.process_time``, or
    ``wall_s`` with ``time.perf_counter``; ``cost_amortized(R)[...]`` when R runs share the IL model) and
    ``uniform_step_seconds``. Why both: the share is a ratio of seconds to seconds, and seconds passed alone
    would be read as uniform steps, a bar too low by the factor 1 / (a uniform step's seconds).
    ``il_cost``: the same cost already in uniform-step units (C_IL / a uniform step's cost, e.g. from forward-row
    counts); not with ``il_seconds``. ``select_steps``: the selection run's steps, needed when the IL cost is > 0.
    """
    cost_ratio = checks.number("cost_ratio", cost_ratio, 0.0, low_open=True)
    if il_seconds is not None:
        if il_cost is not None:
            raise ValueError(f"give the IL model's cost once: il_seconds={il_seconds!r} (seconds, with "
                             f"uniform_step_seconds) or il_cost={il_cost!r} (uniform steps), not both")
        if uniform_step_seconds is None:
            raise ValueError("il_seconds needs uniform_step_seconds (the measured seconds of one uniform step, on "
                             "the same clock) to be put in uniform steps")
        il_seconds = checks.number("il_seconds", il_seconds, 0.0)
        uniform_step_seconds = checks.number("uniform_step_seconds", uniform_step_seconds, 0.0, low_open=True)
        il_steps = il_seconds / uniform_step_seconds
    elif uniform_step_seconds is not None:
        raise ValueError(f"uniform_step_seconds={uniform_step_seconds!r} is only used with il_seconds (the IL "
                         f"model's cost in seconds); il_cost is in uniform steps already")
    else:
        il_steps = checks.number("il_cost", 0.0 if il_cost is None else il_cost, 0.0)
    if il_steps > 0:
        if select_steps is None:
            raise ValueError("select_steps is needed to share the IL model's cost over the selection run's steps")
        return cost_ratio + il_steps / checks.integer("select_steps", select_steps, 1)
    return cost_ratio

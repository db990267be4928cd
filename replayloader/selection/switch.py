"""`SelectionSwitch`: select only while selection buys more learning per second than uniform training, and stop
once the learner has passed the irreducible-loss model.

What it measures (online, from numbers the loop has anyway). Each step starts with an estimate of the learnable
loss left, Y = mean over a uniform sample of max(score, 0), where score = training loss - irreducible loss (the
`Selector`'s score: `ReducibleLoss`; with `TrainingLoss` it is the training loss). A selection step has that
sample for free: its candidates (drawn uniformly, ``alpha=0``) were just scored. A uniform step has it too: the
rows it trains are a uniform sample, and their training forward gives their losses (`step_done(losses=...)`).
Steps are grouped in windows of ``window`` steps; a window's *rate* is how fast Y falls per unit of cost,

    rate = -slope of the least-squares line through (c_t, Y_t), t in the window,

where c_t is the cost spent before step t: seconds (``cost="seconds"``, passed to `step_done`) or forward-row
units (``cost="rows"``: a step costs scored rows + (1 + backward_cost) x trained rows; a backward is about
``backward_cost`` forwards). So the rate is gain per second (or per unit of compute), with the cost of scoring
in it.

(i) On while it pays. The switch runs its preferred mode (selection at the start) and every ``probe_every``-th
window probes the other mode (windows 1, 1 + p, 1 + 2p, ...). After the window that follows a probe it compares
the probe's rate with the mean rate of the two windows around it (which cancels a trend that is linear in
time: rates fall as training goes on), and adopts the probe's mode if it was faster:

    switch to the probed mode  iff  rate(probe) > m + margin * |m|,   m = (rate(before) + rate(after)) / 2.

(ii) Off past the irreducible-loss model. RHO-LOSS stalls near the irreducible-loss (IL) model's own quality: once
the learner's loss is below the IL model's on most rows, the reducible loss has no signal left to select by (it
then picks mislabelled rows at about the pool's rate; docs/selection.md, 'What "stalls" means'). When at least
half of a window's measured scores are <= ``stop_at`` (the median reducible loss <= 0 by default) the switch
turns selection off for good, and says so in `stats`.

Why these and not Katharopoulos & Fleuret's variance-reduction estimate: that bound rates importance *sampling*
by gradient norms; RHO-LOSS's gain is in skipping mislabelled and learnt rows, which the bound does not see. A
back-of-envelope case: if 20% of the rows are mislabelled and score about 0 while the others score alike, the
bound's equivalent-batch gain is mean(G^2) / mean(G)^2 = 1 / 0.8 = 1.25x, below the ~2x cost of a selection step,
while the pilot of issue 28 measured RHO needing 2.4-3x fewer steps: the bound would turn RHO off where it pays.
The windows measure the gain itself, in the units the decision is about.

The loop, one process (``switch`` goes where a `Selector` goes: `CandidateBatchSampler`, `ScoreThenSelect`)::

    candidates = batches.next_batch_info()
    if switch.selecting:                         # score the pool, choose n_b rows
        chosen = batches.choose(candidates, scores_of(candidates))
        train_on(chosen)
        switch.step_done(seconds=...)            # seconds only with cost="seconds"; else a no-op
    else:                                        # a uniform step: n_b random candidates, nothing scored
        chosen = switch.uniform(candidates)
        per_example = train_on(chosen)           # the training forward's per-example losses
        switch.step_done(per_example.detach(), seconds=...)

`SelectingTrainer` (HF) asks the switch first and skips the scoring forward in a uniform step. Where scoring
cannot be skipped (a loop that always scores, or `SelectingTrainer` under several processes) ``choose`` in a
uniform window takes a uniform random subset of the scored pool: the switch still decides and stops, but a
uniform step then costs the scoring too (it is counted). Under DDP the state stays identical on
every rank when every rank passes the same numbers to `step_done` (gather the uniform rows' losses and indices,
and agree on the seconds, e.g. their maximum); selection steps are gathered by `DistributedScoreThenSelect`.

Exact resume: the state holds the window's sums, the recent rates, the mode and an open step; a checkpoint taken
mid-window continues with the same decisions for the same measurements.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .. import _checks as checks
from .._arrays import to_numpy
from ..kernels.rng import uniforms
from ..state.checks import array, counters as counter_fields, field, integer, number, require
from .rules import Selection, Selector
from .wrapped import WrappedSelector

SELECT, UNIFORM = "select", "uniform"
_ACC = 8  # window sums: points, sum c, sum y, sum c^2, sum c y, scores <= stop_at, scores, cost at window start
_OPEN = 6  # an open step: sum of max(score, 0), scores, scores <= stop_at, scored rows, trained rows, selecting


def window_rate(costs: np.ndarray, values: np.ndarray) -> float:
    """-slope of the least-squares line through (costs, values): how fast the value falls per unit of cost
    (NaN with fewer than 2 distinct costs)."""
    costs, values = np.asarray(costs, float), np.asarray(values, float)
    n = len(costs)
    if n < 2:
        return math.nan
    return _rate_from_sums(n, costs.sum(), values.sum(), (costs * costs).sum(), (costs * values).sum())


def _rate_from_sums(n: float, sc: float, sy: float, scc: float, scy: float) -> float:
    var = scc - sc * sc / n
    if n < 2 or not var > 1e-12 * max(scc, 1e-300):
        return math.nan
    return -(scy - sc * sy / n) / var


class SelectionSwitch(WrappedSelector):
    """Select while it pays, uniform otherwise; off for good once the learner passes the irreducible-loss model.

    Experimental: no measurement in this repository yet shows it paying for itself; it may change or go until
    one does (docs/selection.md, "Experimental levers").

    Args:
        selector: the `Selector` used in selection steps; its rule must pick a fixed k (n_b), which is also the
            number of rows a uniform step trains.
        window: steps per measurement window (>= 2).
        probe_every: p, windows between probes of the other mode (>= 3; a probe costs 1/p of the run).
        stop_at: turn selection off for good when at least half of a window's scores are <= stop_at (None: never).
        cost: "rows" (forward-row units: scored + (1 + backward_cost) x trained) or "seconds" (pass ``seconds=``
            to `step_done` every step).
        backward_cost: a backward pass in forward passes, for ``cost="rows"``.
        margin: the probe must beat the mean of its neighbours by this fraction of it to switch.

    `stats` adds the fraction of steps that selected, the mode, whether it stopped, the reason of the last switch
    and the last comparison, the measured rates, forward rows per trained row and seconds per step by mode.
    """

    part = "switch"

    def __init__(self, selector: Selector, *, window: int = 20, probe_every: int = 5, stop_at: float | None = 0.0,
                 cost: str = "rows", backward_cost: float = 2.0, margin: float = 0.0) -> None:
        super().__init__(selector)
        if selector.rule.k is None:
            raise ValueError(f"SelectionSwitch needs a rule that picks a fixed k (TopK, Proportional): a uniform step "
                             f"trains k rows; {type(selector.rule).__name__} keeps a varying number")
        self.window = checks.integer("window", window, 2)
        self.probe_every = checks.integer("probe_every", probe_every, 3)
        self.stop_at = None if stop_at is None else checks.number("stop_at", stop_at)
        if cost not in ("rows", "seconds"):
            raise ValueError(f"cost must be 'rows' or 'seconds', got {cost!r}")
        self.cost = cost
        self.backward_cost = checks.number("backward_cost", backward_cost, 0.0)
        self.margin = checks.number("margin", margin, 0.0)
        self.steps = 0
        self.preferred, self.stopped = SELECT, False
        self.reason = "start: selection preferred until the first probe is measured"
        self.last_decision = ""
        self.acc = np.zeros(_ACC)
        self.rates = np.full(3, np.nan)  # the last three windows' rates, oldest first
        self.cum_cost = 0.0
        self.open = np.zeros(_OPEN)
        self.open_mode = ""  # "", SELECT or UNIFORM: a step begun by choose / uniform and not ended yet
        self.open_indices: np.ndarray | None = None
        self.switch_counters = {"steps": 0, "selecting_steps": 0, "switches": 0, "scored_rows": 0,
                                "trained_rows": 0}
        self.seconds = np.zeros(2)  # measured seconds of selecting and of uniform steps

    # ------------------------------------------------------------------ the mode
    def _mode_of_window(self, index: int) -> str:
        if self.stopped:
            return UNIFORM
        probe = index % self.probe_every == 1
        return (UNIFORM if self.preferred == SELECT else SELECT) if probe else self.preferred

    @property
    def selecting(self) -> bool:
        """Whether the next step selects (score its candidates, then ``choose``) or trains uniform rows
        (`uniform`). Asked between steps."""
        if self.open_mode:
            raise RuntimeError("a step is still open: end it with step_done(...) before asking for the next mode")
        return self._mode_of_window(self.steps // self.window) == SELECT

    # ------------------------------------------------------------------ steps
    def _begin(self) -> None:
        """A new step may begin only when the previous one has ended."""
        if self.open_indices is not None:
            raise ValueError("the previous uniform step is still open: end it with step_done(losses) first")
        if self.open_mode:
            raise ValueError("the previous step is still open: end it with step_done(seconds=...) first")

    def choose_split(self, losses: Sequence[Any], indices: Sequence[Any] | None = None,
                     candidate_weights: Sequence[Any] | None = None,
                     before_commit: Callable[[list[Selection]], None] | None = None,
                     short_batch: bool = False) -> list[Selection]:
        """A scored candidate batch (one slice per rank, as `Selector.choose_split`). In a selection window: the
        rule's rows. In a uniform window (the loop scored anyway, e.g. `SelectingTrainer` under DDP): k / S uniformly random
        rows of each slice, with the candidates' own weights. Either way every score is measured."""
        self._begin()
        selecting = self._mode_of_window(self.steps // self.window) == SELECT
        if selecting:
            selections = Selector.choose_split(self, losses, indices, candidate_weights, before_commit, short_batch)
        else:
            checked = self._checked_slices(losses, indices, candidate_weights, short_batch)
            rng = self.rng_state.copy()
            selections = [self._uniform_rows(rng, len(scores), self.rule.k // len(checked), slice_indices,
                                             slice_weights, scores)
                          for scores, slice_indices, slice_weights in checked]
            if before_commit is not None:
                before_commit(selections)
            self.rng_state = rng
            self.counters["batches"] += 1
            self.counters["scored"] += sum(len(s.scores) for s in selections)
            self.counters["selected"] += sum(len(s) for s in selections)
        scores = np.concatenate([s.scores for s in selections])
        self._open(scores, len(scores), sum(len(s) for s in selections), selecting)
        if self.cost == "rows":
            self._commit(None)
        return selections

    def uniform(self, candidates: Any, *, rows: int | None = None) -> Selection:
        """A uniform step's rows: ``rows`` (default k = n_b; under DDP k / world size) uniformly random rows of
        ``candidates`` (a drawn batch with ``indices`` and ``weights``, e.g. `SampledBatch` / `RankBatch`, or an
        integer array of dataset indices), without scoring anything. Positions index ``candidates``; end the step
        with ``step_done(losses)`` (the trained rows' per-example losses from the training forward). Refused in a
        selection window."""
        self._begin()
        if self._mode_of_window(self.steps // self.window) == SELECT:
            raise ValueError("this step selects: score the candidates and call choose() (ask switch.selecting)")
        if isinstance(candidates, np.ndarray) or isinstance(candidates, (list, tuple)):
            indices, weights = to_numpy(candidates, "candidates"), None
        elif hasattr(candidates, "indices"):
            indices, weights = to_numpy(candidates.indices, "candidates.indices"), getattr(candidates, "weights", None)
        else:
            raise TypeError(f"candidates must be a drawn batch (with indices) or an array of dataset indices, got "
                            f"{type(candidates).__name__}")
        indices = checks.index_array("candidates' indices", indices)
        n = len(indices)
        rows = min(self.rule.k, n) if rows is None else checks.integer("rows", rows, 1, n)
        if weights is not None:
            weights = np.asarray(to_numpy(weights, "candidates.weights"), np.float64)
            if weights.shape != (n,):
                raise ValueError(f"candidates.weights must have shape ({n},), got {weights.shape}")
        rng = self.rng_state.copy()
        selection = self._uniform_rows(rng, n, rows, indices, weights, np.full(n, np.nan))
        self.rng_state = rng
        self._open(np.empty(0), 0, len(selection), False)
        self.open_indices = selection.indices
        return selection

    @staticmethod
    def _uniform_rows(rng: np.ndarray, n: int, rows: int, indices: np.ndarray | None, weights: np.ndarray | None,
                      scores: np.ndarray) -> Selection:
        """``rows`` of n positions uniformly at random without replacement (the first of a random permutation)."""
        positions = np.argsort(uniforms(rng, n), kind="stable")[:min(rows, n)].astype(np.int64)
        return Selection(positions, None if indices is None else indices[positions],
                         np.ones(len(positions)) if weights is None else weights[positions].copy(), scores)

    def step_done(self, losses: Any = None, *, indices: Any = None, seconds: float | None = None) -> None:
        """End the step begun by ``choose`` or `uniform`. ``losses``: a uniform step's trained rows' per-example
        training losses (before the update; required then, refused after a selection step, whose candidates were
        measured when scored). ``indices``: their dataset indices (default: the rows `uniform` handed out; under
        DDP pass every rank's, gathered, with their losses). ``seconds``: the step's duration, every step with
        ``cost="seconds"`` (never otherwise). After a selection step with ``cost="rows"`` the step has already
        ended and ``step_done()`` without arguments does nothing. Bad input raises and changes nothing."""
        if not self.open_mode:
            if losses is None and seconds is None and indices is None:
                return
            raise ValueError("no step is open: step_done() ends the step that choose() or uniform() began")
        if self.cost == "seconds":
            if seconds is None:
                raise ValueError("seconds is required: this switch measures cost='seconds'")
            seconds = checks.number("seconds", seconds, 0.0)
        elif seconds is not None:
            raise ValueError("seconds was given but this switch counts cost='rows' (build it with cost='seconds')")
        measured = None
        if self.open_indices is not None:  # a uniform step
            if losses is None:
                raise ValueError("losses are required after uniform(): the trained rows' per-example training losses")
            arr = to_numpy(losses, "losses")
            rows = self.open_indices if indices is None else to_numpy(indices, "indices")
            if rows.ndim != 1 or rows.dtype.kind not in "iu":
                raise ValueError(f"indices must be a 1-D integer array, got dtype {rows.dtype} shape {rows.shape}")
            if arr.ndim != 1 or arr.dtype.kind not in "fiu" or arr.shape != rows.shape:
                raise ValueError(f"losses must have shape ({len(rows)},), one per trained row, got dtype {arr.dtype} "
                                 f"shape {arr.shape}")
            arr = np.ascontiguousarray(arr, np.float64)
            checks.all_finite("losses", arr)
            rows = np.ascontiguousarray(rows, np.int64)
            self.score.check_indices(rows)
            measured = (np.asarray(self.score(arr, rows), np.float64), len(rows))
        elif losses is not None or indices is not None:
            raise ValueError("losses are for uniform steps: a selection step's candidates were measured when scored")
        # checked: from here on nothing fails
        if measured is not None:
            scores, trained = measured
            self._open(scores, 0, trained, False)
        self._commit(seconds)

    def _open(self, scores: np.ndarray, scored: int, trained: int, selecting: bool) -> None:
        below = 0 if self.stop_at is None else int((scores <= self.stop_at).sum())
        self.open = np.array([float(np.maximum(scores, 0.0).sum()), len(scores), below, scored, trained,
                              float(selecting)])
        self.open_mode = SELECT if selecting else UNIFORM
        self.open_indices = None

    def _commit(self, seconds: float | None) -> None:
        """Add the open step to the window; at a window's end measure its rate, stop or decide."""
        y_sum, count, below, scored, trained, selecting = self.open
        step_cost = seconds if seconds is not None else scored + (1.0 + self.backward_cost) * trained
        acc = self.acc
        if count > 0:
            c, y = self.cum_cost - acc[7], y_sum / count
            acc[0:5] += (1.0, c, y, c * c, c * y)
        acc[5] += below
        acc[6] += count
        self.cum_cost += step_cost
        counts = self.switch_counters
        counts["steps"] += 1
        counts["selecting_steps"] += int(selecting)
        counts["scored_rows"] += int(scored)
        counts["trained_rows"] += int(trained)
        if seconds is not None:
            self.seconds[0 if selecting else 1] += seconds
        self.steps += 1
        self.open, self.open_mode, self.open_indices = np.zeros(_OPEN), "", None
        if self.steps % self.window == 0:
            self._close_window(self.steps // self.window - 1)

    def _close_window(self, index: int) -> None:
        acc = self.acc
        rate = _rate_from_sums(*acc[:5])
        self.rates = np.array([self.rates[1], self.rates[2], rate])
        if (not self.stopped and self.stop_at is not None and acc[6] > 0 and 2 * acc[5] >= acc[6]):
            self.stopped = True
            self.reason = (f"window {index}: {int(acc[5])} of {int(acc[6])} scores <= stop_at = {self.stop_at:g} "
                           f"(median reducible loss <= {self.stop_at:g}): the learner has passed the irreducible-loss "
                           f"model, selection off for good")
            self.switch_counters["switches"] += int(self.preferred == SELECT)
            self.preferred = UNIFORM
        elif not self.stopped and index % self.probe_every == 2:
            before, probe, after = self.rates
            probed = UNIFORM if self.preferred == SELECT else SELECT
            if np.isfinite([before, probe, after]).all():
                around = (before + after) / 2
                unit = "s" if self.cost == "seconds" else "row-unit"
                self.last_decision = (f"window {index - 1}: {probed} probe {probe:.4g} per {unit} against "
                                      f"{self.preferred} {around:.4g} (mean of windows {index - 2} and {index})")
                if probe > around + self.margin * abs(around):
                    self.reason = f"{self.last_decision}: switched to {probed}"
                    self.preferred = probed
                    self.switch_counters["switches"] += 1
            else:
                self.last_decision = f"window {index - 1}: no rate measured (too few points), kept {self.preferred}"
        self.acc = np.zeros(_ACC)
        self.acc[7] = self.cum_cost

    # ------------------------------------------------------------------ stats, checkpoint
    def stats(self) -> dict[str, Any]:
        c = self.switch_counters
        out: dict[str, Any] = {**super().stats(), **c}
        out.update(selecting_fraction=c["selecting_steps"] / c["steps"] if c["steps"] else 0.0,
                   forward_rows_per_trained_row=c["scored_rows"] / c["trained_rows"] if c["trained_rows"] else 0.0,
                   preferred=self.preferred, stopped=self.stopped, reason=self.reason,
                   last_decision=self.last_decision, window_rates=self.rates.tolist())
        if self.cost == "seconds":
            uniform_steps = c["steps"] - c["selecting_steps"]
            out.update(seconds_selecting=float(self.seconds[0]), seconds_uniform=float(self.seconds[1]),
                       seconds_per_selecting_step=self.seconds[0] / c["selecting_steps"] if c["selecting_steps"]
                       else 0.0,
                       seconds_per_uniform_step=self.seconds[1] / uniform_steps if uniform_steps else 0.0)
        return out

    def _config(self) -> dict:
        return {"window": self.window, "probe_every": self.probe_every, "stop_at": self.stop_at, "cost": self.cost,
                "backward_cost": self.backward_cost, "margin": self.margin}

    def _part_state(self) -> dict:
        return {"config": self._config(), "steps": self.steps, "preferred": self.preferred,
                "stopped": self.stopped, "reason": self.reason, "last_decision": self.last_decision,
                "acc": self.acc.copy(), "rates": self.rates.copy(), "cum_cost": self.cum_cost,
                "open": self.open.copy(), "open_mode": self.open_mode,
                "open_indices": np.zeros(0, np.int64) if self.open_indices is None else self.open_indices.copy(),
                "open_uniform": self.open_indices is not None, "counters": dict(self.switch_counters),
                "seconds": self.seconds.copy()}

    def _checked_part(self, state: Any, where: str) -> dict:
        saved = field(state, "config", where)
        require(isinstance(saved, Mapping), f"{where}['config'] must be a mapping, got {type(saved).__name__}")
        for key, mine in self._config().items():
            require(key in saved and saved[key] == mine,
                    f"checkpoint has {key}={saved.get(key)!r} but this SelectionSwitch has {key}={mine!r}")
        out = {"steps": integer(state, "steps", where, 0)}
        for key in ("preferred", "open_mode"):
            value = field(state, key, where)
            allowed = (SELECT, UNIFORM) if key == "preferred" else ("", SELECT, UNIFORM)
            require(value in allowed, f"{where}[{key!r}] must be one of {allowed}, got {value!r}")
            out[key] = value
        for key in ("stopped", "open_uniform"):
            value = field(state, key, where)
            require(isinstance(value, (bool, np.bool_)), f"{where}[{key!r}] must be True or False, got {value!r}")
            out[key] = bool(value)
        for key in ("reason", "last_decision"):
            value = field(state, key, where)
            require(isinstance(value, str), f"{where}[{key!r}] must be a string, got {type(value).__name__}")
            out[key] = value
        out["acc"] = array(state, "acc", where, (_ACC,), "f", np.float64)
        out["open"] = array(state, "open", where, (_OPEN,), "f", np.float64)
        out["rates"] = array(state, "rates", where, (3,), "f", np.float64)
        out["seconds"] = array(state, "seconds", where, (2,), "f", np.float64)
        for key in ("acc", "open", "seconds", "rates"):
            finite = np.isfinite(out[key]) | (np.isnan(out[key]) if key == "rates" else False)  # NaN: no rate yet
            require(bool(finite.all()), f"{where}[{key!r}] must be finite")
        counts = np.r_[out["acc"][[0, 5, 6]], out["open"][1:], out["seconds"]]
        require(bool((counts >= 0).all()), f"{where}: counts and seconds must be >= 0")
        out["cum_cost"] = number(state, "cum_cost", where, 0.0)
        out["open_indices"] = array(state, "open_indices", where, (-1,), "iu", np.int64)
        if out["open_uniform"]:
            require(out["open_mode"] == UNIFORM and len(out["open_indices"]) > 0,
                    f"{where}: an open uniform step needs its rows' indices")
        else:
            require(len(out["open_indices"]) == 0, f"{where}['open_indices'] must be empty unless a uniform step "
                                                   f"is open")
        require(not out["stopped"] or out["preferred"] == UNIFORM, f"{where}: a stopped switch prefers uniform")
        out["counters"] = counter_fields(state, "counters", where, self.switch_counters)
        require(out["counters"]["steps"] == out["steps"], f"{where}['counters']['steps'] must equal steps")
        return out

    def _load_part(self, checked: dict) -> None:
        self.steps, self.preferred, self.stopped = checked["steps"], checked["preferred"], checked["stopped"]
        self.reason, self.last_decision = checked["reason"], checked["last_decision"]
        self.acc, self.rates, self.cum_cost = checked["acc"], checked["rates"], checked["cum_cost"]
        self.open, self.open_mode = checked["open"], checked["open_mode"]
        self.open_indices = checked["open_indices"] if checked["open_uniform"] else None
        self.switch_counters, self.seconds = checked["counters"], checked["seconds"]

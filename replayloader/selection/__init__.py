"""Score then select: score a large candidate batch, train on the rows a rule picks (RHO-LOSS and kin).

- Scores: `TrainingLoss`, `ReducibleLoss` (training loss minus an irreducible loss).
- Rules: `TopK`, `Proportional`, `SelectiveBackprop`; `Selector` applies one and keeps its state.
- `ScoreThenSelect` (over a `PrioritizedSampler`) and `BufferScoreThenSelect` (over a replay buffer).
- `fit_irreducible` / `IrreducibleModel`: the irreducible-loss model, validated on a held-out slice of the
  hold-out split, with its quality, cost and provenance (`digest`); `irreducible_losses` is the 1.0 form.
- Cheaper selection (docs/selection.md, "Cost model"): `ReusedPool` (one scored pool feeds m steps),
  `stale_reducible_sampler` / `stale_rows` (the reducible loss as a sampler weight: no scoring at all),
  `SelectionSwitch` (selection only while it pays, off once the learner passes the irreducible-loss model),
  `step_cost_ratio` / `break_even_step_ratio`.
"""
from .cost import break_even_step_ratio, step_cost_ratio
from .irreducible import (IrreducibleLosses, IrreducibleModel, ProvenanceMismatch, digest, fit_irreducible,
                          irreducible_losses)
from .reuse import ReusedPool
from .rules import (Proportional, ReducibleLoss, Rule, Score, Selection, SelectiveBackprop, Selector, SelectorLike,
                    TopK, TrainingLoss)
from .score_then_select import BufferScoreThenSelect, ScoreThenSelect
from .stale import stale_reducible_sampler, stale_rows
from .switch import SelectionSwitch
from .wrapped import WrappedSelector

__all__ = ["Selector", "SelectorLike", "Selection", "Score", "TrainingLoss", "ReducibleLoss", "Rule", "TopK", "Proportional",
           "SelectiveBackprop", "ScoreThenSelect", "BufferScoreThenSelect", "IrreducibleLosses",
           "irreducible_losses", "fit_irreducible", "IrreducibleModel", "ProvenanceMismatch", "digest",
           "ReusedPool", "SelectionSwitch", "WrappedSelector", "stale_reducible_sampler", "stale_rows",
           "step_cost_ratio", "break_even_step_ratio"]

"""Score then select: score a large candidate batch, train on the rows a rule picks (RHO-LOSS and kin).

- Scores: `TrainingLoss`, `ReducibleLoss` (training loss minus an irreducible loss).
- Rules: `TopK`, `Proportional`, `SelectiveBackprop`; `Selector` applies one and keeps its state.
- `ScoreThenSelect` (over a `PrioritizedSampler`) and `BufferScoreThenSelect` (over a replay buffer).
- `irreducible_losses` / `IrreducibleLosses`: the irreducible-loss model's losses, computed once and kept.
"""
from .irreducible import IrreducibleLosses, irreducible_losses
from .rules import (Proportional, ReducibleLoss, Rule, Score, Selection, SelectiveBackprop, Selector, TopK,
                    TrainingLoss)
from .score_then_select import BufferScoreThenSelect, ScoreThenSelect

__all__ = ["Selector", "Selection", "Score", "TrainingLoss", "ReducibleLoss", "Rule", "TopK", "Proportional",
           "SelectiveBackprop", "ScoreThenSelect", "BufferScoreThenSelect", "IrreducibleLosses",
           "irreducible_losses"]

"""Cheaper scoring for score-then-select: score the next pool in the background, or score with a small proxy.

A selection step costs one no-grad forward over the n_B candidates besides the training step over the n_b chosen
rows (docs/selection.md, cost model). Two parts cut what the trainer pays for that forward (issue 28, levers d
and e); each works with any candidate source (`CandidateBatchSampler`, `ScoreThenSelect`, a replay buffer):

- `BackgroundScorer`: a copy of the model, refreshed from the trainer's model every ``refresh_every`` steps,
  scores pool t+1 on a background thread (or a side CUDA stream, or another device, or a worker process) while
  the trainer trains on pool t. Why: the scoring forward then costs the trainer nothing whenever a core or a
  stream is free for it; the price is that the scores come from weights up to ``refresh_every`` steps old, which
  `stats()` reports. The scores depend only on the order of the calls (``submit``, ``step``), never on timing,
  so a run is exactly reproducible.
- `ProxyScorer`: a much smaller model, trained online beside the main one on the rows the main model trains on
  (as in ClassAct and JEST), scores the candidates in its place. Why: a forward of the proxy can cost a small
  fraction of the main model's; the price is its own training step and a ranking that only approximates the
  main model's, so `stats()` reports the proxy's seconds and rows and the rank correlation between its losses
  and the main model's on the rows trained.

The package, by job: ``background.py`` (BackgroundScorer), ``worker.py`` (its worker's loop, on a thread or in a
process), ``proxy.py`` (ProxyScorer), ``batches.py`` (nested batches and models as both scorers see them),
``streams.py`` (CUDA tensors handed between the trainer's stream and the worker's), ``checkpoints.py`` (the
state checks both scorers' loads share), ``correlation.py`` (`rank_correlation`).

Optional module: torch is imported here only.
"""
from .background import BackgroundScorer
from .correlation import rank_correlation
from .proxy import ProxyScorer

__all__ = ["BackgroundScorer", "ProxyScorer", "rank_correlation"]

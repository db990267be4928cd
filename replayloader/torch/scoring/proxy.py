"""`ProxyScorer`: a small model, trained online beside the main one on the rows it trains on (ClassAct, JEST),
scores the candidates in its place; `stats` says what it costs and how well its ranking tracks the main model's."""
from __future__ import annotations

import copy
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np
import torch

from ... import _checks as checks
from ..._moved import keyword_only
from ..._arrays import to_numpy
from ...selection.rules import ReducibleLoss
from ...state.checks import InvalidState, check_header, field, require
from ..candidates import take_rows
from .batches import batch_rows, model_device, per_example, to_device
from .checkpoints import STATE_VERSION, check_layout, layout, meters
from .correlation import rank_correlation

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]
TRAIN_ON = ("selected", "pool")
_PROXY_COUNTERS = ("pools", "score_rows", "steps", "train_rows", "correlated_steps")
_PROXY_SECONDS = ("score_s", "train_s")


class ProxyScorer:
    """A small model that learns online beside the main one and scores the candidates in its place (ClassAct,
    JEST): `score` is one no-grad forward of the proxy over the pool; `feedback` trains it one optimizer step
    on the rows the main model trained on (``train_on="selected"``) or on the whole pool (``"pool"``).

    Experimental: no measurement in this repository yet shows it paying for itself; it may change or go until
    one does (docs/selection.md, "Experimental levers").

    The loop (``batches`` a `CandidateBatchSampler`)::

        scores = proxy.score((xb, yb))                       # instead of the main model's scoring forward
        chosen = batches.choose(batches.next_batch_info(), scores)
        xs, ys = take_rows((xb, yb), chosen.positions)
        losses = per_example_loss(model(xs), ys)             # the main model's training forward
        ... (losses * weights).mean().backward(); optimizer.step() ...
        proxy.feedback((xb, yb), positions=chosen.positions, main_losses=losses.detach())

    Args:
        proxy_model: the proxy (any `torch.nn.Module`; it stays on its device, and candidates are moved there).
        optimizer: the proxy's optimizer, over ``proxy_model``'s parameters.
        loss_fn: ``loss_fn(proxy_model, rows) -> (n,)`` per-example losses (with gradients when training).
        train_on: ``"selected"`` (the rows the main model trained on, weighted by their importance weights: the
            proxy learns what the main model learns) or ``"pool"`` (every candidate: n_B rows of forward and
            backward on the proxy, a proxy that sees more data).
        irreducible: optional per-example irreducible losses (by dataset index): `score` then returns the
            proxy's reducible loss, loss - irreducible[indices] (use the selector's default `TrainingLoss`
            then, not `ReducibleLoss`, or the irreducible loss is subtracted twice), and the rank correlation
            compares reducible losses.
        score_in_eval_mode: score with the proxy in eval mode (default True).
        window: how many recent steps the mean rank correlation in `stats` covers.
        sync_timing: on CUDA, synchronize the proxy's device around each timed call, so its seconds are GPU
            time rather than launch time (costs the overlap of host and device; default False).
    """

    def __init__(self, proxy_model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn, *,
                 train_on: Literal["selected", "pool"] = "selected", irreducible: Any = None,
                 score_in_eval_mode: bool = True, window: int = 100, sync_timing: bool = False) -> None:
        if not isinstance(proxy_model, torch.nn.Module):
            raise TypeError(f"proxy_model must be a torch.nn.Module, got {type(proxy_model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        owned = {id(p) for p in proxy_model.parameters()}
        optimized = [p for group in optimizer.param_groups for p in group["params"]]
        if not optimized or any(id(p) not in owned for p in optimized):
            raise ValueError("optimizer must optimize proxy_model's parameters (it holds parameters that are not "
                             "the proxy's, or none)")
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable as loss_fn(proxy_model, rows), got {type(loss_fn).__name__}")
        if train_on not in TRAIN_ON:
            raise ValueError(f"train_on must be one of {TRAIN_ON}, got {train_on!r}")
        self.window = checks.integer("window", window, 1)
        self.irreducible = None if irreducible is None else ReducibleLoss(irreducible)  # checks it, read-only copy
        self.model, self.optimizer, self.loss_fn, self.train_on = proxy_model, optimizer, loss_fn, train_on
        self.score_in_eval_mode, self.sync_timing = bool(score_in_eval_mode), bool(sync_timing)
        self.counters = dict.fromkeys(_PROXY_COUNTERS, 0)
        self.seconds = dict.fromkeys(_PROXY_SECONDS, 0.0)
        self.correlations: deque[float] = deque(maxlen=self.window)
        self.last: dict[str, float] = {}

    @property
    def device(self) -> torch.device:
        return model_device(self.model)

    def _clock(self) -> float:
        if self.sync_timing and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _indices(self, indices: Any, count: int) -> np.ndarray | None:
        """Dataset indices as int64 (checked against ``irreducible``), or None when there is no irreducible loss."""
        if self.irreducible is None:
            return None
        if indices is None:
            raise ValueError("indices are needed: with irreducible losses the proxy reads each row's dataset index")
        arr = checks.index_array("indices", indices, length=count, why="the rows' dataset indices")
        self.irreducible.check_indices(arr)
        return arr

    def score(self, candidates: Any, indices: Any = None) -> torch.Tensor:
        """The proxy's per-example losses on a pool (one no-grad forward), a 1-D tensor on the proxy's device;
        with ``irreducible``, minus the irreducible losses of the candidates' dataset ``indices``."""
        rows = batch_rows(candidates, "candidates")
        if rows is not None:
            self._indices(indices, rows)  # checked before the forward, and again below
        start = self._clock()
        was_training = self.model.training
        try:
            with torch.no_grad():
                if self.score_in_eval_mode:
                    self.model.eval()
                losses = per_example(self.loss_fn(self.model, to_device(candidates, self.device)), rows, "loss_fn")
        finally:
            self.model.train(was_training)
        indices = self._indices(indices, len(losses))
        if indices is not None:
            losses = losses - torch.as_tensor(self.irreducible.irreducible[indices], dtype=losses.dtype,
                                              device=losses.device)
        self.seconds["score_s"] += self._clock() - start
        self.counters["pools"] += 1
        self.counters["score_rows"] += len(losses)
        return losses.detach()

    @keyword_only("positions")
    def feedback(self, candidates: Any, *, positions: Any = None, main_losses: Any = None, weights: Any = None,
                 indices: Any = None) -> float:
        """Train the proxy one step and log how well it tracks the main model; returns the proxy's training loss.

        ``candidates``: the pool as scored; ``positions``: the rows of it the main model trained on (the
        selection's ``positions``; needed with ``train_on="selected"`` and for the correlation); ``weights``:
        their importance weights (``train_on="selected"`` only; default 1); ``main_losses``: the main model's
        per-example losses on those rows (from its training forward, at no extra cost): the rank correlation
        with the proxy's losses on the same rows (before its update) goes into `stats`. ``indices``: the rows'
        dataset indices (the selection's ``indices``), needed with ``irreducible`` for the correlation of
        reducible losses. Everything is checked before the proxy changes: bad input raises ValueError and
        changes nothing.
        """
        rows = batch_rows(candidates, "candidates")
        chosen = None
        if positions is not None:
            chosen = checks.index_array("positions", positions, why="rows of candidates")
            out = np.flatnonzero((chosen < 0) | (chosen >= (rows if rows is not None else np.iinfo(np.int64).max)))
            if len(out):
                raise ValueError(f"positions must lie in [0, {rows}) (rows of candidates); positions[{out[0]}] = "
                                 f"{chosen[out[0]]}")
        elif self.train_on == "selected":
            raise ValueError("positions are needed: with train_on='selected' the proxy trains on the rows the main "
                             "model trained on")
        if weights is not None and self.train_on == "pool":
            raise ValueError("weights apply to the selected rows; with train_on='pool' pass none")
        if main_losses is not None:
            if chosen is None:
                raise ValueError("positions are needed with main_losses: they say which rows the losses belong to")
            main = np.asarray(to_numpy(main_losses, "main_losses"), np.float64)
            if main.shape != chosen.shape or not np.isfinite(main).all():
                raise ValueError(f"main_losses must be {len(chosen)} finite losses (one per position), got shape "
                                 f"{main.shape}")
            if self.irreducible is not None:
                main = main - self.irreducible.irreducible[self._indices(indices, len(chosen))]
        train_weights = None
        if weights is not None:
            train_weights = np.asarray(to_numpy(weights, "weights"), np.float64)
            if train_weights.shape != chosen.shape or not np.isfinite(train_weights).all():
                raise ValueError(f"weights must be {len(chosen)} finite importance weights (one per position), got "
                                 f"shape {train_weights.shape}")
        batch = take_rows(candidates, chosen) if self.train_on == "selected" else candidates
        count = len(chosen) if self.train_on == "selected" else rows
        start = self._clock()
        self.model.train()
        per = per_example(self.loss_fn(self.model, to_device(batch, self.device)), count, "loss_fn")
        if not torch.isfinite(per).all():
            raise ValueError("loss_fn returned a non-finite loss for the proxy; it was not trained on them")
        if train_weights is not None:
            loss = (per * torch.as_tensor(train_weights, dtype=per.dtype, device=per.device)).mean()
        else:
            loss = per.mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        value = float(loss.detach())
        self.seconds["train_s"] += self._clock() - start
        self.counters["steps"] += 1
        self.counters["train_rows"] += len(per)
        self.last = {"proxy_loss": value}
        if main_losses is not None:
            mine = per.detach()
            mine = mine if self.train_on == "selected" else mine[torch.as_tensor(chosen, device=mine.device)]
            mine = to_numpy(mine, "proxy losses").astype(np.float64)
            if self.irreducible is not None:
                mine = mine - self.irreducible.irreducible[self._indices(indices, len(chosen))]
            rho = rank_correlation(mine, main)
            self.last["rank_correlation"] = rho
            if not math.isnan(rho):
                self.correlations.append(rho)
                self.counters["correlated_steps"] += 1
        return value

    def stats(self) -> dict[str, float]:
        """The proxy's cost and how well it tracks the main model.

        ``score_s``, ``train_s``, ``seconds``: its seconds scoring and training (host seconds; on CUDA with
        ``sync_timing`` device seconds); ``score_rows`` (no-grad forward rows), ``train_rows`` (forward +
        backward rows), ``forward_rows`` (both); ``pools``, ``steps``; ``rank_correlation``: the mean Spearman
        correlation, over the last ``window`` steps, between the proxy's losses and the main model's on the rows
        the main model trained on (``rank_correlation_last``: the latest; NaN before any). Measured on the rows
        the proxy chose, so a top-k selection (a narrow slice of the pool) lowers it below the correlation over
        the whole pool. ``proxy_loss``: the proxy's latest training loss."""
        c = self.counters
        mean = float(np.mean(self.correlations)) if self.correlations else math.nan
        return {**c, "forward_rows": c["score_rows"] + c["train_rows"], **self.seconds,
                "seconds": sum(self.seconds.values()), "rank_correlation": mean,
                "rank_correlation_last": self.last.get("rank_correlation", math.nan),
                "proxy_loss": self.last.get("proxy_loss", math.nan)}

    def state_dict(self) -> dict:
        """The proxy's weights and optimizer state, its counters and recent correlations."""
        return {"version": STATE_VERSION, "config": {"train_on": self.train_on},
                "model": {key: value.detach().clone() for key, value in self.model.state_dict().items()},
                "optimizer": copy.deepcopy(self.optimizer.state_dict()), "counters": dict(self.counters),
                "seconds": dict(self.seconds), "correlations": list(self.correlations)}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a `state_dict` (same ``train_on``, same proxy layout, an optimizer of the same groups). A bad
        state raises `InvalidState` and changes nothing (model and optimizer are put back if either rejects)."""
        where = check_header(state, STATE_VERSION, {"train_on": self.train_on}, "ProxyScorer")
        weights = field(state, "model", where)
        require(isinstance(weights, Mapping), f"{where}['model'] must be a mapping, got {type(weights).__name__}")
        check_layout(weights, layout(self.model), f"{where}['model']", InvalidState)
        optimizer_state = field(state, "optimizer", where)
        require(isinstance(optimizer_state, Mapping), f"{where}['optimizer'] must be a mapping")
        counters, seconds = meters(state, where, _PROXY_COUNTERS, _PROXY_SECONDS)
        saved = field(state, "correlations", where)
        require(isinstance(saved, (list, tuple)) and all(isinstance(x, (int, float)) and -1.0 <= x <= 1.0
                                                         for x in saved),
                f"{where}['correlations'] must be a list of correlations in [-1, 1]")
        correlations = [float(x) for x in saved][-self.window:]
        before_model = {key: value.detach().clone() for key, value in self.model.state_dict().items()}
        before_optimizer = copy.deepcopy(self.optimizer.state_dict())
        try:
            self.model.load_state_dict(weights)
            self.optimizer.load_state_dict(copy.deepcopy(dict(optimizer_state)))
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:
            self.model.load_state_dict(before_model)
            self.optimizer.load_state_dict(before_optimizer)
            raise InvalidState(f"{where}: the proxy or its optimizer rejected the checkpoint: {exc}") from exc
        self.counters = counters
        self.seconds = seconds
        self.correlations = deque(correlations, maxlen=self.window)
        self.last = {}

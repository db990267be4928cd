"""Irreducible losses for `ReducibleLoss` (RHO-LOSS), computed once, validated, and saved beside the run.

RHO-LOSS needs, for every training example, the loss of a model that never trained on it: a small model is
trained on a held-out split, then scores every training example. That costs one training run of the small model
plus one forward pass over the training set, paid once.

`fit_irreducible` (use this) trains the irreducible-loss (IL) model through callables you pass (so any framework
fits), keeps the checkpoint that is best on a held-out slice *of the hold-out split* (never on the evaluation
set), scores the training set from that checkpoint, and records what it cost (CPU and wall seconds of training,
of checkpoint selection and of scoring), how good the IL model is, and what made it (``provenance``: data
digest, split, label-noise seed, model config). The file is written atomically (a kill leaves the old file or
the new one); a later call with the same path and the same provenance loads it instead of refitting, and a call
whose provenance differs is refused, naming the keys that differ. Why: RHO-LOSS stalls near the IL model's own
quality, so a weak or mismatched IL model silently caps the run (issue 28's audit: an IL model trained 420 steps
without validation reached 0.686 dev accuracy, below the 0.70 target).

`irreducible_losses` is the 1.0 function, kept for old callers: it trusts any file of the right length.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import _checks as checks
from ..state.atomic import atomic_write
from .._arrays import to_numpy


@dataclass
class IrreducibleLosses:
    """One loss per training example, and what computing them cost (seconds of training and of scoring,
    measured with ``time.process_time`` (CPU time of this process) and ``time.perf_counter`` (wall))."""

    losses: np.ndarray
    train_cpu_s: float
    score_cpu_s: float
    train_wall_s: float
    score_wall_s: float

    def save(self, path: str | Path) -> None:
        def write(f):
            np.savez(f, losses=self.losses, train_cpu_s=self.train_cpu_s, score_cpu_s=self.score_cpu_s,
                     train_wall_s=self.train_wall_s, score_wall_s=self.score_wall_s)
        atomic_write(path, write)

    @classmethod
    def load(cls, path: str | Path) -> IrreducibleLosses:
        with np.load(path) as f:
            return cls(np.array(f["losses"], np.float64), *(float(f[k]) for k in
                       ("train_cpu_s", "score_cpu_s", "train_wall_s", "score_wall_s")))


def irreducible_losses(path: str | Path, num_examples: int, train: Callable[[], Any],
                       score: Callable[[Any], Any]) -> IrreducibleLosses:
    """The 1.0 form (prefer `fit_irreducible`, which validates the IL model and refuses a file made from other
    data). Load ``path`` if it holds ``num_examples`` losses; else ``model = train()`` (fit the small model on the
    held-out split), ``losses = score(model)`` (per-example loss of every training example, dataset order, shape
    (num_examples,)), check them (finite), save them to ``path`` with their cost, and return them."""
    path = Path(path)
    if path.exists():
        found = IrreducibleLosses.load(path)
        if found.losses.shape != (num_examples,):
            raise ValueError(f"{path} holds {found.losses.shape[0]} irreducible losses, expected num_examples = "
                             f"{num_examples}; delete it to recompute")
        return found
    cpu, wall = time.process_time(), time.perf_counter()
    model = train()
    cpu_train, wall_train = time.process_time(), time.perf_counter()
    losses = np.array(to_numpy(score(model), "losses"), np.float64)
    cpu_score, wall_score = time.process_time(), time.perf_counter()
    if losses.shape != (num_examples,):
        raise ValueError(f"score(model) must return one loss per training example, shape ({num_examples},), got "
                         f"{losses.shape}")
    bad = np.flatnonzero(~np.isfinite(losses))
    if len(bad):
        raise ValueError(f"score(model) returned a non-finite loss: losses[{bad[0]}] = {losses[bad[0]]}")
    result = IrreducibleLosses(losses, cpu_train - cpu, cpu_score - cpu_train, wall_train - wall,
                               wall_score - wall_train)
    result.save(path)
    return result


# ---------------------------------------------------------------------------------------------------- validated
FORMAT = "replayloader.irreducible/2"
_FIT_KEYS = ("fit.steps", "fit.eval_every", "fit.higher_is_better")  # how the model was fitted, compared too


class ProvenanceMismatch(ValueError):
    """A saved irreducible-loss file was made from other inputs than the ones given now (``differing``: the keys)."""

    def __init__(self, path: str | Path, differing: dict[str, tuple[Any, Any]]) -> None:
        self.path, self.differing = str(path), differing
        listed = "; ".join(f"{key}: saved {_short(saved)}, given {_short(given)}"
                           for key, (saved, given) in differing.items())
        super().__init__(f"{path} holds irreducible losses made from other inputs ({len(differing)} differing "
                         f"provenance key{'s' if len(differing) != 1 else ''}: {listed}); delete it, or give "
                         f"another path, to fit the irreducible-loss model for these inputs")


def _canonical(value: Any) -> str:
    return "<missing>" if value is _MISSING else json.dumps(value, sort_keys=True)


def _short(value: Any) -> str:
    text = _canonical(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _number(value: Any) -> float:
    """evaluate()'s result as a float: a real number, a numpy scalar or a one-element tensor."""
    if isinstance(value, (bool, str, bytes)):
        raise TypeError(f"evaluate() must return a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"evaluate() must return a number, got {type(value).__name__}") from None


_MISSING = object()


def digest(*arrays: Any) -> str:
    """A sha256 of arrays' dtypes, shapes and bytes (numpy or torch; strings as numpy unicode arrays), for
    ``provenance``: e.g. ``digest(train_x, train_y)`` names the training data and its (noisy) labels, so a file
    fitted on other data or other flipped labels is refused."""
    if not arrays:
        raise ValueError("digest needs at least one array")
    found = hashlib.sha256()
    for number, value in enumerate(arrays):
        arr = np.ascontiguousarray(to_numpy(value, f"arrays[{number}]"))
        if arr.dtype.kind == "O":
            raise TypeError(f"arrays[{number}] holds Python objects (dtype object); pass numbers or strings")
        found.update(f"{arr.dtype.str}|{arr.shape}|".encode())
        found.update(arr.reshape(-1).view(np.uint8))
    return found.hexdigest()


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON (pass numbers, strings, lists, dicts; digest() arrays)")


def _checked_provenance(provenance: Any) -> dict:
    """``provenance`` as plain JSON values (a ValueError / TypeError naming the bad key otherwise)."""
    if not isinstance(provenance, Mapping) or not provenance:
        raise ValueError(f"provenance must be a non-empty mapping (data digest, split, label-noise seed, model "
                         f"config), got {provenance!r}")
    out = {}
    for key, value in provenance.items():
        if not isinstance(key, str) or key.startswith("fit."):
            raise ValueError(f"provenance keys must be strings not starting with 'fit.' (reserved for how the model "
                             f"was fitted), got {key!r}")
        try:
            out[key] = json.loads(json.dumps(value, sort_keys=True, default=_plain, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"provenance[{key!r}] must be JSON-able: {exc}") from None
    return out


@dataclass(frozen=True)
class IrreducibleModel:
    """The irreducible losses of a validated IL model, with its quality, cost and provenance.

    ``losses``: one loss per training example (dataset order), from the best checkpoint. ``quality``: that
    checkpoint's ``evaluate()`` on the held-out slice of the hold-out split, at ``best_step`` of ``steps``;
    ``curve``: (step, quality) at every evaluation. Cost in seconds, CPU (``time.process_time``, this process) and
    wall (``time.perf_counter``): ``train`` (the train calls), ``select`` (evaluate, snapshot and restore: choosing
    the checkpoint), ``score`` (the score call). ``loaded``: read from the file, so this run paid none of it (the
    run that fitted it did: count it once per run, or amortized with `cost_amortized`).
    """

    losses: np.ndarray
    quality: float
    best_step: int
    steps: int
    higher_is_better: bool
    curve: tuple[tuple[int, float], ...]
    provenance: dict
    train_cpu_s: float
    train_wall_s: float
    select_cpu_s: float
    select_wall_s: float
    score_cpu_s: float
    score_wall_s: float
    loaded: bool = False
    fit: dict = field(default_factory=dict)

    @property
    def cpu_s(self) -> float:
        """CPU seconds of the whole fit: train + select + score."""
        return self.train_cpu_s + self.select_cpu_s + self.score_cpu_s

    @property
    def wall_s(self) -> float:
        """Wall seconds of the whole fit: train + select + score."""
        return self.train_wall_s + self.select_wall_s + self.score_wall_s

    def cost_amortized(self, n_runs: int) -> dict[str, float]:
        """The fit's cost per run when ``n_runs`` runs share it (same path and provenance: every run but the first
        loads it): ``{"cpu_s", "wall_s"}`` = total / n_runs. Assumes the runs really reuse this file (same data,
        split, labels and IL config); seeds of the *main* model may differ."""
        n_runs = checks.integer("n_runs", n_runs, 1)
        return {"cpu_s": self.cpu_s / n_runs, "wall_s": self.wall_s / n_runs}

    def weaker_than(self, target: float) -> bool:
        """Whether the IL model's best quality is worse than ``target`` (in the units of ``evaluate``)."""
        target = checks.number("target", target)
        return self.quality < target if self.higher_is_better else self.quality > target

    def save(self, path: str | Path) -> None:
        """One ``.npz``, atomically; `IrreducibleLosses.load` reads its losses and cost too."""
        steps, qualities = (np.array([c[i] for c in self.curve]) for i in (0, 1))
        meta = {"format": FORMAT, "provenance": self.provenance, "fit": self.fit}

        def write(f):
            np.savez(f, losses=self.losses, train_cpu_s=self.train_cpu_s, score_cpu_s=self.score_cpu_s,
                     train_wall_s=self.train_wall_s, score_wall_s=self.score_wall_s,
                     select_cpu_s=self.select_cpu_s, select_wall_s=self.select_wall_s, quality=self.quality,
                     best_step=self.best_step, steps=self.steps, higher_is_better=self.higher_is_better,
                     curve_steps=steps.astype(np.int64), curve_quality=qualities.astype(np.float64),
                     meta=np.array(json.dumps(meta, sort_keys=True)))
        atomic_write(path, write)

    @classmethod
    def load(cls, path: str | Path) -> IrreducibleModel:
        """Read a file `save` wrote; a file without provenance (written by `irreducible_losses`) is refused."""
        with np.load(path, allow_pickle=False) as f:
            if "meta" not in f.files:
                raise ValueError(f"{path} has no provenance (written by irreducible_losses, or not by this "
                                 f"library); delete it, or give another path, to fit the irreducible-loss model")
            meta = json.loads(str(f["meta"]))
            if meta.get("format") != FORMAT:
                raise ValueError(f"{path} has format {meta.get('format')!r}, expected {FORMAT!r}")
            curve = tuple((int(a), float(b)) for a, b in zip(f["curve_steps"], f["curve_quality"]))
            losses = np.array(f["losses"], np.float64)
            losses.flags.writeable = False
            return cls(losses, float(f["quality"]), int(f["best_step"]), int(f["steps"]),
                       bool(f["higher_is_better"]), curve, meta["provenance"],
                       *(float(f[k]) for k in ("train_cpu_s", "train_wall_s", "select_cpu_s", "select_wall_s",
                                               "score_cpu_s", "score_wall_s")),
                       loaded=True, fit=meta.get("fit", {}))


class _Clock:
    """CPU and wall seconds spent inside ``with clock:`` blocks, summed."""

    def __init__(self) -> None:
        self.cpu = self.wall = 0.0

    def __enter__(self) -> None:
        self._cpu, self._wall = time.process_time(), time.perf_counter()

    def __exit__(self, *exc: Any) -> None:
        self.cpu += time.process_time() - self._cpu
        self.wall += time.perf_counter() - self._wall


def _callable(name: str, value: Any) -> Callable:
    if not callable(value):
        raise TypeError(f"{name} must be callable, got {type(value).__name__}")
    return value


def fit_irreducible(path: str | Path, *, train: Callable[[int], Any], evaluate: Callable[[], float],
                    snapshot: Callable[[], Any], restore: Callable[[Any], Any], score: Callable[[], Any],
                    provenance: Mapping[str, Any], steps: int, eval_every: int, target: float | None = None,
                    higher_is_better: bool = True, num_examples: int | None = None) -> IrreducibleModel:
    """Fit the irreducible-loss model once, choose its checkpoint on a held-out slice of the hold-out split, and
    return the training examples' losses from that checkpoint; a later call with the same ``path`` and
    ``provenance`` loads the file instead (reuse across runs and seeds: the cost is paid once).

    The callables (any framework):

    - ``train(n)``: train the IL model ``n`` more steps on the *training part of the hold-out split* (data the
      main model never trains on).
    - ``evaluate() -> float``: its quality on a *held-out slice of the hold-out split* (not trained on by the IL
      model). Never the evaluation / dev set: choosing the checkpoint there leaks the evaluation set into
      training and makes the reported dev numbers optimistic. Labels of that slice may be noisy like the rest.
    - ``snapshot() -> state`` and ``restore(state)``: copy the IL model's state (a copy, e.g.
      ``copy.deepcopy(model.state_dict())``) and put one back; the best one is restored before scoring.
    - ``score() -> losses``: the IL model's per-example loss on every training example of the main model,
      dataset order (numpy or torch, shape (N,)).

    ``steps`` are trained in chunks of ``eval_every`` (the last chunk may be shorter); after each chunk the model
    is evaluated, and kept if strictly better than every earlier checkpoint (``higher_is_better``: accuracy; False:
    a loss). ``provenance``: what made the losses, JSON-able (e.g. ``{"data": digest(x, y_noisy), "split":
    "50% hold-out, seed 0", "label_noise_seed": 0, "model": {...}}``); it is saved, and compared key by key
    (with ``steps``, ``eval_every``, ``higher_is_better``) when the file exists: any difference raises
    `ProvenanceMismatch` listing the keys. ``target``: the quality the main run aims at, in ``evaluate``'s units;
    if the IL model's best is worse, one `UserWarning` line says so (RHO-LOSS stalls near the IL model's quality,
    fitted or loaded alike). ``num_examples``: the expected number of losses, checked.

    Returns an `IrreducibleModel` (losses, quality, curve, cost, provenance, ``loaded``). Nothing is written unless
    the fit and its scores are valid (finite evaluations, one finite loss per example).
    """
    path = Path(path)
    callables = {name: _callable(name, value) for name, value in
                 (("train", train), ("evaluate", evaluate), ("snapshot", snapshot), ("restore", restore),
                  ("score", score))}
    steps = checks.integer("steps", steps, 1)
    eval_every = checks.integer("eval_every", eval_every, 1, steps)
    if target is not None:
        target = checks.number("target", target)
    if not isinstance(higher_is_better, bool):
        raise ValueError(f"higher_is_better must be True or False, got {higher_is_better!r}")
    if num_examples is not None:
        num_examples = checks.integer("num_examples", num_examples, 1)
    given = _checked_provenance(provenance)
    fit = {"fit.steps": steps, "fit.eval_every": eval_every, "fit.higher_is_better": higher_is_better}
    if path.exists():
        found = IrreducibleModel.load(path)
        saved = {**found.provenance, **found.fit}
        wanted = {**given, **fit}
        differing = {key: (saved.get(key, _MISSING), wanted.get(key, _MISSING))
                     for key in sorted(set(saved) | set(wanted))
                     if _canonical(saved.get(key, _MISSING)) != _canonical(wanted.get(key, _MISSING))}
        if differing:
            raise ProvenanceMismatch(path, differing)
        if num_examples is not None and len(found.losses) != num_examples:
            raise ValueError(f"{path} holds {len(found.losses)} irreducible losses, expected num_examples = "
                             f"{num_examples}")
        _warn_if_weaker(found, target)
        return found
    model = _fit(callables, steps, eval_every, higher_is_better, num_examples, given, fit)
    model.save(path)
    _warn_if_weaker(model, target)
    return model


def _fit(calls: dict, steps: int, eval_every: int, higher_is_better: bool, num_examples: int | None,
         provenance: dict, fit: dict) -> IrreducibleModel:
    trained, selected, scored = _Clock(), _Clock(), _Clock()
    done, curve, best, best_quality, best_step = 0, [], None, None, 0
    while done < steps:
        chunk = min(eval_every, steps - done)
        with trained:
            calls["train"](chunk)
        done += chunk
        with selected:
            quality = _number(calls["evaluate"]())
            if not math.isfinite(quality):
                raise ValueError(f"evaluate() returned {quality} after {done} steps; it must be finite")
            curve.append((done, quality))
            better = best_quality is None or (quality > best_quality if higher_is_better else quality < best_quality)
            if better:
                best, best_quality, best_step = calls["snapshot"](), quality, done
    with selected:
        calls["restore"](best)
    with scored:
        losses = np.array(to_numpy(calls["score"](), "losses"), np.float64)
    if losses.ndim != 1 or losses.size == 0 or (num_examples is not None and losses.shape != (num_examples,)):
        want = f"({num_examples},)" if num_examples is not None else "(N,)"
        raise ValueError(f"score() must return one loss per training example, shape {want}, got {losses.shape}")
    bad = np.flatnonzero(~np.isfinite(losses))
    if len(bad):
        raise ValueError(f"score() returned a non-finite loss: losses[{bad[0]}] = {losses[bad[0]]}")
    losses.flags.writeable = False
    return IrreducibleModel(losses, best_quality, best_step, steps, higher_is_better, tuple(curve), provenance,
                            trained.cpu, trained.wall, selected.cpu, selected.wall, scored.cpu, scored.wall,
                            loaded=False, fit=fit)


def _warn_if_weaker(model: IrreducibleModel, target: float | None) -> None:
    if target is not None and model.weaker_than(target):
        warnings.warn(f"the irreducible-loss model reaches {model.quality:.4g} on its held-out slice, weaker than the "
                      f"target {target:.4g}: RHO-LOSS will stall near the irreducible-loss model's quality; train it "
                      f"longer, on more hold-out data, or make it stronger", UserWarning, stacklevel=3)

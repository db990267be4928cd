"""Irreducible losses for `ReducibleLoss` (RHO-LOSS), computed once, validated, and saved beside the run.

RHO-LOSS needs, for every training example, the loss of a model that never trained on it: a small model is
trained on a held-out split, then scores every training example. That costs one training run of the small model
plus one forward pass over the training set, paid once.

`fit_irreducible` (use this) trains the irreducible-loss (IL) model through callables you pass (so any framework
fits), keeps the checkpoint that is best on a held-out slice *of the hold-out split* (never on the evaluation
set), scores the training set from that checkpoint, and records what it cost (CPU and wall seconds of training,
of checkpoint selection and of scoring), how good the IL model is, and what made it (``provenance``: data
digest, split, label-noise seed, model config). A later call with the same path and the same provenance loads
the file instead of refitting, and a call whose provenance differs is refused, naming the keys that differ.
Why: RHO-LOSS stalls near the IL model's own quality, so a weak or mismatched IL model silently caps what selection
adds (issue 28's audit: an IL model trained 420 steps without validation reached 0.686 dev accuracy, below the
0.70 target). "Stalls": once the main model's loss is below the IL model's on most rows, the reducible loss no
longer tells mislabelled rows from learnt ones, and RHO-LOSS picks mislabelled rows at about the pool's rate
while still paying for scoring (docs/selection.md, 'What "stalls" means', has the measured shares).

The file is a state file like every other the library writes (`replayloader.state.save_state`: atomic, every
array digested) and is validated before anything is returned. A damaged file (truncated, flipped bytes,
non-finite or missing losses, negative costs, a best step outside the fit) raises `InvalidState` in one line
naming the file and the field, or, with ``on_invalid="refit"``, is fitted again with a warning saying why. Why:
RHO-LOSS subtracts these losses from every score, so a file that loads silently wrong corrupts the whole run
without a sign (issue 43: a NaN or a short loss array used to load with ``loaded=True``).

`irreducible_losses` is the 1.0 function, kept for old callers; its file is validated the same way. Its file
holds losses and their cost only (no IL model, quality or provenance), so `fit_irreducible` and
`IrreducibleModel.load` refuse it and `IrreducibleLosses.load` reads it.

Files written by 1.0 are plain ``np.savez`` archives with no digest and no count of training examples: the
losses file (`irreducible_losses`: ``losses`` plus ``train_cpu_s``, ``score_cpu_s``, ``train_wall_s``,
``score_wall_s``) and the IL model file (`fit_irreducible`: those, the two ``select_*`` costs, ``quality``,
``best_step``, ``steps``, ``higher_is_better``, ``curve_steps``, ``curve_quality`` and a JSON ``meta``). They
load, validated, only when the caller says how many training examples there are (``num_examples``, which
`irreducible_losses` always does): the model file wherever a model file loads, the losses file wherever a
losses file loads. Without ``num_examples`` they are refused with a message saying to pass it, since a file
that cannot say how many losses it should hold cannot be checked.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
import warnings
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from .. import _checks as checks
from ..state import checks as state_checks
from ..state.checks import InvalidState
from ..state.files import StateFileError, load_state, save_state
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
        """One state file (`replayloader.state.save_state`: atomic, digested) holding the losses and their cost.
        Checked first with the checks `load` makes (one finite loss per example, costs finite and >= 0): a
        ValueError naming the field otherwise, and nothing is written."""
        path = checks.path("path", path)
        save_state(_checked_for_save(self, "losses", path, {}), path)

    @classmethod
    def load(cls, path: str | Path, *, num_examples: int | None = None) -> IrreducibleLosses:
        """The losses and cost of any irreducible-loss file: one `save`, `IrreducibleModel.save` or
        `fit_irreducible` wrote, or either file of 1.0 (plain ``np.savez``), validated (`InvalidState` naming the
        file and the field otherwise). ``num_examples``, if given, must equal the file's count of losses
        (`ProvenanceMismatch`, a ValueError, otherwise); a 1.0 file records no count, so it loads only with
        ``num_examples``."""
        path = checks.path("path", path)
        if num_examples is not None:
            num_examples = checks.integer("num_examples", num_examples, 1)
        try:
            found = _read_validated(path, num_examples, model=False)
        except _Unusable as err:
            raise InvalidState(f"{err}; {err.hint}") from None
        _check_count(path, found["losses"], num_examples)
        return cls(found["losses"], *(found[key] for key in ("train_cpu_s", "score_cpu_s", "train_wall_s",
                                                             "score_wall_s")))


def irreducible_losses(path: str | Path, num_examples: int, train: Callable[[], Any],
                       score: Callable[[Any], Any]) -> IrreducibleLosses:
    """The 1.0 form (prefer `fit_irreducible`, which validates the IL model and refuses a file made from other
    data). Load ``path`` if it holds ``num_examples`` losses; else ``model = train()`` (fit the small model on the
    held-out split), ``losses = score(model)`` (per-example loss of every training example, dataset order, shape
    (num_examples,)), check them (finite), save them to ``path`` with their cost, and return them. A damaged file
    raises `InvalidState` (see `IrreducibleLosses.load`)."""
    path = checks.path("path", path)
    num_examples = checks.integer("num_examples", num_examples, 1)
    train, score = checks.function("train", train), checks.function("score", score)
    if path.exists():
        return IrreducibleLosses.load(path, num_examples=num_examples)
    cpu, wall = time.process_time(), time.perf_counter()
    model = train()
    cpu_train, wall_train = time.process_time(), time.perf_counter()
    scored = score(model)
    cpu_score, wall_score = time.process_time(), time.perf_counter()
    losses = _scored_losses(scored, "score(model)", num_examples)
    result = IrreducibleLosses(losses, cpu_train - cpu, cpu_score - cpu_train, wall_train - wall,
                               wall_score - wall_train)
    result.save(path)
    return result


# ---------------------------------------------------------------------------------------------------- validated
FORMAT = "replayloader.irreducible/3"  # a save_state file; /2 was 1.0's np.savez with a JSON "meta" member
LEGACY_FORMAT = "replayloader.irreducible/2"
_COSTS = ("train_cpu_s", "train_wall_s", "score_cpu_s", "score_wall_s")
_SELECT_COSTS = ("select_cpu_s", "select_wall_s")
_LEGACY_MEMBER = "train_cpu_s.npy"  # 1.0's np.savez wrote each cost as a member; save_state files keep them in JSON
_FIT_KEYS = ("fit.steps", "fit.eval_every", "fit.higher_is_better")  # how the model was fitted, compared too


class ProvenanceMismatch(ValueError):
    """A saved irreducible-loss file was made from other inputs than the ones given now (``differing``: the keys)."""

    def __init__(self, path: str | Path, differing: dict[str, tuple[Any, Any]], message: str | None = None) -> None:
        self.path, self.differing = str(path), differing
        listed = "; ".join(f"{key}: saved {_short(saved)}, given {_short(given)}"
                           for key, (saved, given) in differing.items())
        super().__init__(message or f"{path} holds irreducible losses made from other inputs ({len(differing)} "
                         f"differing provenance key{'s' if len(differing) != 1 else ''}: {listed}); delete it, or "
                         f"give another path, to fit the irreducible-loss model for these inputs")


def _canonical(value: Any) -> str:
    return "<missing>" if value is _MISSING else json.dumps(value, sort_keys=True, default=repr)


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
        """Whether the IL model's best quality is worse than ``target``, compared as they are: ``target`` must be in
        ``evaluate``'s units on ``evaluate``'s labels (the held-out slice's, noisy if the training labels are; a
        clean dev-set target is higher than the same model's noisy-label score, docs/selection.md)."""
        target = checks.number("target", target)
        return self.quality < target if self.higher_is_better else self.quality > target

    def save(self, path: str | Path) -> None:
        """One state file (`replayloader.state.save_state`: atomic, every array digested); `load` validates it and
        `IrreducibleLosses.load` reads its losses and cost too. Provenance and fit are kept as JSON text, so their
        keys may hold any character (state keys may not hold '.'). Checked first with the checks `load` makes
        (finite losses, costs finite and >= 0, the best step inside the fit and on the curve with the curve's
        quality, ...): a ValueError naming the field otherwise, and nothing is written."""
        path = checks.path("path", path)
        where = type(self).__name__
        try:
            curve = [(step, quality) for step, quality in self.curve]
            provenance, fit = (json.dumps(getattr(self, key), sort_keys=True) for key in ("provenance", "fit"))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where}: curve must be (step, quality) pairs and provenance and fit JSON-able "
                             f"({err}); nothing was written to {path}") from None
        raw = {key: getattr(self, key) for key in _SELECT_COSTS + ("quality", "best_step", "steps",
                                                                  "higher_is_better")}
        raw.update(curve_steps=np.asarray([c[0] for c in curve]), curve_quality=np.asarray([c[1] for c in curve]),
                   provenance=provenance, fit=fit)
        save_state(_checked_for_save(self, "model", path, raw), path)

    @classmethod
    def load(cls, path: str | Path, *, num_examples: int | None = None) -> IrreducibleModel:
        """Read an IL model file (`save` or `fit_irreducible` wrote it), validated: losses finite, one per
        training example the file records; costs finite and >= 0; the best step inside the fit and on its curve,
        with ``quality`` equal to the curve's value there. A file that fails raises `InvalidState` naming the
        file and the field. A file that holds losses only (`irreducible_losses` or `IrreducibleLosses.save`, of
        this version or 1.0) has no IL model to load: it is refused, saying to read it with
        `IrreducibleLosses.load`. ``num_examples``, if given, must equal the file's count of losses
        (`ProvenanceMismatch`, a ValueError, otherwise); the IL model file of 1.0 (plain ``np.savez``) records
        no count, so it loads only with ``num_examples``."""
        path = checks.path("path", path)
        if num_examples is not None:
            num_examples = checks.integer("num_examples", num_examples, 1)
        try:
            found = _load_model(path, num_examples)
        except _Unusable as err:
            raise InvalidState(f"{err}; {err.hint}") from None
        _check_count(path, found.losses, num_examples)
        return found


def _check_count(path: str | Path, losses: np.ndarray, num_examples: int | None) -> None:
    """A valid file made for another number of training examples: the caller's inputs differ, not the file, so
    it is a `ProvenanceMismatch` (never refit), keyed ``num_examples``."""
    if num_examples is not None and len(losses) != num_examples:
        raise ProvenanceMismatch(path, {"num_examples": (len(losses), num_examples)},
                                 f"{path} holds {len(losses)} irreducible losses, expected num_examples = "
                                 f"{num_examples}; delete it, or give another path, to compute them for these inputs")


class _Unusable(InvalidState):
    """A file this call cannot use as it stands, though it may be sound: ``hint`` is the one way forward for a
    direct load (`fit_irreducible` words its own)."""

    def __init__(self, message: str, hint: str, *, no_count: bool = False) -> None:
        super().__init__(message)
        self.hint, self.no_count = hint, no_count


_NUM_EXAMPLES_HINT = "pass num_examples=<number of training examples> to load it validated"


def _load_model(path: Path, num_examples: int | None) -> IrreducibleModel:
    found = _read_validated(path, num_examples, model=True)
    losses = found["losses"]
    losses.flags.writeable = False
    return IrreducibleModel(losses, found["quality"], found["best_step"], found["steps"], found["higher_is_better"],
                            found["curve"], found["provenance"],
                            *(found[key] for key in ("train_cpu_s", "train_wall_s", "select_cpu_s", "select_wall_s",
                                                     "score_cpu_s", "score_wall_s")),
                            loaded=True, fit=found["fit"])


def _read_validated(path: Path, num_examples: int | None, *, model: bool) -> dict[str, Any]:
    """Every field of an irreducible-loss file, checked (`InvalidState` naming the file and the field otherwise).

    Nothing is returned, and no object built, until the whole file has passed: a refused file leaves nothing
    half-loaded. Both layouts are read: the state file of `save` and 1.0's plain ``np.savez`` (told apart by
    a member only 1.0 wrote; a file too damaged to tell goes to `load_state`, which names what is wrong).
    """
    where = str(path)
    try:
        with zipfile.ZipFile(path) as archive:
            legacy = _LEGACY_MEMBER in archive.namelist()
    except Exception:  # unreadable here means unreadable for load_state too: it says why in the library's words
        legacy = False
    if legacy:
        return _validated(_read_legacy(path), where, num_examples, legacy=True, model=model)
    try:
        fields = load_state(path)
    except StateFileError as err:
        raise InvalidState(" ".join(str(err).split("\n"))) from None
    return _validated(fields, where, num_examples, legacy=False, model=model)


def _read_legacy(path: Path) -> dict[str, Any]:
    """A 1.0 file's members, all read before any is checked (numpy's and zipfile's errors become `InvalidState`)."""
    try:
        with open(path, "rb") as f, np.load(f, allow_pickle=False) as data:  # np.load leaks a handle it opened
            fields: dict[str, Any] = {key: data[key] for key in data.files}
    except Exception as err:  # zipfile (bad CRC), numpy (bad header) and EOF errors all mean a damaged file
        raise InvalidState(f"{path}: not a readable irreducible-loss file (truncated or damaged?): "
                           f"{type(err).__name__}: {err}".replace("\n", " ")) from None
    if "meta" in fields:
        try:
            meta = json.loads(str(fields["meta"]))
        except ValueError as err:
            raise InvalidState(f"{path}['meta'] is not JSON: {err}") from None
        state_checks.require(isinstance(meta, dict) and meta.get("format") == LEGACY_FORMAT,
                             f"{path}['meta'] must have format {LEGACY_FORMAT!r}, got "
                             f"{meta.get('format') if isinstance(meta, dict) else meta!r}")
        fields.update(provenance=meta.get("provenance"), fit=meta.get("fit", {}))
    return fields


def _json_object(value: Any, name: str, *, empty: bool) -> dict:
    """A provenance or fit record: a JSON object (text in a state file, already parsed in a 1.0 file)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as err:
            raise InvalidState(f"{name} is not JSON: {err}") from None
    state_checks.require(isinstance(value, dict) and (empty or value),
                         f"{name} must be a{'' if empty else ' non-empty'} JSON object, got {_short(value)}")
    return value


def _validated(fields: Any, where: str, num_examples: int | None, *, legacy: bool,
               model: bool = False) -> dict[str, Any]:
    """The checks of issue 43, for either layout; the counts of the file, never the caller's, size the losses
    (except in a 1.0 file, which records none: there ``num_examples`` is required). ``model``: the caller needs
    an IL model (quality, curve, provenance), so a file of losses only is refused before anything else."""
    state_checks.require(isinstance(fields, dict), f"{where} must hold a mapping, got {type(fields).__name__}")
    if not legacy:
        state_checks.require(fields.get("format") == FORMAT,
                             f"{where}['format'] must be {FORMAT!r}, got {_short(fields.get('format'))}")
    kind = ("model" if "meta" in fields else "losses") if legacy else fields.get("kind")
    state_checks.require(kind in ("model", "losses"), f"{where}['kind'] must be 'model' or 'losses', got "
                                                      f"{_short(kind)}")
    if model and kind == "losses":
        raise _Unusable(f"{where} has no provenance (written by irreducible_losses or IrreducibleLosses.save"
                        f"{' of replayloader 1.0' if legacy else ''}): it holds irreducible losses only, no IL model "
                        f"to load or to check against these inputs",
                        "read its losses with IrreducibleLosses.load")
    if legacy:
        if num_examples is None:
            raise _Unusable(f"{where} was written by replayloader 1.0 (np.savez: no digest, no count of training "
                            f"examples), so its losses cannot be checked", _NUM_EXAMPLES_HINT, no_count=True)
        examples = num_examples
    else:
        examples = state_checks.integer(fields, "examples", where, 1)
    losses = state_checks.array(fields, "losses", where, (examples,), "f", np.float64)
    state_checks.finite(losses, f"{where}['losses']")
    found: dict[str, Any] = {"kind": kind, "losses": losses}
    costs = _COSTS + (_SELECT_COSTS if kind == "model" else ())
    found.update({key: state_checks.number(fields, key, where, 0.0) for key in costs})
    if kind == "model":
        steps = state_checks.integer(fields, "steps", where, 1)
        best_step = state_checks.integer(fields, "best_step", where, 1, steps)  # inside the fit
        curve_steps = state_checks.array(fields, "curve_steps", where, (-1,), "iu", np.int64)
        curve_quality = state_checks.array(fields, "curve_quality", where, (len(curve_steps),), "f", np.float64)
        state_checks.finite(curve_quality, f"{where}['curve_quality']")
        state_checks.require(len(curve_steps) > 0 and curve_steps[0] >= 1 and curve_steps[-1] <= steps
                             and bool(np.all(np.diff(curve_steps) > 0)),
                             f"{where}['curve_steps'] must rise strictly within [1, {steps}], got "
                             f"{_short(curve_steps.tolist())}")
        at = np.flatnonzero(curve_steps == best_step)
        state_checks.require(len(at) == 1, f"{where}['best_step'] = {best_step} is not a step of its curve")
        quality = state_checks.number(fields, "quality", where)
        state_checks.require(quality == curve_quality[at[0]], f"{where}['quality'] = {quality!r} is not the curve's "
                                                              f"quality at best_step {best_step} "
                                                              f"({curve_quality[at[0]]!r})")
        found.update(steps=steps, best_step=best_step, quality=quality,
                     higher_is_better=state_checks.boolean(fields, "higher_is_better", where),
                     curve=tuple((int(a), float(b)) for a, b in zip(curve_steps, curve_quality)),
                     provenance=_json_object(fields.get("provenance"), f"{where}['provenance']", empty=False),
                     fit=_json_object(fields.get("fit", {}), f"{where}['fit']", empty=True))
    return found


def _checked_for_save(item: Any, kind: str, path: Path, raw: dict) -> dict[str, Any]:
    """The fields `save` writes, after the checks `load` makes (`_validated`), so a file `save` writes always
    loads: a ValueError naming the field otherwise, before anything is written."""
    where = type(item).__name__
    losses = to_numpy(item.losses, "losses")
    if losses.ndim != 1 or losses.size == 0:
        raise ValueError(f"{where}['losses'] must hold one loss per training example (a non-empty 1-D array), got "
                         f"shape {losses.shape}; nothing was written to {path}")
    raw = {"format": FORMAT, "kind": kind, "examples": len(losses), "losses": losses,
           **{key: getattr(item, key) for key in _COSTS}, **raw}
    try:
        found = _validated(raw, where, None, legacy=False)
    except InvalidState as err:
        raise ValueError(f"{err}; nothing was written to {path}") from None
    fields = {"format": FORMAT, "kind": kind, "examples": len(found["losses"]), "losses": found["losses"],
              **{key: found[key] for key in _COSTS + (_SELECT_COSTS if kind == "model" else ())}}
    if kind == "model":
        fields.update(quality=found["quality"], best_step=found["best_step"], steps=found["steps"],
                      higher_is_better=found["higher_is_better"],
                      curve_steps=np.array([c[0] for c in found["curve"]], np.int64),
                      curve_quality=np.array([c[1] for c in found["curve"]], np.float64),
                      provenance=json.dumps(found["provenance"], sort_keys=True),
                      fit=json.dumps(found["fit"], sort_keys=True))
    return fields


def _scored_losses(value: Any, who: str, num_examples: int | None) -> np.ndarray:
    """What ``score`` returned, as one finite float64 loss per training example (a ValueError naming ``who``,
    and ``num_examples`` where it set the count, otherwise)."""
    losses = to_numpy(value, "losses")
    if losses.dtype.kind not in "iuf":
        raise ValueError(f"{who} must return numbers, one loss per training example, got dtype {losses.dtype}")
    losses = np.array(losses, np.float64)
    if losses.ndim != 1 or losses.size == 0 or (num_examples is not None and losses.shape != (num_examples,)):
        want = f"({num_examples},)" if num_examples is not None else "(N,)"
        said = f" (num_examples = {num_examples})" if num_examples is not None else ""
        raise ValueError(f"{who} must return one loss per training example, shape {want}, got {losses.shape}{said}")
    bad = np.flatnonzero(~np.isfinite(losses))
    if len(bad):
        raise ValueError(f"{who} returned a non-finite loss: losses[{bad[0]}] = {losses[bad[0]]}")
    return losses


class _Clock:
    """CPU and wall seconds spent inside ``with clock:`` blocks, summed."""

    def __init__(self) -> None:
        self.cpu = self.wall = 0.0

    def __enter__(self) -> None:
        self._cpu, self._wall = time.process_time(), time.perf_counter()

    def __exit__(self, *exc: Any) -> None:
        self.cpu += time.process_time() - self._cpu
        self.wall += time.perf_counter() - self._wall


def fit_irreducible(path: str | Path, *, train: Callable[[int], Any], evaluate: Callable[[], float],
                    snapshot: Callable[[], Any], restore: Callable[[Any], Any], score: Callable[[], Any],
                    provenance: Mapping[str, Any], steps: int, eval_every: int, target: float | None = None,
                    higher_is_better: bool = True, num_examples: int | None = None,
                    on_invalid: Literal["refuse", "refit"] = "refuse") -> IrreducibleModel:
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
    `ProvenanceMismatch` listing the keys. ``target``: the quality the main run aims at, compared with ``quality``
    as it is, so in ``evaluate``'s units *and on its labels*; if the IL model's best is worse, one `UserWarning`
    line says so (RHO-LOSS stalls near the IL model's quality, fitted or loaded alike). A run's target is usually
    measured on clean labels and ``evaluate`` on the hold-out slice's noisy ones, where the same model scores
    lower (two classes, 20% flipped: 0.863 clean is 0.718 noisy): let ``evaluate`` use the slice's clean labels
    where you have them, or convert the target to noisy-label units first (docs/selection.md, "`target`: one
    number"). ``num_examples``: the expected number of losses (pass it: the file's own count is checked against
    its losses, but only ``num_examples`` ties it to your training set); a loaded file with another count raises
    `ProvenanceMismatch` (key ``num_examples``), and it is required to load the IL model file of 1.0, which
    records no count.

    A file at ``path`` that fails validation (unreadable, truncated, damaged bytes, non-finite or missing losses,
    negative costs, a best step outside the fit: see `IrreducibleModel.load`), or that holds losses only (written
    by `irreducible_losses`), raises `InvalidState` in one line naming the file and the field, before anything is
    trained or written (``on_invalid="refuse"``, the default: a file that silently changed should be looked at,
    not papered over). With ``on_invalid="refit"`` it is fitted again and replaced (atomically, only once the new
    fit is valid), and one `UserWarning` line says why. A `ProvenanceMismatch` (other provenance, or another
    ``num_examples``) is never refit: that file is valid, for other inputs.

    Returns an `IrreducibleModel` (losses, quality, curve, cost, provenance, ``loaded``). Nothing is written unless
    the fit and its scores are valid (finite evaluations, one finite loss per example).
    """
    path = checks.path("path", path)
    callables = {name: checks.function(name, value) for name, value in
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
    if on_invalid not in ("refuse", "refit"):
        raise ValueError(f"on_invalid must be 'refuse' or 'refit', got {on_invalid!r}")
    given = _checked_provenance(provenance)
    fit = {"fit.steps": steps, "fit.eval_every": eval_every, "fit.higher_is_better": higher_is_better}
    found = None
    if path.exists():
        try:
            found = _load_model(path, num_examples)
        except InvalidState as err:
            if on_invalid == "refuse":
                hint = "delete it, or pass on_invalid='refit', to fit the irreducible-loss model again"
                if isinstance(err, _Unusable) and err.no_count:
                    hint = f"{_NUM_EXAMPLES_HINT} (on_invalid='refit' fits the model again instead)"
                raise InvalidState(f"{err}; {hint}") from None
            warnings.warn(f"refitting the irreducible-loss model, as on_invalid='refit' asks: {err}", UserWarning,
                          stacklevel=2)
    if found is not None:
        saved = {**found.provenance, **found.fit}
        wanted = {**given, **fit}
        differing = {key: (saved.get(key, _MISSING), wanted.get(key, _MISSING))
                     for key in sorted(set(saved) | set(wanted))
                     if _canonical(saved.get(key, _MISSING)) != _canonical(wanted.get(key, _MISSING))}
        if differing:
            raise ProvenanceMismatch(path, differing)
        _check_count(path, found.losses, num_examples)
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
        found = calls["score"]()
    losses = _scored_losses(found, "score()", num_examples)
    losses.flags.writeable = False
    return IrreducibleModel(losses, best_quality, best_step, steps, higher_is_better, tuple(curve), provenance,
                            trained.cpu, trained.wall, selected.cpu, selected.wall, scored.cpu, scored.wall,
                            loaded=False, fit=fit)


def _warn_if_weaker(model: IrreducibleModel, target: float | None) -> None:
    if target is not None and model.weaker_than(target):
        warnings.warn(f"the irreducible-loss model reaches {model.quality:.4g} on its held-out slice (evaluate()'s "
                      f"units and labels), weaker than the target {target:.4g}: RHO-LOSS will stall near the "
                      f"irreducible-loss model's quality; train it longer, on more hold-out data, or make it "
                      f"stronger (a target on clean labels is not comparable with a score on noisy ones: convert "
                      f"it, or evaluate on clean labels)", UserWarning, stacklevel=3)

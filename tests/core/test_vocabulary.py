"""The public API's shared words, checked (as ``test_layout.py`` checks the layering): every name in the
``__all__`` of ``replayloader`` and of its subpackages (the lazily imported ones too, where their extra is
installed) speaks one vocabulary.

- One feedback verb: ``feedback(batch_or_ids, **signals)``: the batch (or its ids) by position, every signal
  by keyword.
- One pair of draws: ``next_batch()`` (the next batch of a stream) and ``sample(k)`` (k rows of a buffer), with
  any option keyword-only; no other draw verb (``draw``, ``next``, ...) on a public class.
- ``beta`` is the importance exponent, and only that: every public ``beta`` is evaluated by
  `replayloader.schedules.value_at` (a number or a schedule, one check, one error).
- ``config()`` (not ``describe()``) is what an object records of its settings.
- A batch record's ``weights`` are always an array.

A name kept for one release with a DeprecationWarning is a `_moved` descriptor, not a method: it passes.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import warnings

import pytest

import replayloader

SUBPACKAGES = ("buffer", "distributed", "loader", "mixing", "prompts", "ray", "sampler", "sb3", "selection",
               "state", "strategies", "torch")

# Exceptions, each with its reason. Keep this short: a new entry needs a reason a reviewer accepts.
RULE_SIDE_FEEDBACK = {
    # A mixing rule is not a stream: the sampler hands it one step's per-source mean losses and counts (both
    # arrays of length K), never a batch. Users write their own rules to this protocol.
    "MixingRule", "FixedMixture", "ODM", "ODMExp3", "ExcessLoss", "ADO",
}
FRAMEWORK_SIGNATURES = {
    # SB3's `ReplayBuffer.sample(batch_size, env=None)`: SB3's algorithms call it positionally.
    ("PrioritizedMixin", "sample"), ("PrioritizedReplayBuffer", "sample"), ("PrioritizedDictReplayBuffer", "sample"),
    ("PrioritizedNStepReplayBuffer", "sample"),
}
FRAMEWORK_FEEDBACK = {
    # verl's AbstractCurriculumSampler contract: verl's trainer calls `update(batch)`; it feeds `feedback`.
    ("VerlPromptSampler", "update"),
}
OTHER_DRAW_VERBS = ("draw", "next", "draw_batch", "sample_batch", "get_batch", "next_sample", "sample_indices")
FIXED_BETA = {
    # One selection step's importance exponent, a number: a `Rule` picks from one scored pool and has no clock
    # (`pick(scores, rng, k)`) for a schedule to read.
    "Proportional",
}


def public_objects():
    """(dotted name, object) for every name in every public ``__all__``; a name whose extra is missing is
    skipped (its module raises ModuleNotFoundError on import, which is the contract)."""
    modules = [replayloader]
    for name in SUBPACKAGES:
        try:
            modules.append(importlib.import_module(f"replayloader.{name}"))
        except ModuleNotFoundError:  # ray, sb3: the package itself needs the extra
            continue
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the 1.0 top-level names are checked elsewhere
        for module in modules:
            for name in module.__all__:
                try:
                    yield f"{module.__name__}.{name}", getattr(module, name)
                except ModuleNotFoundError:  # a lazy name whose extra is not installed
                    continue


def public_classes():
    found = {}
    for where, obj in public_objects():
        if inspect.isclass(obj) and obj.__module__.startswith("replayloader"):
            found.setdefault(obj, where)
    return sorted(found.items(), key=lambda item: item[1])


def own_methods(cls):
    """Public methods of ``cls`` written in replayloader (not those inherited from torch, SB3, HF, ...)."""
    for name, member in inspect.getmembers(cls):
        if name.startswith("_") or not callable(member) or inspect.isclass(member):
            continue
        if getattr(member, "__module__", "").startswith("replayloader"):
            yield name, member


def positional_parameters(function):
    """The parameters after ``self`` of ``function``'s signature (which follows ``__wrapped__``)."""
    parameters = list(inspect.signature(function).parameters.values())
    return parameters[1:] if parameters and parameters[0].name in ("self", "cls") else parameters


CLASSES = public_classes()
IDS = [where for _, where in CLASSES]


def test_the_walk_reaches_every_public_face():
    names = {where for where, _ in public_objects()}
    for expected in ("replayloader.ReplayBuffer", "replayloader.mixing.MixtureSampler",
                     "replayloader.selection.SelectiveBackprop", "replayloader.prompts.PromptSampler"):
        assert expected in names
    for extra, name in (("torch", "replayloader.torch.ProxyScorer"), ("torch", "replayloader.torch.MixtureBatchSampler"),
                        ("stable_baselines3", "replayloader.sb3.PrioritizedReplayBuffer"),
                        ("ray", "replayloader.ray.ShardedBuffer")):
        assert importlib.util.find_spec(extra) is None or name in names, name


@pytest.mark.parametrize("cls", [cls for cls, _ in CLASSES], ids=IDS)
def test_every_feedback_is_feedback_batch_or_ids_then_signals_by_keyword(cls):
    if cls.__name__ in RULE_SIDE_FEEDBACK or any(base.__name__ == "MixingRule" for base in cls.__mro__[1:]):
        return
    for name, method in own_methods(cls):
        if name != "feedback":
            continue
        parameters = positional_parameters(method)
        assert parameters, f"{cls.__name__}.feedback takes no batch"
        first, rest = parameters[0], parameters[1:]
        assert first.kind in (first.POSITIONAL_ONLY, first.POSITIONAL_OR_KEYWORD), \
            f"{cls.__name__}.feedback: the batch (or ids) comes first, by position"
        loose = [p.name for p in rest if p.kind not in (p.KEYWORD_ONLY, p.VAR_KEYWORD)]
        assert not loose, f"{cls.__name__}.feedback{inspect.signature(method)}: signals {loose} must be keyword-only"


@pytest.mark.parametrize("cls", [cls for cls, _ in CLASSES], ids=IDS)
def test_no_other_feedback_verb_than_feedback(cls):
    """0.1's ``update`` is a deprecated descriptor now; SB3's ``update_priorities`` is kept as an alias that
    calls ``feedback`` (SB3 and cpprb users expect it), and a framework's own contract calls ``feedback``."""
    for name, method in own_methods(cls):
        if (cls.__name__, name) in FRAMEWORK_FEEDBACK:
            assert ".feedback(" in inspect.getsource(method), f"{cls.__name__}.{name} does not feed feedback"
        elif name == "update":
            pytest.fail(f"{cls.__name__}.update: the feedback verb is feedback")
        if name == "update_priorities":
            assert "self.feedback(" in inspect.getsource(method), f"{cls.__name__}.update_priorities is no alias"


@pytest.mark.parametrize("cls", [cls for cls, _ in CLASSES], ids=IDS)
def test_every_draw_is_next_batch_or_sample_k(cls):
    methods = dict(own_methods(cls))
    other = [name for name in OTHER_DRAW_VERBS if name in methods]
    assert not other, f"{cls.__name__}.{other}: a draw is next_batch() or sample(k)"
    if "next_batch" in methods:
        required = [p.name for p in positional_parameters(methods["next_batch"]) if p.default is p.empty
                    and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        assert not required, f"{cls.__name__}.next_batch() takes no argument, got {required}"
    if "sample" in methods and (cls.__name__, "sample") not in FRAMEWORK_SIGNATURES:
        parameters = positional_parameters(methods["sample"])
        assert parameters and parameters[0].kind == parameters[0].POSITIONAL_OR_KEYWORD \
            and parameters[0].default is parameters[0].empty, f"{cls.__name__}.sample(k): k first, required"
        loose = [p.name for p in parameters[1:] if p.kind not in (p.KEYWORD_ONLY, p.VAR_KEYWORD)]
        assert not loose, f"{cls.__name__}.sample(k): options {loose} must be keyword-only"


def beta_owners():
    """Every public class (and its method) or function with a parameter named ``beta``."""
    found = []
    for cls, where in CLASSES:
        for name, method in [("__init__", cls.__init__), *own_methods(cls)]:
            try:
                if "beta" in inspect.signature(method).parameters:
                    found.append((where, cls, name))
            except (TypeError, ValueError):
                continue
    for where, obj in public_objects():
        if inspect.isfunction(obj) and "beta" in inspect.signature(obj).parameters:
            found.append((where, obj, None))
    return found


def test_every_beta_is_the_importance_exponent_through_value_at():
    """A ``beta`` is read at one place, `schedules.value_at` (a number or a schedule of the owner's clock):
    the owner (or a base written in replayloader) calls ``value_at("beta", ...)``."""
    owners = beta_owners()
    assert {where.rsplit(".", 1)[1] for where, _, _ in owners} >= {"ReplayBuffer", "PrioritizedSampler"}
    for where, owner, _ in owners:
        if getattr(owner, "__name__", "") in FIXED_BETA:
            continue
        bases = owner.__mro__ if inspect.isclass(owner) else (owner,)
        sources = [inspect.getsource(base) for base in bases if base.__module__.startswith("replayloader")]
        assert any('value_at("beta"' in source for source in sources), \
            f"{where} takes beta= but never evaluates it with schedules.value_at"


def test_a_beta_that_is_not_an_importance_exponent_has_another_name():
    """SelectiveBackprop's exponent (Jiang et al.'s β) is ``selectivity`` since 1.1."""
    owners = {where.rsplit(".", 1)[1] for where, _, _ in beta_owners()}
    assert "SelectiveBackprop" not in owners


@pytest.mark.parametrize("cls", [cls for cls, _ in CLASSES], ids=IDS)
def test_settings_are_config_not_describe(cls):
    assert "describe" not in dict(own_methods(cls)), f"{cls.__name__}.describe(): the library's word is config()"


@pytest.mark.parametrize("cls", [cls for cls, _ in CLASSES if dataclasses.is_dataclass(cls)],
                         ids=[where for cls, where in CLASSES if dataclasses.is_dataclass(cls)])
def test_a_batch_records_weights_are_typed_as_the_array_they_always_are(cls):
    fields = {f.name: f.type for f in dataclasses.fields(cls)}
    if "weights" in fields:
        assert fields["weights"] in ("np.ndarray", "numpy.ndarray") or fields["weights"] is __import__("numpy").ndarray, \
            f"{cls.__name__}.weights is typed {fields['weights']!r}"

"""The import paths of 0.1, kept working for one release (1.0) with a DeprecationWarning; gone in the next.

1.0 grouped the flat modules into folders by role (``replayloader/buffer/``, ``loader/``, ``selection/``,
``distributed/``, ``torch/``, ``state/`` ...). Rather than a shim file per old module, one import hook serves
every old module path (`MOVED_MODULES`), and `moved_name` serves the names that left the top level because they
are plumbing, not features (`MOVED_NAMES`). Both warn once per name, saying where it lives now.
"""
from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import inspect
import sys
import warnings
from typing import Any

MOVED_MODULES = {f"replayloader.{old}": f"replayloader.{new}" for old, new in {
    "atomic": "state.atomic", "checkpoint": "state.files", "state_checks": "state.checks",
    "storage": "buffer.storage", "locked": "buffer.locked", "feedback": "strategies.feedback",
    "workers": "loader.workers", "rate_limiter": "loader.rate_limiter", "deferred": "loader.deferred",
    "host_sync": "loader.host_sync", "score_select": "selection.score_then_select",
    "irreducible": "selection.irreducible", "distributed_select": "distributed.select",
    "shards": "distributed.replay_shard", "launcher": "distributed.launcher",
    "torch_sampler": "torch.batch_sampler", "torch_select": "torch.candidates", "hf_trainer": "torch.hf",
    "lightning": "torch.lightning", "ray.shards": "ray.sharded_buffer",
}.items()}
# 1.1 moves: the feedback rule is the strategy's (its update declares the keywords), not the buffer's; every torch
# adapter lives in replayloader.torch (the mixture's DataLoader parts and Trainer beside the sampler's and selection's).
MOVED_IN_1_1 = {f"replayloader.{old}": f"replayloader.{new}" for old, new in {
    "buffer.feedback": "strategies.feedback",
    "mixing.torch": "torch.mixing", "mixing.hf": "torch.mixing_trainer",
}.items()}
MOVED_MODULES.update(MOVED_IN_1_1)

MOVED_NAMES = {"SumTree": "replayloader.sumtree", "Storage": "replayloader.buffer",
               "LockedBuffer": "replayloader.buffer", "LimiterConfigError": "replayloader.loader",
               "flatten_state": "replayloader.state", "unflatten_state": "replayloader.state"}


# 1.1's small front: ``import replayloader`` exports what a user starts from and the errors; the rest lives in
# its subpackage (its public face), and the old top-level name warns for one release.
FRONT_1_1 = {name: f"replayloader.{home}" for home, names in {
    "buffer": ["Sample"],
    "loader": ["ReplayBatch", "RateLimiter"],
    "sampler": ["SampledBatch"],
    "selection": ["TopK", "Proportional", "SelectiveBackprop", "TrainingLoss", "ReducibleLoss",
                  "BufferScoreThenSelect", "irreducible_losses", "fit_irreducible", "ReusedPool", "SelectionSwitch"],
    "mixing": ["MixtureBatch", "FixedMixture", "ODM", "ExcessLoss"],
    "torch": ["CandidateBatchSampler", "BackgroundScorer", "ProxyScorer", "MixtureBatchSampler",
              "MixtureIterableDataset", "concat_sources"],
    "distributed": ["DistributedScoreThenSelect"],
}.items() for name in names}


def _warn(old: str, new: str, since: str = "1.0") -> None:
    warnings.warn(f"{old} moved to {new} in replayloader {since}; the old path will be removed in the next release",
                  DeprecationWarning, stacklevel=3)


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path as the module's new home (the same module object, so state is shared)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        if fullname in MOVED_MODULES:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        _warn(spec.name, MOVED_MODULES[spec.name], "1.1" if spec.name in MOVED_IN_1_1 else "1.0")
        return importlib.import_module(MOVED_MODULES[spec.name])

    def exec_module(self, module) -> None:  # the new home is already executed
        pass


def install() -> None:
    """First in line: a stale module file of the old layout (an old install, a leftover .py) must not shadow
    the new home; the hook claims only the old paths it lists."""
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedModules())


def moved_name(name: str) -> Any:
    """A name that left ``import replayloader``'s top level, from its new home (with the warning), or None."""
    home = MOVED_NAMES.get(name) or FRONT_1_1.get(name)
    if home is None:
        return None
    _warn(f"replayloader.{name}", f"{home}.{name}", "1.0" if name in MOVED_NAMES else "1.1")
    value = getattr(importlib.import_module(home), name)  # a name that needs torch: imported now, on first use
    setattr(sys.modules[__name__.rpartition(".")[0]], name, value)  # warned once; later lookups find it directly
    return value


class renamed:
    """A 0.1 name of a method or field, kept for one release. 1.0 has one feedback verb, ``feedback``, on buffers,
    samplers and loaders alike (0.1: ``update`` on buffers and samplers), and one meaning of a batch record's
    ``step`` (`ReplayBatch`'s producer count became ``produced``). Reading the old name warns and hands back the
    new attribute, so a subclass that overrides the new name is what an old call reaches."""

    def __init__(self, new: str, since: str = "1.0") -> None:
        self.new = new
        self.old = ""
        self.since = since

    def __set_name__(self, owner: type, name: str) -> None:
        self.old = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        warnings.warn(f"{type(obj).__name__}.{self.old} is deprecated since replayloader {self.since} and will be "
                      f"removed in the next release: use .{self.new}", DeprecationWarning, stacklevel=2)
        return getattr(obj, self.new)


def _deprecated(what: str, instead: str, since: str = "1.1") -> None:
    warnings.warn(f"{what} is deprecated since replayloader {since} and will be removed in the next release: "
                  f"use {instead}", DeprecationWarning, stacklevel=3)


class renamed_method:
    """An old name of a method (e.g. ``MixtureSampler.draw`` → ``next_batch``), kept for one release: calling it
    warns, naming the new one, and calls the new name (so a subclass that overrides the new name is reached)."""

    def __init__(self, new: str, since: str = "1.1") -> None:
        self.new, self.since, self.old = new, since, ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.old = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        method = getattr(obj, self.new)

        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            _deprecated(f"{type(obj).__name__}.{self.old}()", f".{self.new}()", self.since)
            return method(*args, **kwargs)

        return call


def keyword_only(*names: str, renamed: dict[str, str] | None = None, since: str = "1.1"):
    """A method whose options became keyword-only (and some renamed), the old calls kept for one release.

    The decorated method is ``method(self, first, *, option, ...)``: a call that still passes ``names`` by
    position after ``first`` (or an old keyword of ``renamed``, old → new) warns once per call, naming the new
    form, and is passed on as keywords. `inspect.signature` shows the new signature."""
    renamed = dict(renamed or {})

    def wrap(method):
        @functools.wraps(method)
        def call(self, *args: Any, **kwargs: Any) -> Any:
            old = [name for name in renamed if name in kwargs]
            if len(args) > 1 + len(names) or (not args and not old):
                return method(self, *args, **kwargs)  # the method's own TypeError
            if len(args) > 1 or old:
                for name in old:
                    if renamed[name] in kwargs:
                        raise TypeError(f"{method.__qualname__}() got both {name}= and {renamed[name]}=")
                    kwargs[renamed[name]] = kwargs.pop(name)
                for name, value in zip(names, args[1:]):
                    if name in kwargs:
                        raise TypeError(f"{method.__qualname__}() got {name} twice")
                    kwargs[name] = value
                first = list(inspect.signature(method).parameters)[1]
                new = ", ".join([first] + [f"{n}=..." for n in names])
                _deprecated(f"{type(self).__name__}.{method.__name__}() with positional or renamed options",
                            f".{method.__name__}({new})", since)
                args = args[:1]
            return method(self, *args, **kwargs)

        return call

    return wrap


def renamed_keywords(since: str = "1.1", **old_to_new: str):
    """A function or method whose keyword options were renamed (``beta=`` → ``selectivity=``), the old names kept
    for one release: passing one warns, naming the new one, and is passed on under the new name."""

    def wrap(function):
        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            for old, new in old_to_new.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{function.__qualname__}() got both {old}= and {new}=")
                    _deprecated(f"{function.__qualname__.replace('.__init__', '')}({old}=...)", f"{new}=...", since)
                    kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        return call

    return wrap

"""The optional fast-path hook of strategy parts: a part may hand the buffer its rule as one compiled step.

A buffer step costs a few microseconds, so every separate compiled call (and the Python between calls) shows.
A built-in part therefore offers, beside its Python method, a small cached kernel that runs the buffer's generic
bookkeeping (`kernels.buffer`) and the part's rule in one call; the buffer asks for it through the part's hook
(`WeightUpdate.fused_step`, `Eviction.fused_place`) and calls the method when the hook returns None. The kernels
call the rule's own `@njit` function, so each rule is still written once. Likewise a hook that does nothing
unless a class overrides it (`Initializer.observe`, `WeightUpdate.on_add`, `Eviction.commit`) comes with a flag,
derived for every subclass by `overrides`, so callers skip the no-op call.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: What a hook returns: the compiled step and the part's own trailing arguments (asked on every call, so they may
#: be arrays that `load_state_dict` replaced).
FusedStep = tuple[Callable[..., Any], tuple]


def no_fused_step(part: Any) -> FusedStep | None:
    """The hook of a part that has no compiled step: the buffer calls its Python method."""
    return None


def drop_inherited_step(cls: type, rule: str, hook: str) -> None:
    """A subclass that brings its own `rule` method must run it: an inherited step would apply the parent's
    rule instead, so the hook is reset unless the subclass defines it too. Called from `__init_subclass__`."""
    if rule in cls.__dict__ and hook not in cls.__dict__:
        setattr(cls, hook, no_fused_step)


def overrides(cls: type, base: type, hook: str) -> bool:
    """Whether `cls` replaces `base`'s do-nothing `hook`: the value of the hook's flag, set in `__init_subclass__`."""
    return getattr(cls, hook) is not getattr(base, hook)

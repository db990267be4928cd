"""Command-line options declared once, as dataclass fields (`option`), and the parser every command uses
(`OptionParser`, on `transformers.HfArgumentParser`): flags generated from the fields, typed values checked while
parsing, only the flags the user typed in the namespace (so ``--resume`` can tell them apart from defaults)."""
from __future__ import annotations

import argparse
import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, make_dataclass
from typing import NoReturn, get_args, get_origin, get_type_hints

import torch
from transformers import HfArgumentParser

from .errors import UserError


NONE_WORDS = ("none", "default")  # `--eviction none`: an optional option back to None (its default meaning)


def option(default=MISSING, help: str = "", group: str | None = None, *, aliases: Sequence[str] = (),
           choices: Sequence | None = None, default_factory=MISSING, convert: Callable[[str], object] | None = None):
    """A dataclass field that is also a command-line flag: `OptionParser` makes ``--name-with-dashes`` from it
    (plus ``aliases``; ``--name_with_underscores`` still parses, unlisted), typed from the annotation; ``group``
    titles its section of ``--help``.

    ``convert`` replaces the annotation's type for the typed text: it returns the value or raises `UserError`
    saying what is wrong with it, and the parser turns that into its usual one-line usage error naming the flag
    (exit status 2). A value that is checked there is refused before a command starts any work."""
    metadata: dict = {"help": help}
    if group:
        metadata["group"] = group
    if convert is not None:
        metadata["convert"] = convert
    if aliases:
        metadata["aliases"] = list(aliases)
    if choices is not None:
        metadata["choices"] = list(choices)
    return field(default=default, default_factory=default_factory, metadata=metadata)


@dataclass(frozen=True)
class OptionSet:
    """The option fields of ``cls`` as flags for one command: ``skip`` left out, each name under ``prefix``
    (``finetune_`` turns ``--lr`` into ``--finetune-lr``), ``defaults`` replacing some defaults. One declaration
    then serves a second command that needs other defaults (``compare``'s small fine-tune)."""

    cls: type
    prefix: str = ""
    defaults: Mapping = field(default_factory=dict)
    skip: tuple[str, ...] = ()

    def parsed(self, namespace: argparse.Namespace, **fixed):
        """An instance of ``cls`` from a parsed namespace: the typed flags, then ``fixed``, then this set's
        defaults, then the dataclass's."""
        defaults = {name: copy.copy(value) for name, value in self.defaults.items()}
        return self.cls(**{**defaults, **typed_options(namespace, self.cls, self.prefix), **fixed})

    def converters(self) -> dict[str, Callable[[str], object]]:
        """The ``convert`` functions of this set's flags, by namespace name (``--PREFIXname``)."""
        return {self.prefix + f.name: f.metadata["convert"] for f in fields(self.cls)
                if "convert" in f.metadata and f.name not in self.skip}

    def sections(self) -> list[type]:
        """One dataclass per help group, the form `HfArgumentParser` takes sections in (``_argument_group_name``);
        keyword-only, so required and defaulted fields mix freely."""
        hints = get_type_hints(self.cls)
        dashed = self.prefix.replace("_", "-")
        sections: dict[str | None, list] = {}
        for f in fields(self.cls):
            if f.name in self.skip or not f.init or "help" not in f.metadata:
                continue
            metadata = {k: v for k, v in f.metadata.items() if k not in ("group", "convert")}  # add_argument's
            metadata["aliases"] = ["--" + dashed + alias[2:] for alias in metadata.get("aliases", ())]
            if get_origin(hints[f.name]) is list:  # a repeated flag adds to the list: --checkpoint A --checkpoint B
                metadata["action"] = "extend"
            if f.name in self.defaults:
                value = self.defaults[f.name]
                spec = field(default_factory=lambda v=value: copy.copy(v), metadata=metadata)
            else:
                spec = field(default=f.default, default_factory=f.default_factory, metadata=metadata)
            sections.setdefault(f.metadata.get("group"), []).append((self.prefix + f.name, hints[f.name], spec))
        return [make_dataclass(f"{self.cls.__name__}Flags{i}", specs, kw_only=True,
                               namespace={"_argument_group_name": title} if title else {})
                for i, (title, specs) in enumerate(sections.items())]


class OptionParser(HfArgumentParser):
    """`transformers.HfArgumentParser` over option dataclasses, with three additions every command needs.

    - A bool option is settable both ways: ``--compile`` / ``--compile false`` / ``--no-compile`` (and
      ``--no_compile``), whatever its default, so a resumed run can undo a saved ``--compile``.
    - An optional option (``X | None``) takes ``none`` or ``default`` for None: ``--eviction none`` undoes a
      saved ``--eviction fifo``.
    - Defaults stay out of the parsed namespace (``--help`` shows them): after parsing it holds exactly the
      options the user typed, so a typed value equal to the default still counts (see `typed_options`).

    - Flags are spelled with dashes (``--batch-size``, ``--no-progress``) in ``--help``, the usage line and error
      messages, as the READMEs write them. The underscore spellings `HfArgumentParser` also makes
      (``--batch_size``, ``--no_progress``) keep working for existing scripts, unlisted (see
      `_hide_underscore_spellings`).
    - A field's ``convert`` (see `option`) checks its typed value while parsing: a bad value is a usage error
      before the command starts.

    A usage error is one line. ``dataclass_types`` are option dataclasses or `OptionSet` objects; every field with
    help text becomes a flag (plus its ``aliases``).
    """

    def __init__(self, dataclass_types: Sequence[type | OptionSet] = (), **kwargs) -> None:
        option_sets = [spec if isinstance(spec, OptionSet) else OptionSet(spec) for spec in dataclass_types]
        sections = [section for option_set in option_sets for section in option_set.sections()]
        super().__init__(sections, **kwargs)
        declared = {f.name: (f, get_type_hints(section)[f.name]) for section in sections for f in fields(section)}
        converters = {name: convert for option_set in option_sets for name, convert in option_set.converters().items()}
        for action in list(self._actions):
            if action.dest not in declared or action.option_strings[0].startswith("--no_"):
                continue
            spec, hint = declared[action.dest]
            default = spec.default_factory() if spec.default_factory is not MISSING else spec.default
            if action.dest in converters:
                action.type = _usage_error_on_user_error(converters[action.dest])
            if hint is bool and default is False:  # HfArgumentParser adds --no-X only for a True default
                group = next(g for g in self._action_groups if action in g._group_actions)
                group.add_argument(f"--no_{spec.name}", f"--no-{spec.name.replace('_', '-')}", action="store_false",
                                   dest=spec.name, help=f"undo --{spec.name.replace('_', '-')}")
            elif type(None) in get_args(hint) and action.type is not None:
                action.type = _none_or(action.type)
                if action.choices is not None:
                    action.choices = [*action.choices, None]
            if default not in (MISSING, None) and action.help and "(default" not in action.help:
                shown = " ".join(map(str, default)) if isinstance(default, list) else default
                action.help += f" (default: {shown})"
        for action in self._actions:  # the namespace holds the typed options only
            if action.dest in declared:
                action.default = argparse.SUPPRESS
        self._hide_underscore_spellings()

    def _hide_underscore_spellings(self) -> None:
        """List each flag by its dashed spellings only, keeping ``--name_with_underscores`` as a hidden alias.

        `HfArgumentParser` gives every ``name_with_underscores`` field both ``--name_with_underscores`` and
        ``--name-with-dashes``, and lists both (underscores first) in ``--help``, the usage line and error messages,
        while the READMEs and most command lines use dashes. argparse shows an action's ``option_strings`` but
        looks typed flags up in ``_option_string_actions``: dropping an underscore spelling from the first and
        keeping it in the second hides it everywhere and leaves it parsing to the same action (same type, same
        destination), so existing scripts keep running. Rule: a long flag with ``_`` in it is hidden whenever the
        same action has a spelling without one."""
        for action in self._actions:
            shown = [s for s in action.option_strings if not (s.startswith("--") and "_" in s)]
            if shown and len(shown) < len(action.option_strings):
                action.option_strings = shown  # the underscore spellings stay in self._option_string_actions

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def add_command(subparsers: argparse._SubParsersAction, name: str,
                dataclass_types: Sequence[type | OptionSet] = (), **kwargs) -> OptionParser:
    """``subparsers.add_parser(name, ...)`` as an `OptionParser` over ``dataclass_types``, whatever parser class
    the parent command line uses (so a plain argparse program can take our commands)."""
    chosen = subparsers._parser_class
    subparsers._parser_class = OptionParser
    try:
        return subparsers.add_parser(name, dataclass_types=dataclass_types, **kwargs)
    finally:
        subparsers._parser_class = chosen


def _usage_error_on_user_error(convert):
    """``convert`` for argparse's ``type``: its `UserError` becomes argparse's one-line
    ``argument --flag: <message>`` usage error (exit status 2), the way a mistyped number is reported."""
    def parse(text: str):
        try:
            return convert(text)
        except UserError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    parse.__name__ = getattr(convert, "__name__", "value")
    return parse


def _none_or(convert):
    """``convert``, except that `NONE_WORDS` give None (an optional option back to its default meaning)."""
    def parse(text: str):
        return None if text.lower() in NONE_WORDS else convert(text)

    parse.__name__ = getattr(convert, "__name__", "value")  # argparse names the type in "invalid int value"
    return parse


def typed_options(namespace: argparse.Namespace, cls: type, prefix: str = "") -> dict:
    """The fields of ``cls`` the user typed (as ``--PREFIXname``); an `OptionParser` namespace holds no others."""
    return {f.name: getattr(namespace, prefix + f.name) for f in fields(cls) if hasattr(namespace, prefix + f.name)}


def options_from(namespace: argparse.Namespace, cls: type, **fixed):
    """An instance of ``cls``: the typed options, ``fixed`` on top, the dataclass defaults for the rest."""
    return OptionSet(cls).parsed(namespace, **fixed)


@dataclass
class ProcessOptions:
    """Process-wide settings every command takes (declared once; applied by `apply_process_options`)."""

    threads: int | None = option(1, "torch CPU threads; none: torch's choice, one per core. 1 keeps a step "
                                    "fast when other jobs share a small machine (results/threads/threads.md)", "process")


def apply_process_options(options: ProcessOptions) -> None:
    """Validate and apply `ProcessOptions` (a bad value is a `UserError` naming the flag)."""
    if options.threads is not None:
        if options.threads < 1:
            raise UserError(f"--threads must be >= 1 (or none), got {options.threads}")
        torch.set_num_threads(options.threads)

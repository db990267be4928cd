"""Helpers that pretraining and fine-tuning share: the user-error type, device choice, seeding, options.

Written once here so that both halves of the integration agree (one exit path for user mistakes, one meaning
of ``--device auto``). Both use `transformers.get_linear_schedule_with_warmup` for the learning rate.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import os
import random
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, make_dataclass
from typing import NoReturn, get_args, get_origin, get_type_hints

import numpy as np
import torch
from transformers import HfArgumentParser


SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


class UserError(Exception):
    """A mistake in arguments, paths or data that the user must fix; the CLI prints it as one ``error:`` line
    (exit status 2) without a traceback. Anything else is a bug and keeps its traceback."""


def report_user_error(error: UserError) -> int:
    """The one way a user error leaves the command line: ``error: ...`` on stderr, exit status 2.

    ``ELECTRA_TMR_DEBUG=1`` re-raises instead, to show the traceback.
    """
    if os.environ.get("ELECTRA_TMR_DEBUG"):
        raise error
    print(f"error: {error}", file=sys.stderr)
    return 2


def pick_device(name: str | None = "auto") -> torch.device:
    """"auto" (or None) picks CUDA, then MPS, then CPU; an unavailable explicit device is a `UserError`."""
    if name in (None, "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown --device {name!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name!r} requested but CUDA is not available")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError("--device 'mps' requested but MPS is not available")
    return device


def set_seed(seed: int) -> None:
    """Seed Python, NumPy's global generator and torch (every device) in one place."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# ----------------------------------------------------------------------------- options declared once
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
                                    "fast when other jobs share a small machine (results/threads.md)", "process")


def apply_process_options(options: ProcessOptions) -> None:
    """Validate and apply `ProcessOptions` (a bad value is a `UserError` naming the flag)."""
    if options.threads is not None:
        if options.threads < 1:
            raise UserError(f"--threads must be >= 1 (or none), got {options.threads}")
        torch.set_num_threads(options.threads)


# ----------------------------------------------------------------------------- numbers shared by reports
def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None for a single value); the one place tables get their spread."""
    values = np.asarray(values, dtype=np.float64)
    if values.size < 2:
        return float(values.mean()), None
    return float(values.mean()), float(values.std(ddof=1))


def format_mean_std(values: Sequence[float], digits: int = 3, scale: float = 1.0) -> str:
    """A table cell: "mean ± sample std" of the finite values times ``scale`` (just the mean for one value, "–"
    for none)."""
    finite = [scale * v for v in values if v is not None and np.isfinite(v)]
    if not finite:
        return "–"
    mean, std = mean_std(finite)
    return f"{mean:.{digits}f}" if std is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


# ----------------------------------------------------------------------------- mixed precision
AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Autocast:
    """Autocast for one run, as a callable giving a fresh context each time (pretraining and fine-tuning).

    ``amp`` ("none", "bf16" or "fp16") applies on CUDA only; CPU runs float32. A disabled
    ``torch.autocast(enabled=False)`` is a no-op, so callers take no branch.
    """

    device_type: str
    dtype: torch.dtype | None  # None: off; fp16 also needs loss scaling (see `pretrain.loop`)

    @classmethod
    def choose(cls, device: torch.device, amp: str) -> Autocast:
        return cls(device.type, AMP_DTYPES[amp] if device.type == "cuda" else None)

    def __call__(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.device_type, dtype=self.dtype or torch.bfloat16, enabled=self.dtype is not None)


def spearman(x, y) -> float:
    """Spearman rank correlation (ties share their average rank); 0 when undefined (a constant side), so that
    averages over runs stay finite (the GLUE convention for STS-B)."""
    from scipy import stats

    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.size < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return 0.0
    return float(stats.spearmanr(x, y).statistic)


# ----------------------------------------------------------------------------- progress bars
REDIRECTED_BAR_SECONDS = 30.0  # at most one redraw this often when the bar's stream is not a terminal


def progress_bar(*, enabled: bool = True, file=None, **kwargs):
    """A tqdm bar (``kwargs`` are tqdm's): the one place the integration's bars are made, and the one rule for
    output that is not a terminal.

    On a terminal a redraw overwrites the line, so tqdm redraws up to ten times a second. Redirected to a file (a
    job's log, a queue, CI) every redraw is kept: the default job wrote a 224 KB log of them. There a bar first
    appears after `REDIRECTED_BAR_SECONDS` (work shorter than that leaves no trace), then redraws at most that
    often (``maxinterval`` too, else tqdm's monitor thread forces a redraw every 10 s) and once at the end: a
    log still shows, in a few lines, that a long run is alive and how far it got. ``enabled=False``
    (``--no-progress``) writes nothing.
    """
    from tqdm.auto import tqdm

    stream = sys.stderr if file is None else file
    if enabled and not _is_terminal(stream):
        kwargs.update(delay=REDIRECTED_BAR_SECONDS, mininterval=REDIRECTED_BAR_SECONDS,
                      maxinterval=REDIRECTED_BAR_SECONDS, dynamic_ncols=False)
    return tqdm(file=file, disable=not enabled, **kwargs)


def _is_terminal(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (ValueError, OSError):  # a closed or detached stream
        return False


# ----------------------------------------------------------------------------- tokenizers
def train_wordpiece(texts, vocab_size: int, lowercase: bool = True):
    """Train an uncased BERT-style WordPiece fast tokenizer (ELECTRA's kind) on strings or batches of strings."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                        show_progress=False)
    tok.train_from_iterator(texts, trainer)
    # The trainer breaks count ties in hash-map order, so ids differ from process to process; renumber the token
    # set canonically (specials first, then sorted). The set itself can still differ at the vocabulary cut-off.
    learned = tok.get_vocab()
    ordered = list(SPECIAL_TOKENS) + sorted(t for t in learned if t not in SPECIAL_TOKENS)
    tok.model = models.WordPiece({token: i for i, token in enumerate(ordered)}, unk_token="[UNK]")
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]", model_max_length=512)


@contextlib.contextmanager
def quiet_transformers():
    """Silence expected transformers chatter (the 'unused weights' report when the discriminator head is dropped,
    'sequence longer than model_max_length' before our own windowing) and its progress bars; restore both after."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def load_tokenizer(location: str, need_mask: bool = False):
    """A saved fast tokenizer (a directory, or a hub id when online) with [PAD]/[CLS]/[SEP] (and [MASK] when
    ``need_mask``, as pretraining does); anything else is a `UserError`."""
    from transformers import AutoTokenizer

    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(location)
    except Exception as error:
        first_line = (str(error).splitlines() or [""])[0]
        raise UserError(f"could not load a tokenizer from {location}: {type(error).__name__}: {first_line}") from None
    needed = ("pad_token_id", "cls_token_id", "sep_token_id") + (("mask_token_id",) if need_mask else ())
    missing = [name[:-3] for name in needed if getattr(tokenizer, name, None) is None]
    if missing or not tokenizer.is_fast:
        raise UserError(f"the tokenizer of {location} must be a fast BERT/ELECTRA-style tokenizer "
                        f"(missing: {', '.join(missing) or 'fast backend'})")
    return tokenizer

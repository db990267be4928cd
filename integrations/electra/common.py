"""Helpers that pretraining and fine-tuning share: the user-error type, device choice, seeding, options.

Written once here so that both halves of the integration agree (one exit path for user mistakes, one meaning
of ``--device auto``). Both use `transformers.get_linear_schedule_with_warmup` for the learning rate.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
from dataclasses import MISSING, field, fields

import numpy as np
import torch


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
def option(default, help: str, group: str, flag: str | None = None):
    """A dataclass field that also describes its command-line flag (see `add_dataclass_arguments`)."""
    return field(default=default, metadata={"help": help, "group": group, "flag": flag})


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()) -> None:
    """One flag per `option` field of ``cls``: ``--field-name`` (or its ``flag``), typed from the annotation.

    Defaults are not put in the namespace (``argparse.SUPPRESS``): after parsing it holds exactly the flags the
    user typed, so a typed value equal to the default is still known to be typed (see `typed_options`).
    A bool field that defaults to True becomes ``--no-NAME``.
    """
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in fields(cls):
        if f.name in skip or "help" not in f.metadata:
            continue
        meta = f.metadata
        if meta["group"] not in groups:
            groups[meta["group"]] = parser.add_argument_group(meta["group"])
        group = groups[meta["group"]]
        default = None if f.default is MISSING else f.default
        kind = str(f.type).split("|")[0].strip()
        if kind == "bool":
            flag = meta["flag"] or ("--no-" if default else "--") + f.name.replace("_", "-")
            group.add_argument(flag, dest=f.name, action="store_false" if default else "store_true",
                               default=argparse.SUPPRESS, help=meta["help"])
            continue
        suffix = f" (default {default})" if default is not None and "default" not in meta["help"] else ""
        group.add_argument(meta["flag"] or "--" + f.name.replace("_", "-"), dest=f.name,
                           type={"int": int, "float": float}.get(kind, str), default=argparse.SUPPRESS,
                           metavar=f.name.upper(), help=meta["help"] + suffix)


def typed_options(namespace: argparse.Namespace, cls: type) -> dict:
    """The dataclass fields the user typed on the command line (those `add_dataclass_arguments` put there)."""
    return {f.name: getattr(namespace, f.name) for f in fields(cls) if hasattr(namespace, f.name)}


def spearman(x, y) -> float:
    """Spearman rank correlation (ties share their average rank); 0 when undefined (a constant side), so that
    averages over runs stay finite (the GLUE convention for STS-B)."""
    from scipy import stats

    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.size < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return 0.0
    return float(stats.spearmanr(x, y).statistic)


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

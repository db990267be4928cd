"""Loading the pretrained encoder and tokenizer to fine-tune, from a directory or a hub name."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from ..common import UserError


@dataclass(frozen=True)
class CheckpointSpec:
    """A checkpoint as named in result tables (``name``) and where it is loaded from (``location``)."""

    name: str
    location: str


def parse_checkpoint_arg(value: str) -> CheckpointSpec:
    """``NAME=DIR`` or just ``DIR`` (the name is then the directory's base name)."""
    if "=" in value:
        name, location = value.split("=", 1)
        if not name or not location:
            raise UserError(f"bad --checkpoint {value!r}: expected NAME=DIR or DIR")
    else:
        location = value
        name = Path(value.rstrip("/\\")).name or value
    return CheckpointSpec(name=name, location=location)


def unique_checkpoint_specs(specs: list[CheckpointSpec]) -> dict[str, str]:
    """Name -> location, refusing duplicate names (they would merge rows of the results table)."""
    result: dict[str, str] = {}
    for spec in specs:
        if spec.name in result:
            raise UserError(f"two checkpoints are named {spec.name!r}; name them with NAME=DIR")
        result[spec.name] = spec.location
    return result


def _looks_like_hub_id(location: str) -> bool:
    parts = location.split("/")
    return 1 <= len(parts) <= 2 and all(parts) and not location.startswith((".", "~")) and not os.path.isabs(location)


def check_checkpoint_location(location: str) -> None:
    """Reject a path that does not exist unless it could be a hub model id (``owner/name``)."""
    if os.path.isdir(location):
        if not os.path.isfile(os.path.join(location, "config.json")):
            raise UserError(f"checkpoint directory {location} has no config.json (save it with save_pretrained)")
        return
    if not _looks_like_hub_id(location):
        raise UserError(f"checkpoint directory not found: {location}")


@contextlib.contextmanager
def quiet_transformers():
    """Silence expected transformers chatter (the 'unused weights' report when the discriminator
    head is dropped, 'sequence longer than model_max_length' before our own windowing/truncation)
    and the per-load progress bar; restore both afterwards."""
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


def load_tokenizer(location: str):
    """The checkpoint's fast tokenizer; it must have [CLS]/[SEP]-style special tokens."""
    from transformers import AutoTokenizer

    check_checkpoint_location(location)
    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(location)
    except Exception as error:
        raise UserError(f"could not load a tokenizer from {location}: {type(error).__name__}: {error}") from error
    if tokenizer.cls_token_id is None or tokenizer.sep_token_id is None or tokenizer.pad_token_id is None:
        raise UserError(
            f"tokenizer of {location} lacks a CLS, SEP or PAD token; BERT/ELECTRA-style tokenizers are required"
        )
    return tokenizer


def load_encoder(location: str):
    """The pretrained transformer body (``AutoModel``), e.g. the ELECTRA discriminator without its head."""
    from transformers import AutoModel

    check_checkpoint_location(location)
    try:
        with quiet_transformers():
            return AutoModel.from_pretrained(location)
    except Exception as error:
        raise UserError(f"could not load a model from {location}: {type(error).__name__}: {error}") from error

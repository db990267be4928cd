"""Where fine-tuning inputs come from: data (a local directory in the official layout, or a hub dataset) and
the pretrained checkpoint (encoder + tokenizer, from a directory or a hub name).

One rule for GLUE and SQuAD data: ``None`` or ``"hub"`` means the default hub dataset, ``"hf:NAME"`` a
named hub dataset, anything else a local directory that must exist.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..output import quiet_transformers
from ..tokenizer import load_tokenizer
from .tasks import GLUE_TASKS


# --------------------------------------------------------------------------------------------------
# Where data comes from: a local directory (official file layout) or a Hugging Face hub dataset.
@dataclass(frozen=True)
class DataSource:
    """Either ``local_dir`` (official layout) or ``hub_name`` is set, never both."""

    local_dir: Path | None = None
    hub_name: str | None = None

    def describe(self) -> str:
        return str(self.local_dir) if self.local_dir is not None else f"hub:{self.hub_name}"


def hub_name_of(value: str | None, default_hub_name: str) -> str | None:
    """The hub dataset a ``--glue-dir``/``--squad-dir`` value names (None, ``hub``, ``hf:NAME``), else None (a
    local directory)."""
    if value is None or value == "hub":
        return default_hub_name
    return value[3:] if value.startswith("hf:") else None


def resolve_data_source(value: str | None, default_hub_name: str, what: str) -> DataSource:
    """Turn a user's ``--glue-dir``/``--squad-dir`` value into a DataSource (or a clear error)."""
    hub_name = hub_name_of(value, default_hub_name)
    if hub_name is not None:
        return DataSource(hub_name=hub_name)
    path = Path(value).expanduser()
    if not path.is_dir():
        raise UserError(
            f"{what} directory not found: {path} (pass an existing directory in the official layout, "
            f"or 'hub' / 'hf:NAME' to load from the Hugging Face hub when online)"
        )
    return DataSource(local_dir=path)


GLUE_DIR_EXPECTED = ("expected the official glue_data layout (a directory holding task folders such as SST-2/, "
                     "CoLA/, MRPC/ with train.tsv and dev.tsv) or 'hub' to download nyu-mll/glue when online")


def check_glue_dir(value: str) -> str:
    """A typed ``--glue-dir`` value, checked while the arguments are parsed (its ``convert``), so that a mistyped
    path stops the command at once instead of after pretraining (``compare`` fine-tunes last).

    Accepted: ``hub`` / ``hf:NAME`` (downloaded when used), or a directory holding at least one GLUE task folder
    (`GlueTask.local_dir`: SST-2/, CoLA/, ...). A missing task file is reported when that task is loaded. Anything
    else is a `UserError` naming the value and what a valid one is."""
    if hub_name_of(value, "") is not None:
        return value
    path = Path(value).expanduser()
    folders = [task.local_dir for task in GLUE_TASKS.values()]
    if not path.exists():
        problem = "does not exist"
    elif not path.is_dir():
        problem = "is not a directory"
    elif not any((path / folder).is_dir() for folder in folders):
        problem = f"holds none of the GLUE task folders ({', '.join(folders)})"
        if (path / "train.tsv").is_file():
            problem += "; it looks like one task's folder: pass the directory above it"
    else:
        return value
    raise UserError(f"{value!r} {problem}; {GLUE_DIR_EXPECTED}")


def load_hub_split(hub_name: str, config: str | None, split: str):
    """Load one split of a hub dataset, turning download failures into a UserError."""
    import datasets

    try:
        return datasets.load_dataset(hub_name, config, split=split)
    except Exception as error:  # network, missing config, etc.: all are user-fixable
        where = f"{hub_name}/{config}" if config else hub_name
        raise UserError(
            f"could not load split {split!r} of hub dataset {where} ({type(error).__name__}: {error}); "
            f"offline, pass a local directory with the official files instead"
        ) from error


# --------------------------------------------------------------------------------------------------
# Loading the pretrained encoder and tokenizer to fine-tune, from a directory or a hub name.
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


def load_checkpoint_tokenizer(location: str):
    """The checkpoint's fast tokenizer ([CLS]/[SEP]/[PAD] required); a missing path is a clear error."""
    check_checkpoint_location(location)
    return load_tokenizer(location)


def load_encoder(location: str):
    """The pretrained transformer body (``AutoModel``), e.g. the ELECTRA discriminator without its head."""
    from transformers import AutoModel

    check_checkpoint_location(location)
    try:
        with quiet_transformers():
            return AutoModel.from_pretrained(location)
    except Exception as error:
        raise UserError(f"could not load a model from {location}: {type(error).__name__}: {error}") from error

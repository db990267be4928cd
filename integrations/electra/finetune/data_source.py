"""Where data comes from: a local directory (official file layout) or a Hugging Face hub dataset.

One rule for GLUE and SQuAD: ``None`` or ``"hub"`` means the default hub dataset, ``"hf:NAME"`` a
named hub dataset, anything else a local directory that must exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..common import UserError


@dataclass(frozen=True)
class DataSource:
    """Either ``local_dir`` (official layout) or ``hub_name`` is set, never both."""

    local_dir: Path | None = None
    hub_name: str | None = None

    def describe(self) -> str:
        return str(self.local_dir) if self.local_dir is not None else f"hub:{self.hub_name}"


def resolve_data_source(value: str | None, default_hub_name: str, what: str) -> DataSource:
    """Turn a user's ``--glue-dir``/``--squad-dir`` value into a DataSource (or a clear error)."""
    if value is None or value == "hub":
        return DataSource(hub_name=default_hub_name)
    if value.startswith("hf:"):
        return DataSource(hub_name=value[3:])
    path = Path(value).expanduser()
    if not path.is_dir():
        raise UserError(
            f"{what} directory not found: {path} (pass an existing directory in the official layout, "
            f"or 'hub' / 'hf:NAME' to load from the Hugging Face hub when online)"
        )
    return DataSource(local_dir=path)


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

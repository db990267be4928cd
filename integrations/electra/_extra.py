"""The electra extra, checked before anything imports it: a command run without it says in one line which extra to
install and exits with status 2 (the command line's status for a bad setup), instead of a ModuleNotFoundError
traceback. ``pip install replayloader`` (numpy + numba) installs the ``replayloader-tmr`` command too."""
from __future__ import annotations

import importlib.util
import sys

# What the electra extra installs and the command imports (pyproject.toml, [project.optional-dependencies]).
NEEDS = ("torch", "transformers", "tokenizers", "datasets", "safetensors")
INSTALL = "pip install 'replayloader[electra]'"


def missing_module() -> str | None:
    """The first module of the electra extra that cannot be imported, or None."""
    for name in NEEDS:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a module set to None in sys.modules, or a broken parent
            found = False
        if not found:
            return name
    return None


def require_extra(command: str = "replayloader-tmr") -> None:
    """Exit with status 2 and one line on stderr if the electra extra is not installed."""
    name = missing_module()
    if name is not None:
        print(f"error: {command} needs the electra extra, which is not installed (no module named {name!r}): "
              f"{INSTALL}", file=sys.stderr)
        raise SystemExit(2)

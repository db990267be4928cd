"""What the command line calls itself in usage lines and errors: the command as the user typed it.

Its own module because both command lines need it, the main one (``cli.py``) and ``finetune``'s own
(``finetune/cli.py``, run alone as ``python -m replayloader_electra.finetune.cli``), and the main one imports
``finetune``'s: here, neither imports the other for it.
"""
from __future__ import annotations

import os
import sys

COMMAND = "replayloader-tmr"  # the console script (pyproject.toml's [project.scripts])


def invoked_as(argv0: str | None = None, main_module: str | None = None) -> str:
    """The program name for usage lines and errors: the command the user typed, so it can be typed again.

    ``argv0`` is ``sys.argv[0]``; ``main_module`` the name ``__main__`` was imported under (``__main__.__spec__``:
    set by ``python -m``, None for a script or a console command). Both default to this process's.

    - ``python -m replayloader_electra``: that, from ``main_module`` (argparse would say ``__main__.py``);
    - a script (``python examples/electra_tmr.py``, also under torchrun): ``python`` and the path as typed;
    - the console command: its name (``replayloader-tmr``; ``.exe`` dropped); `COMMAND` when there is no name.
    """
    if argv0 is None:
        argv0 = sys.argv[0] if sys.argv else ""
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        main_module = getattr(spec, "name", None)
    if main_module:
        return "python -m " + main_module.removesuffix(".__main__")
    if argv0.endswith(".py"):
        return "python " + argv0
    name = os.path.basename(argv0).removesuffix(".exe")
    return name if name and name != "-c" else COMMAND

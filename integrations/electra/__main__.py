"""``python -m replayloader_electra``: the command line of ``replayloader-tmr`` and examples/electra_tmr.py."""
import sys

from .cli import main

sys.exit(main())

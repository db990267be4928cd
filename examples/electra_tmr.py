"""ELECTRA vs TMR pretraining (and a small GLUE fine-tune) in one command.

    python examples/electra_tmr.py            # tiny models, embedded corpus, a few minutes on a 2-core CPU
    python examples/electra_tmr.py --help     # subcommands: compare (default), pretrain, heldout, export, finetune

The same command line is installed as ``replayloader-tmr`` (and ``python -m replayloader_electra``); this script
needs the package installed (``pip install torch==2.13.0 -e ".[electra]"``). See integrations/electra/README.md.
"""
import sys

from replayloader_electra.cli import main

if __name__ == "__main__":
    sys.exit(main())

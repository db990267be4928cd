"""ELECTRA vs TMR pretraining (and a small GLUE fine-tune) in one command.

    python examples/electra_tmr.py            # tiny models, embedded corpus, a few minutes on a 2-core CPU
    python examples/electra_tmr.py --help     # subcommands: compare (default), pretrain, finetune

See integrations/electra/README.md.
"""
import os
import sys
from pathlib import Path

# torch already uses the cores; a second, multi-threaded BLAS pool (numpy's OpenBLAS, used by the LSR/LinUCB
# strategies) oversubscribes them and slows those strategies many times over. Set before numpy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from integrations.electra.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

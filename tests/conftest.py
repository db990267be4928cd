"""The integration is imported as ``replayloader_electra`` (the name the wheel installs) from *this* checkout's
integrations/electra/, just as ``replayloader`` comes from this checkout's folder (pytest puts the checkout first
on sys.path). An editable install elsewhere (another worktree) maps that name through its own import hook,
which would otherwise win here and test that checkout's code instead."""
import importlib.util
import os
import sys
from pathlib import Path

import pytest

# Local copies of GLUE and SQuAD, where this workspace has them beside the checkout: the integration finds them
# through $REPLAYLOADER_DATA (its one data setting), so every test, and every process a test starts, uses them.
_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
if _DATA.is_dir():
    os.environ.setdefault("REPLAYLOADER_DATA", str(_DATA))

NAME, FOLDER = "replayloader_electra", Path(__file__).resolve().parents[1] / "integrations" / "electra"

if NAME not in sys.modules:
    spec = importlib.util.spec_from_file_location(NAME, FOLDER / "__init__.py", submodule_search_locations=[str(FOLDER)])
    sys.modules[NAME] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules[NAME])


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models run much faster on one thread, above all on a busy 2-core machine (the ELECTRA tests ask for
    it; the SB3 tests use it for every test)."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

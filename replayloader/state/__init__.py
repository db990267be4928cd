"""State: what every checkpoint of the library goes through.

- `save_state` / `load_state`: one ``.npz`` file (arrays and JSON), written atomically, verified on load.
- `InvalidState`: the one error every ``load_state_dict`` raises for a state it refuses (nothing is changed);
  `StateFileError` (a `ValueError`, not an `InvalidState`): a file that cannot be read as a state.
- Atomic files and digests, for whatever a run writes beside its checkpoints: `atomic_write_bytes`,
  `atomic_write_text`, `atomic_directory` (a directory that appears whole or not at all; `is_temporary` names its
  work-in-progress copies), `sha256_bytes`, `sha256_file`.
- ``state.checks``: the field checks those loads share (plumbing, not exported).
"""
from .atomic import atomic_directory, atomic_write_bytes, atomic_write_text, is_temporary, sha256_bytes, sha256_file
from .checks import InvalidState
from .files import StateFileError, flatten_state, load_state, save_state, unflatten_state

__all__ = ["InvalidState", "StateFileError", "save_state", "load_state", "flatten_state", "unflatten_state",
           "atomic_write_bytes", "atomic_write_text", "atomic_directory", "is_temporary", "sha256_bytes",
           "sha256_file"]

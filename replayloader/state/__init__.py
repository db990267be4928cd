"""State: what every checkpoint of the library goes through.

- `save_state` / `load_state`: one ``.npz`` file (arrays and JSON), written atomically, verified on load.
- `InvalidState`: the one error every ``load_state_dict`` raises for a state it refuses (nothing is changed);
  `StateFileError` (a `ValueError`, not an `InvalidState`): a file that cannot be read as a state.
- ``state.checks``: the field checks those loads share; ``state.atomic``: atomic writes and digests.
"""
from .checks import InvalidState
from .files import StateFileError, flatten_state, load_state, save_state, unflatten_state

__all__ = ["InvalidState", "StateFileError", "save_state", "load_state", "flatten_state", "unflatten_state"]

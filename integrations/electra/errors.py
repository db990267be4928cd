"""The integration's one user-error type and its one way out of the command line.

Pretraining and fine-tuning raise `UserError` for a mistake the user must fix (arguments, paths, data), and every
command reports it the same way (`report_user_error`); anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import os
import sys


class UserError(Exception):
    """A mistake in arguments, paths or data that the user must fix; the CLI prints it as one ``error:`` line
    (exit status 2) without a traceback. Anything else is a bug and keeps its traceback."""


def report_user_error(error: UserError) -> int:
    """The one way a user error leaves the command line: ``error: ...`` on stderr, exit status 2.

    ``ELECTRA_TMR_DEBUG=1`` re-raises instead, to show the traceback.
    """
    if os.environ.get("ELECTRA_TMR_DEBUG"):
        raise error
    print(f"error: {error}", file=sys.stderr)
    return 2

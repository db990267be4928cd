"""The one exception type for user errors (bad paths, missing files, unknown tasks)."""


class FinetuneError(Exception):
    """An unrecoverable user error; its message alone should tell the user what to fix.

    The command line prints it without a traceback and exits with status 2.
    """

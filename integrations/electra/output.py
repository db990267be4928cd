"""What the integration writes to the console: its progress bars (quiet when the output is not a terminal) and
transformers' expected chatter, silenced."""
from __future__ import annotations

import contextlib
import sys


REDIRECTED_BAR_SECONDS = 30.0  # at most one redraw this often when the bar's stream is not a terminal


def progress_bar(*, enabled: bool = True, file=None, **kwargs):
    """A tqdm bar (``kwargs`` are tqdm's): the one place the integration's bars are made, and the one rule for
    output that is not a terminal.

    On a terminal a redraw overwrites the line, so tqdm redraws up to ten times a second. Redirected to a file (a
    job's log, a queue, CI) every redraw is kept: the default job wrote a 224 KB log of them. There a bar first
    appears after `REDIRECTED_BAR_SECONDS` (work shorter than that leaves no trace), then redraws at most that
    often (``maxinterval`` too, else tqdm's monitor thread forces a redraw every 10 s) and once at the end: a
    log still shows, in a few lines, that a long run is alive and how far it got. ``enabled=False``
    (``--no-progress``) writes nothing.
    """
    from tqdm.auto import tqdm

    stream = sys.stderr if file is None else file
    if enabled and not _is_terminal(stream):
        kwargs.update(delay=REDIRECTED_BAR_SECONDS, mininterval=REDIRECTED_BAR_SECONDS,
                      maxinterval=REDIRECTED_BAR_SECONDS, dynamic_ncols=False)
    return tqdm(file=file, disable=not enabled, **kwargs)


def _is_terminal(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (ValueError, OSError):  # a closed or detached stream
        return False


@contextlib.contextmanager
def quiet_transformers():
    """Silence expected transformers chatter (the 'unused weights' report when the discriminator head is dropped,
    'sequence longer than model_max_length' before our own windowing) and its progress bars; restore both after."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()

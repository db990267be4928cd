"""Long-running checks (not part of the installed package, outside the test suite's time budget): each runs as
a module from the checkout root (``python -m checks.<module>``). Timings live in ``bench/``."""

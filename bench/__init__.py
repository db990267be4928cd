"""Timings (not part of the installed package): each script runs as a module from the checkout root
(``python -m bench.<module>``) and imports its siblings as ``bench.<module>``. The long-running checks
(fuzzing, soak, fault injection, DDP stress, the GPU check) live in ``checks/``."""

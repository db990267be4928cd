"""The experiment drivers behind results/ (not part of the installed package): each runs as a module from the
checkout root (``python -m experiments.<module>``, no ``sys.path`` edits) and imports its siblings as
``experiments.<module>``. README.md in this folder maps every results file to the driver and command that
wrote it."""

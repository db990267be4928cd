"""The experiment drivers behind results/ (not part of the installed package): each runs from a checkout, from
any working directory, and imports its siblings as ``experiments.<module>``. README.md maps every results file
to the driver and command that wrote it."""

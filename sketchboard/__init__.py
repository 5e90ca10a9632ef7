"""The composition root: settings, wiring and the command line."""

"""Patterns over event sequences: a pure matcher (an NFA per key) for the patterns declared in the
catalog (catalog/patterns.py). No I/O and no clock: events come in event-time order per key and
the watermark is passed in. Semantics: docs/patterns.md."""

"""What no label can hold, in the bottom layer: ingest refuses such labels (ingest/events.py)
and the catalog refuses pattern literals that could never equal one (catalog/patterns.py).

A label may not hold U+0000: PostgreSQL's text refuses it (a batch holding one could never be
committed there) and SQLite's json_each, which binds a batch's keys, cuts text at it. Nor a lone
surrogate (JSON's "\\ud800" escape): it is no Unicode text, so it cannot be encoded as UTF-8 for a
partition's hash, a store or an answer."""

from __future__ import annotations

import re

NUL = "\x00"
NUL_REASON = "contains a NUL character (U+0000), which the stores cannot hold"
SURROGATE_REASON = "contains a lone surrogate (U+D800..U+DFFF), which is no Unicode text and the stores cannot hold"
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def unstorable(text: str) -> str | None:
    """Why `text` cannot be a label (NUL_REASON, SURROGATE_REASON), or None."""
    found = UNSTORABLE.search(text)
    if found is None:
        return None
    return NUL_REASON if found.group() == NUL else SURROGATE_REASON

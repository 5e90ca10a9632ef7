"""The store's schema version, the same number for every backend: a store is created at it,
one written by an older Sketchboard is upgraded to it at start, and one written by a newer
Sketchboard is refused (its tables may mean something this code would misread). Pure."""

from __future__ import annotations

# 1: panes, sketches, change feed, corrections, dead letters, progress, offsets, roll-up tiers,
#    Bloom filters and first-seen counts (the first versioned schema; SQLite files from before
#    carry user_version 0 and are upgraded by adding the columns they lack).
# 2: a stream's open sessions may be held in buckets (store/sessions.py: session_buckets,
#    session_streams), where a Sketchboard knowing only version 1 would read none of them.
# 3: a stream's coarser tiers are folded (store/tier_folds.py: tier_folds): their rows lack the panes
#    after the fold point, which a Sketchboard knowing only version 2 would never merge into them.
SCHEMA_VERSION = 3


class StoreVersionError(RuntimeError):
    """The store was written by a newer Sketchboard than this one."""


def check_version(found: int | None, where: str) -> None:
    """Refuse a store whose schema is newer than this code knows; None or older is upgraded."""
    if found is not None and found > SCHEMA_VERSION:
        raise StoreVersionError(
            f"{where} has store schema version {found}, but this Sketchboard knows versions up to"
            f" {SCHEMA_VERSION}: it was written by a newer Sketchboard. Run that version (or newer),"
            " or point this one at another store; nothing was changed.")

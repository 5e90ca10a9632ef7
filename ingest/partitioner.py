"""Which partition an event goes to: a stable hash of its key, so one key stays in order."""

from __future__ import annotations

import zlib


def partition_for(key: str | None, partitions: int, fallback: int = 0) -> int:
    """crc32 of the UTF-8 key modulo the partition count (stable across processes,
    unlike Python's salted hash()); keyless events use the caller's fallback
    (e.g. a round-robin counter)."""
    if key is None:
        return fallback % partitions
    return zlib.crc32(key.encode("utf-8")) % partitions

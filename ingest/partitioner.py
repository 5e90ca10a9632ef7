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


def assign_partitions(keys: list[str | None], partitions: int, round_robin: int) -> tuple[list[int], int]:
    """The partition of each key, in order, and the round-robin counter after them: keyed
    events by `partition_for`, keyless ones spread round-robin. Every log backend assigns
    partitions this way, so a key lands in the same partition whichever log holds it."""
    out = []
    for key in keys:
        if key is None:
            round_robin += 1
        out.append(partition_for(key, partitions, round_robin))
    return out, round_robin

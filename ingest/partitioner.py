"""Which partition an event goes to: a stable hash of its key, so one key stays in order."""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa

from sketches.crc32 import crc32_of_strings


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


def assign_partitions_columnar(keys: pa.Array | None, rows: int, partitions: int,
                               round_robin: int) -> tuple[np.ndarray, int]:
    """`assign_partitions` for a column of keys (None: a keyless stream), same answers: the crc32 of
    every key as it comes (one compiled pass: cheaper than finding the distinct keys first),
    keyless rows numbered on from the round-robin counter."""
    if keys is None:
        turns = np.arange(round_robin + 1, round_robin + 1 + rows, dtype=np.int64)
        return turns % partitions, round_robin + rows
    out = (crc32_of_strings(keys) % np.uint32(partitions)).astype(np.int64)
    if keys.null_count == 0:
        return out, round_robin
    # Keyless rows among keyed ones (a key that may be null): round-robin in row order.
    null = keys.is_null().to_numpy(zero_copy_only=False)
    turns = np.arange(round_robin + 1, round_robin + 1 + int(null.sum()), dtype=np.int64)
    out[null] = turns % partitions
    return out, round_robin + int(null.sum())

"""`zlib.crc32` of many strings at once: the stable hash of a key that places it, the same in
every process and version (Python's `hash()` is salted). The log's partitions (ingest/partitioner.py)
and the store's buckets of open sessions (store/sessions.py) are chosen by it."""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa
from numba import njit

# The CRC-32 (IEEE 802.3, reflected: zlib's) of every byte value, for the per-byte step below.
_CRC_TABLE = np.array([zlib.crc32(bytes([b]), 0xFFFFFFFF) ^ 0xFFFFFFFF for b in range(256)], np.uint32)


def crc32_of_strings(strings: pa.Array) -> np.ndarray:
    """`zlib.crc32` of each string's UTF-8 bytes (uint32; a null's is that of whatever bytes its slot
    spans, meaningless: callers set their nulls apart). One compiled pass over the strings' own
    buffers, a table step a byte: a request's partitions for 10 000 demo events (~9 000 distinct
    users) took ~0.6 ms to hash the distinct keys a byte position at a time in numpy (after ~0.25 ms
    to find them), ~0.1 ms every key as it comes here (docs/benchmarks.md, session 104)."""
    if strings.type != pa.string():
        raise TypeError(f"keys to hash are strings, not {strings.type}")
    n = len(strings)
    if not n:
        return np.zeros(0, np.uint32)
    offsets = np.frombuffer(strings.buffers()[1], np.int32, n + 1, strings.offset * 4)
    data = strings.buffers()[2]
    data = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    out = np.empty(n, np.uint32)
    _crc32_each(offsets, data, _CRC_TABLE, out)
    return out


@njit(nogil=True, cache=True, _nrt=False)  # allocates nothing: no reference counts (docs/development.md)
def _crc32_each(offsets, data, table, out):
    for i in range(len(out)):
        crc = np.uint32(0xFFFFFFFF)
        for at in range(offsets[i], offsets[i + 1]):
            crc = table[(crc ^ data[at]) & 0xFF] ^ (crc >> np.uint32(8))
        out[i] = crc ^ np.uint32(0xFFFFFFFF)

"""Many strings' UTF-8 bytes grouped by their length, for hashes computed by numpy over all the
strings of one length at once (sketches/xxh64.py, sketches/hll_coupons.py): strings of one length
take the same steps, so each step is one array operation over all of them (ids come in a few
lengths). Strings longer than `long_key` bytes, and lengths fewer than `few` strings have, are
left to the library one by one: there the array steps cost more."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa


@dataclass(frozen=True)
class ByLength:
    starts: np.ndarray  # each string's first byte in `padded`
    lengths: np.ndarray  # its bytes
    padded: np.ndarray  # every string's bytes, then zeros enough for a row of the widest array step
    one_by_one: list[np.ndarray]  # the rows the library hashes, filled by `groups`

    def groups(self, long_key: int, few: int, lane: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """(length, rows, matrix) per length the array steps take: the rows' bytes, `length` rounded
        up to a multiple of `lane` bytes wide, past `length` whatever follows (the next string's
        bytes, zeros after the last). The other rows go to `one_by_one`."""
        per_length = np.bincount(np.minimum(self.lengths, long_key + 1))
        for length in np.flatnonzero(per_length).tolist():
            if length > long_key:
                self.one_by_one.append(np.flatnonzero(self.lengths > long_key))
                continue
            rows = np.flatnonzero(self.lengths == length)
            if len(rows) < few:
                self.one_by_one.append(rows)
                continue
            width = -(-length // lane) * lane or lane
            yield length, rows, self.padded[self.starts[rows, None] + np.arange(width)]

    def key(self, i: int) -> bytes:
        """String i's bytes."""
        return self.padded[self.starts[i]:self.starts[i] + self.lengths[i]].tobytes()


def by_length(strings: pa.Array, pad: int, what: str) -> ByLength:
    """The strings' bytes (Arrow strings, no nulls: `what` names them in the errors), with `pad`
    zeros after the last."""
    if strings.type != pa.string():
        raise TypeError(f"{what} to hash are strings, not {strings.type}")
    if strings.null_count:
        raise ValueError(f"{what} to hash hold a null")
    n = len(strings)
    if not n:
        return ByLength(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(pad, np.uint8), [])
    offsets = np.frombuffer(strings.buffers()[1], np.int32)[strings.offset:strings.offset + n + 1].astype(np.int64)
    data = strings.buffers()[2]
    data = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    padded = np.concatenate([data[:int(offsets[-1])], np.zeros(pad, np.uint8)])
    return ByLength(offsets[:-1], np.diff(offsets), padded, [])

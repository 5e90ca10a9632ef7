"""The union of HLL sketches in HLL mode without DataSketches objects: numpy over their buckets.

A sketch that has seen a few hundred distinct items or more is in HLL mode; an HLL_8 one holds a
byte per bucket (4 096 at lg_k 12). DataSketches' union of two or more such sketches
(`hll_union(lg_k)`, each part's update, `get_result(HLL_8)`) is the bucket-wise maximum and is
"out of order" (it keeps no HIP estimate); it serializes (compact) as: the preamble, flags
compact | out of order, current minimum 0, the HIP accumulator as 0, KxQ0 and KxQ1 (the sums of
2^-v over the buckets below 32 and from 32 up), the buckets at the minimum (those at 0), no
auxiliary entries, then the buckets. DataSketches recomputes KxQ0 and that count from the buckets,
so the parts' own header fields are not read. Measured here at lg_k 12: ~33-47 us a union of two
through DataSketches, ~14 us in numpy (100 parts: ~420 against ~190 us); a demo commit merges a
few hundred such pairs (a pane or tier row of many users and a batch's), and a query merging many
rows takes one maximum over all of them. Below lg_k 10 numpy's fixed cost is more than the
library's whole union (lg_k 8: ~7.6 against ~3.6 us), so those stay DataSketches'.

KxQ0 is exact in any order: at most 2^lg_k terms, multiples of 2^-31 summing to at most 2^lg_k,
within a double's 53 bits up to lg_k 21. Left to DataSketches (None): a bucket of 32 or more (a
chance of 2^-31 an item, not worth a path of its own); a union of one part (a copy of it, HIP
estimate and all); a part whose buckets are all 0 (DataSketches skips it as empty); and any part of
another kind: LIST and SET mode parts (DataSketches puts their few coupons into a copy of an
HLL-mode sketch in ~5 us), HLL_4 or HLL_6 buckets, another lg_k, a current minimum above 0, flags
other than compact and out of order (a full-size sketch's, say), bytes of another layout.
tests/unit/test_hll_dense.py pins the bytes to DataSketches' union's."""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

# An HLL-mode sketch's header (sketches/hll_build.py reads and writes it too): preamble ints .. mode;
# HIP accumulator, KxQ0, KxQ1; the count at the current minimum, the auxiliary entries.
HLL_HEAD = struct.Struct("<BBBBBBBBdddii")
HLL_PRE_INTS, _SER_VER, _FAMILY = 10, 1, 7
HLL_MODE_HLL8 = 2 | (2 << 2)  # current mode HLL (2) | target type HLL_8 (2) << 2
_EMPTY, _COMPACT, _OUT_OF_ORDER = 4, 8, 16
_FLAGS_READ = _COMPACT | _OUT_OF_ORDER  # flags a part may carry (not: big endian, read only, empty, full size)
MIN_LG_K = 10  # below, DataSketches' union is the faster
INVERSE_POWERS = np.ldexp(1.0, -np.arange(32))  # 2^-v for a bucket value v below 32 (KxQ0's terms)


def dense_registers(blob: bytes | bytearray | memoryview, lg_k: int) -> np.ndarray | None:
    """The buckets of an HLL-mode HLL_8 sketch of `lg_k` (a view of the bytes, not a copy); None
    when the bytes are anything else."""
    k = 1 << lg_k
    if len(blob) != HLL_HEAD.size + k:
        return None
    pre, ser, family, blob_lg_k, _, flags, cur_min, mode, _, _, _, _, aux = HLL_HEAD.unpack_from(blob)
    expected = (HLL_PRE_INTS, _SER_VER, _FAMILY, lg_k, HLL_MODE_HLL8, 0, 0)
    if (pre, ser, family, blob_lg_k, mode, cur_min, aux) != expected:
        return None
    if flags & ~_FLAGS_READ:
        return None
    return np.frombuffer(blob, np.uint8, k, HLL_HEAD.size)


def merged_dense_bytes(blobs: Sequence[bytes | bytearray | memoryview], lg_k: int) -> bytes | None:
    """The compact bytes of DataSketches' union of `blobs` into an HLL_8 sketch of `lg_k`, where
    there are two parts or more and each is an HLL-mode HLL_8 sketch of `lg_k` with a bucket above
    0 (and lg_k is at least MIN_LG_K); else None (the module's docstring says why)."""
    if len(blobs) < 2 or lg_k < MIN_LG_K or any(len(blob) < 8 or blob[0] != HLL_PRE_INTS for blob in blobs):
        return None  # by the preamble byte alone: a batch's small groups' sketches are in LIST or SET mode
    parts = []
    for blob in blobs:
        registers = dense_registers(blob, lg_k)
        if registers is None or not registers.any():
            return None
        parts.append(registers)
    merged = np.maximum(parts[0], parts[1]) if len(parts) == 2 else np.maximum.reduce(parts)
    counts = np.bincount(merged, minlength=32)
    if len(counts) > 32:
        return None  # a bucket of 32 or more: rare, DataSketches' to merge
    kxq0 = float(counts @ INVERSE_POWERS)
    return HLL_HEAD.pack(HLL_PRE_INTS, _SER_VER, _FAMILY, lg_k, 0, _COMPACT | _OUT_OF_ORDER, 0, HLL_MODE_HLL8,
                      0.0, kxq0, 0.0, int(counts[0]), 0) + merged.tobytes()

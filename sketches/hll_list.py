"""The union of small HLL sketches without DataSketches objects: a byte-level shortcut.

An HLL sketch that has seen fewer than 8 distinct items is in LIST mode: it holds the items'
coupons (32-bit hashes with their bucket) in the order they came. DataSketches' union of such
sketches, while it stays under 8 coupons, is the list of their coupons without repeats, in
the order the union met them (each sketch's list in turn). This module writes that list
directly in the compact format the union's HLL_8 result serializes to (from compact parts, or
the updatable layout Spark's hll_sketch_agg writes), which is what a
backfill commit's tier rows (a handful of users each) need thousands of times: ~2 us instead
of ~12 us. Anything else (SET or HLL mode, another lg_k, 8 coupons or more) returns None and
the caller merges with DataSketches. tests/unit/test_tier_levels.py pins the bytes equal to
HllSketch.merge_all's."""

from __future__ import annotations

import struct
from collections.abc import Sequence

_HEAD = struct.Struct("<BBBBBBBB")  # preamble ints, serial version, family, lg_k, lg_arr, flags, count, mode
_FAMILY = 7
_LIST_LG_ARR = 3  # a LIST holds up to 7 coupons; the 8th makes it a SET
_COMPACT, _EMPTY = 8, 4
_LIST_HLL8 = 2 << 2  # current mode LIST (0) | target type HLL_8 (2) << 2


def list_coupons(blob: bytes, lg_k: int) -> tuple[int, ...] | None:
    """The coupons of a compact LIST-mode sketch of `lg_k`, in stored order; None when it is not one."""
    if len(blob) < 8:
        return None
    pre, ser, family, k, lg_arr, flags, count, mode = _HEAD.unpack_from(blob)
    if (pre, ser, family, k, lg_arr) != (2, 1, _FAMILY, lg_k, _LIST_LG_ARR) or mode & 3 != 0:
        return None
    if flags == _COMPACT | _EMPTY and count == 0 and len(blob) == 8:
        return ()
    if flags == _COMPACT and 0 < count < 8 and len(blob) == 8 + 4 * count:
        return struct.unpack_from(f"<{count}I", blob, 8)
    if flags in (0, _EMPTY) and len(blob) == 8 + 4 * (1 << _LIST_LG_ARR):
        # The updatable layout (what Spark's hll_sketch_agg writes): every slot, empty ones 0.
        coupons = tuple(c for c in _SLOTS.unpack_from(blob, 8) if c)
        if len(coupons) == count and (flags == _EMPTY) == (count == 0):
            return coupons
    return None


_SLOTS = struct.Struct(f"<{1 << _LIST_LG_ARR}I")


def merged_list_bytes(blobs: Sequence[bytes], lg_k: int) -> bytes | None:
    """The bytes HllSketch.merge_all(blobs).to_bytes() gives, when every part is a LIST-mode
    sketch of `lg_k` and they hold fewer than 8 distinct coupons together; else None."""
    seen: dict[int, None] = {}
    for blob in blobs:
        coupons = list_coupons(blob, lg_k)
        if coupons is None:
            return None
        for c in coupons:
            seen[c] = None
        if len(seen) >= 8:
            return None
    if not seen:
        return _HEAD.pack(2, 1, _FAMILY, lg_k, _LIST_LG_ARR, _COMPACT | _EMPTY, 0, _LIST_HLL8)
    return (_HEAD.pack(2, 1, _FAMILY, lg_k, _LIST_LG_ARR, _COMPACT, len(seen), _LIST_HLL8)
            + struct.pack(f"<{len(seen)}I", *seen))

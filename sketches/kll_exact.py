"""The merge of small KLL sketches without DataSketches objects: a byte-level shortcut.

A KLL sketch that has seen at most k items (exact mode: one level, no compaction) holds the
items themselves. Merging such sketches into one that still holds at most k items compacts
nothing, so the merged sketch is fully determined: DataSketches' merge takes the first part
as the start and inserts the other parts' items one by one, each at the front of level 0.
This module writes those bytes directly (the C++ library's compact serialization, version
1/2), which is what a backfill's commit does hundreds of thousands of times for tier rows of
a few events each: ~1 us instead of ~20 us for a deserialize / merge / serialize round trip.
Anything else (estimation mode, another k, a format this does not recognise) returns None
and the caller merges with DataSketches. tests/unit/test_kll_exact.py pins the bytes equal to
KllSketch.merge_all's."""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

_FAMILY = 15
_FLAG_EMPTY, _FLAG_SINGLE = 1, 4
_M = 8  # DataSketches' minimum level width, part of every header
_HEAD = struct.Struct("<BBBBHBB")  # preamble ints, serial version, family, flags, k, m, unused
_FULL = struct.Struct("<QHBBI")  # n, min_k, levels, unused, level 0's offset (its first item)
_BOUNDS = struct.Struct("<dd")  # the min and the max item
_FULL_ITEMS = _HEAD.size + _FULL.size + 16  # after the header, the min and the max


def exact_items(blob: bytes, k: int) -> np.ndarray | None:
    """The items of an exact-mode sketch of `k`, in stored order; None when it is not one."""
    if len(blob) < 8:
        return None
    pre, ser, family, flags, kk, m, _ = _HEAD.unpack_from(blob)
    if family != _FAMILY or kk != k or m != _M:
        return None
    if pre == 2 and ser == 1 and flags == _FLAG_EMPTY and len(blob) == 8:
        return np.empty(0)
    if pre == 2 and ser == 2 and flags == _FLAG_SINGLE and len(blob) == 16:
        return np.frombuffer(blob, "<f8", 1, 8)
    if pre == 5 and ser == 1 and flags == 0 and len(blob) >= _FULL_ITEMS:
        n, min_k, levels, _, offset = _FULL.unpack_from(blob, _HEAD.size)
        if levels == 1 and min_k == k and k - offset == n and len(blob) == _FULL_ITEMS + 8 * n:
            return np.frombuffer(blob, "<f8", n, _FULL_ITEMS)
    return None


def exact_bytes(items: np.ndarray, k: int) -> bytes:
    """The compact bytes of an exact-mode sketch of `k` holding `items` (at most k), stored in
    this order (level 0 is unsorted: the order changes no answer)."""
    n = len(items)
    return exact_bytes_of(items.astype("<f8", copy=False).tobytes(), n, float(items.min()) if n else 0.0,
                          float(items.max()) if n else 0.0, k)


def exact_bytes_of(items: bytes, n: int, lo: float, hi: float, k: int) -> bytes:
    """exact_bytes from the items' little-endian doubles, their number, min and max."""
    if n == 0:
        return _HEAD.pack(2, 1, _FAMILY, _FLAG_EMPTY, k, _M, 0)
    if n == 1:
        return _HEAD.pack(2, 2, _FAMILY, _FLAG_SINGLE, k, _M, 0) + items
    return b"".join((_HEAD.pack(5, 1, _FAMILY, 0, k, _M, 0), _FULL.pack(n, k, 1, 0, k - n), _BOUNDS.pack(lo, hi),
                     items))


def merged_bytes(blobs: Sequence[bytes], k: int) -> bytes | None:
    """The bytes KllSketch.merge_all(blobs).to_bytes() gives, when every part is an exact-mode
    sketch of `k` and they hold at most k items together; else None."""
    parts = []
    total = 0
    lo = hi = None
    for blob in blobs:
        items = exact_items(blob, k)
        if items is None:
            return None
        total += len(items)
        if total > k:
            return None
        parts.append(items)
        if len(items):
            # The bounds as DataSketches' merge keeps them: the first part's, then replaced only
            # by a strictly smaller min or larger max (a -0.0 after a 0.0 leaves 0.0: a signed
            # zero is why the items' numpy min could differ).
            p_lo, p_hi = (items[0], items[0]) if len(items) == 1 else _BOUNDS.unpack_from(blob, _HEAD.size + _FULL.size)
            if lo is None:
                lo, hi = p_lo, p_hi
            else:
                lo = p_lo if p_lo < lo else lo
                hi = p_hi if hi < p_hi else hi
    # The first part stays as stored; each later one is inserted item by item in front of level 0.
    items = np.concatenate([p[::-1] for p in reversed(parts[1:])] + [parts[0]]).astype("<f8", copy=False)
    return exact_bytes_of(items.tobytes(), len(items), 0.0 if lo is None else float(lo), 0.0 if hi is None else float(hi), k)



_GROUP_HEAD = _HEAD
_GROUP_FULL = np.dtype([("n", "<u8"), ("min_k", "<u2"), ("levels", "u1"), ("unused", "u1"), ("offset", "<u4"),
                      ("lo", "<f8"), ("hi", "<f8")])  # after the header of a sketch of 2+ items


def exact_bytes_per_group(items: np.ndarray, counts: np.ndarray, lo: np.ndarray, hi: np.ndarray, k: int) -> pa.Array:
    """Per group, the bytes of an exact-mode KLL sketch of `k` holding its items (`items` grouped
    in order, `counts` per group): exact_bytes_of, written for every group at once. The items stored in reverse: DataSketches puts each update in front of level 0. A group
    of more than k items gets no bytes here (its sketch compacts)."""
    groups = len(counts)
    c = np.where(counts <= k, counts, -1)
    size = np.where(c < 0, 0, np.where(c == 0, 8, np.where(c == 1, 16, 40 + 8 * c)))
    offsets = np.concatenate(([0], np.cumsum(size))).astype(np.int64)
    out = np.zeros(int(offsets[-1]), np.uint8)
    heads = np.frombuffer(b"".join((_GROUP_HEAD.pack(2, 1, 15, 1, k, 8, 0), _GROUP_HEAD.pack(2, 2, 15, 4, k, 8, 0),
                                    _GROUP_HEAD.pack(5, 1, 15, 0, k, 8, 0))), np.uint8).reshape(3, 8)
    at, row = offsets[:-1][c >= 0], np.minimum(c[c >= 0], 2)
    out[at[:, None] + np.arange(8)] = heads[row]
    full = c >= 2
    if full.any():
        rec = np.zeros(int(full.sum()), _GROUP_FULL)
        rec["n"], rec["min_k"], rec["levels"], rec["offset"] = c[full], k, 1, k - c[full]
        rec["lo"], rec["hi"] = lo[full], hi[full]
        out[(offsets[:-1][full] + 8)[:, None] + np.arange(_GROUP_FULL.itemsize)] = rec.view(np.uint8).reshape(-1, 32)
    # The items written as doubles (every size, so every offset, is a multiple of 8 bytes), and
    # only those of the groups that store them: most of a batch's are in its few groups past k
    # (1 M events, 5 value slots: 38 -> 2 ms). A group's item i goes i doubles before its first's.
    stored = c >= 1
    sizes = counts[stored]
    last = (offsets[:-1][stored] + np.where(c[stored] >= 2, 40, 8)) // 8 + sizes - 1
    before = np.cumsum(sizes) - sizes  # the group's first item among the stored ones
    dest = np.repeat(last + before, sizes) - np.arange(int(sizes.sum()))
    out.view("<f8")[dest] = items[np.repeat(stored, counts)]
    return pa.Array.from_buffers(pa.large_binary(), groups, [None, pa.py_buffer(offsets), pa.py_buffer(out)]).cast(pa.binary())


ABSENT, OPAQUE = -2, -1  # exact_items_many's count for a row without a sketch / with one not in exact mode


def exact_items_many(blobs: Sequence[bytes | None], k: int) -> tuple[np.ndarray, np.ndarray]:
    """exact_items for many rows at once (a commit's pane sketches: ~650 000 calls of ~1.5 us
    each before): per row the number of items (ABSENT for None, OPAQUE where exact_items gives
    None), and every exact row's items, row after row (a row's start is the cumulative count).
    The headers are read with numpy over the rows' bytes joined, not one struct unpack per row."""
    rows = len(blobs)
    count = np.full(rows, ABSENT, np.int64)
    present = [i for i, b in enumerate(blobs) if b is not None]
    if not present:
        return count, np.empty(0)
    parts = [blobs[i] for i in present]
    length = np.fromiter(map(len, parts), np.int64, len(parts))
    at = np.concatenate(([0], np.cumsum(length)[:-1]))
    data = np.frombuffer(b"".join(parts), np.uint8)
    h = np.zeros((len(parts), 8), np.uint8)
    head = length >= 8
    h[head] = data[at[head][:, None] + np.arange(8)]
    pre, ser, family, flags, m = (h[:, i].astype(np.int64) for i in (0, 1, 2, 3, 6))
    kk = h[:, 4].astype(np.int64) | h[:, 5].astype(np.int64) << 8
    ok = head & (family == _FAMILY) & (kk == k) & (m == _M)
    empty = ok & (pre == 2) & (ser == 1) & (flags == _FLAG_EMPTY) & (length == 8)
    single = ok & (pre == 2) & (ser == 2) & (flags == _FLAG_SINGLE) & (length == 16)
    full = np.flatnonzero(ok & (pre == 5) & (ser == 1) & (flags == 0) & (length >= _FULL_ITEMS))
    n = np.full(len(parts), OPAQUE, np.int64)
    n[empty], n[single] = 0, 1
    if len(full):
        fields = data[(at[full] + _HEAD.size)[:, None] + np.arange(_FULL.size)].copy().view(_FULL_FIELDS).ravel()
        n_full = fields["n"].astype(np.int64)
        valid = ((fields["levels"] == 1) & (fields["min_k"] == k) & (k - fields["offset"].astype(np.int64) == n_full)
                 & (length[full] == _FULL_ITEMS + 8 * n_full))
        n[full[valid]] = n_full[valid]
    count[present] = n
    used = np.maximum(n, 0)
    begin = np.where(single, at + 8, at + _FULL_ITEMS)
    ends = np.cumsum(used)
    byte = np.repeat(begin - 8 * (ends - used), used) + 8 * np.arange(ends[-1] if len(ends) else 0)
    items = data[byte[:, None] + np.arange(8)].copy().view("<f8").ravel() if len(byte) else np.empty(0)
    return count, items


_FULL_FIELDS = np.dtype([("n", "<u8"), ("min_k", "<u2"), ("levels", "u1"), ("unused", "u1"), ("offset", "<u4")])

"""Sketch bytes merged per group, for many groups at once: the small ones written directly.

The map-side Arrow partials (aggregates/arrow_partials.py) give a group one partial per input
partition; merging them one group at a time through DataSketches objects (or the per-group byte
shortcuts of sketches.kll_exact and sketches.hll_list, which parse each part in Python) cost
~200 us per group of a live batch, more than the group-by itself. Here the parts' headers are
read for every row at once (numpy over the Arrow binary column's buffers): a group whose KLL
parts are exact-mode sketches holding at most k items together gets the exact-mode sketch of
their items, a group whose HLL parts are LIST-mode sketches holding fewer than 8 distinct
coupons together gets the LIST of them (first comings, in the parts' order): the bytes
sketches.kll_exact.merged_bytes / sketches.hll_list.merged_list_bytes give, i.e. DataSketches'
(for KLL up to the order of the items in level 0, which no answer depends on). Other groups of
several parts go through DataSketches, one group at a time; a group of one part keeps its bytes.
Pure; tests/unit/test_sketch_merges.py pins it against DataSketches' own merge."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from sketches.hll import HllSketch
from sketches.kll import KllSketch

_KLL_FAMILY, _KLL_M = 15, 8
_HLL_FAMILY, _HLL_LIST_LG_ARR, _HLL_COMPACT, _HLL_EMPTY, _HLL_LIST_HLL8 = 7, 3, 8, 4, 2 << 2


def merged_klls(blobs: pa.Array, starts: np.ndarray, k: int) -> pa.Array:
    """Per group (rows starts[g] to starts[g + 1] of `blobs`, KLL sketch bytes of `k`) the bytes of
    one sketch merging its rows'."""
    return _merged(blobs, starts, lambda offsets, data, rows: _exact_klls(offsets, data, rows, k),
                   lambda parts: KllSketch.merge_all(parts, k).to_bytes())


def merged_hlls(blobs: pa.Array, starts: np.ndarray, lg_k: int) -> pa.Array:
    """Per group (rows starts[g] to starts[g + 1] of `blobs`, HLL sketch bytes of `lg_k`) the bytes
    of the union of its rows'."""
    return _merged(blobs, starts, lambda offsets, data, rows: _list_hlls(offsets, data, rows, lg_k),
                   lambda parts: HllSketch.merged_bytes(parts, lg_k))


def _merged(blobs: pa.Array, starts: np.ndarray, direct: Callable, merge: Callable) -> pa.Array:
    if isinstance(blobs, pa.ChunkedArray):
        blobs = blobs.combine_chunks()
    n = len(blobs)
    sizes = np.diff(np.append(starts, n)).astype(np.int64)
    multi = np.flatnonzero(sizes > 1)
    if not len(multi):
        return blobs
    offsets, data = _buffers(blobs)
    written, done = direct(offsets, data, (_rows(starts[multi], sizes[multi]), sizes[multi]))  # done: per group of several, written directly
    rest = multi[~done]
    rest_sizes = sizes[rest]
    values = blobs.take(pa.array(_rows(starts[rest], rest_sizes), pa.int64())).to_pylist()  # one call, not one slice per group
    at = np.concatenate(([0], np.cumsum(rest_sizes))).tolist()
    merged = [merge([b for b in values[at[i]:at[i + 1]] if b is not None]) for i in range(len(rest))]
    # Each group's bytes: its one row's, its directly written ones, or DataSketches'.
    pick = starts.astype(np.int64).copy()
    pick[multi[done]] = n + np.arange(int(done.sum()))
    pick[rest] = n + int(done.sum()) + np.arange(len(rest))
    parts = [blobs.cast(pa.binary()), written.cast(pa.binary()), pa.array(merged, pa.binary())]
    return pa.concat_arrays(parts).take(pa.array(pick, pa.int64())).cast(blobs.type)


def _rows(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The rows of the groups starting at `starts` of `sizes` rows, group after group."""
    return np.repeat(starts - np.cumsum(sizes) + sizes, sizes) + np.arange(sizes.sum())


def _buffers(blobs: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A binary column's value offsets (one more than rows) and its bytes, as numpy."""
    large = pa.types.is_large_binary(blobs.type)
    _, offsets, data = blobs.buffers()
    offsets = np.frombuffer(offsets, np.int64 if large else np.int32)[blobs.offset:blobs.offset + len(blobs) + 1]
    data = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    return offsets.astype(np.int64), data


def _field(data: np.ndarray, at: np.ndarray, width: int, dtype: str) -> np.ndarray:
    """The little-endian field of `width` bytes at each of `at`."""
    if not len(at):
        return np.zeros(0, dtype)
    return data[at[:, None] + np.arange(width)].copy().view(dtype).ravel()


def _gather(data: np.ndarray, begin: np.ndarray, count: np.ndarray, width: int,
            backwards: np.ndarray | None = None) -> np.ndarray:
    """The bytes of `count[i]` items of `width` bytes from `begin[i]`, one row after the other
    (the items of a row where `backwards` is set in reverse order)."""
    ends = np.cumsum(count)
    within = np.arange(ends[-1] if len(ends) else 0) - np.repeat(ends - count, count)
    if backwards is not None:
        within = np.where(np.repeat(backwards, count), np.repeat(count, count) - 1 - within, within)
    item = np.repeat(begin, count) + within * width
    return data[item[:, None] + np.arange(width)] if len(item) else np.zeros((0, width), np.uint8)


def _groups_of(parts: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    rows, sizes = parts
    return np.repeat(np.arange(len(sizes)), sizes)


def _exact_klls(offsets: np.ndarray, data: np.ndarray, parts, k: int) -> tuple[pa.Array, np.ndarray]:
    """For the groups of several parts (`parts`: their rows group after group, and each group's
    size) whose parts are exact-mode sketches of `k` holding at most k items together: the
    exact-mode bytes of their items; and which groups those are."""
    from sketches.kll_exact import exact_bytes_per_group

    rows, sizes = parts
    at, length = offsets[rows], offsets[rows + 1] - offsets[rows]
    head = length >= 8
    h = np.zeros((len(rows), 8), np.uint8)
    h[head] = data[at[head][:, None] + np.arange(8)]
    pre, ser, family, flags, m = (h[:, i].astype(np.int64) for i in (0, 1, 2, 3, 6))
    kk = h[:, 4].astype(np.int64) | h[:, 5].astype(np.int64) << 8
    ok = head & (family == _KLL_FAMILY) & (kk == k) & (m == _KLL_M)
    empty = ok & (pre == 2) & (ser == 1) & (flags == 1) & (length == 8)
    single = ok & (pre == 2) & (ser == 2) & (flags == 4) & (length == 16)
    full = ok & (pre == 5) & (ser == 1) & (flags == 0) & (length >= 40)
    n = np.zeros(len(rows), np.int64)
    f = np.flatnonzero(full)
    n_full, min_k = _field(data, at[f] + 8, 8, "<u8").astype(np.int64), _field(data, at[f] + 16, 2, "<u2")
    levels, first = data[at[f] + 18], _field(data, at[f] + 20, 4, "<u4").astype(np.int64)
    valid = (levels == 1) & (min_k == k) & (k - first == n_full) & (length[f] == 40 + 8 * n_full)
    full[f[~valid]] = False
    n[f[valid]] = n_full[valid]
    n[single] = 1
    exact = empty | single | full
    group = _groups_of(parts)
    bounds = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    total = np.add.reduceat(n, bounds)
    done = np.logical_and.reduceat(exact, bounds) & (total <= k)
    take = done[group] & (n > 0)
    # DataSketches' merge keeps the first part's items as stored and puts each later one in front
    # of them; the writer stores items in reverse: the first part's taken backwards, the same bytes.
    leads = np.zeros(len(rows), bool)
    leads[bounds] = True
    items = _gather(data, np.where(single, at + 8, at + 40)[take], n[take], 8, leads[take]).copy().view("<f8").ravel()
    counts = total[done]
    item_bounds = np.concatenate(([0], np.cumsum(counts)[:-1]))
    some = counts > 0
    lo, hi = np.zeros(len(counts)), np.zeros(len(counts))
    if some.any():
        lo[some] = np.minimum.reduceat(items, item_bounds[some])
        hi[some] = np.maximum.reduceat(items, item_bounds[some])
    return exact_bytes_per_group(items, counts, lo, hi, k), done


def first_comings(group: np.ndarray, coupons: np.ndarray) -> np.ndarray:
    """Which items are the first of their coupon in their group, in place order (a repeat changes
    no HLL): the items sorted by group, coupon, then place, as one int64 each (a group number and a
    32-bit coupon) sorted stably, and every item after the first of a run dropped."""
    order = np.argsort((group.astype(np.int64) << 32) | coupons.astype(np.int64), kind="stable")
    repeat = np.zeros(len(order), bool)
    repeat[1:] = (group[order][1:] == group[order][:-1]) & (coupons[order][1:] == coupons[order][:-1])
    first = np.ones(len(coupons), bool)
    first[order[repeat]] = False
    return first


def _list_hlls(offsets: np.ndarray, data: np.ndarray, parts, lg_k: int) -> tuple[pa.Array, np.ndarray]:
    """For the groups of several parts whose parts are LIST-mode sketches of `lg_k` (updatable or
    compact) holding fewer than 8 distinct coupons together: the compact LIST of them, as
    DataSketches' union writes it; and which groups those are."""
    rows, sizes = parts
    at, length = offsets[rows], offsets[rows + 1] - offsets[rows]
    head = length >= 8
    h = np.zeros((len(rows), 8), np.uint8)
    h[head] = data[at[head][:, None] + np.arange(8)]
    pre, ser, family, k, lg_arr, flags, count, mode = (h[:, i].astype(np.int64) for i in range(8))
    listed = head & (pre == 2) & (ser == 1) & (family == _HLL_FAMILY) & (k == lg_k) & (lg_arr == _HLL_LIST_LG_ARR) \
        & (mode & 3 == 0)
    updatable = listed & ((flags == 0) | (flags == _HLL_EMPTY)) & (length == 8 + 4 * (1 << _HLL_LIST_LG_ARR))
    compact = listed & (((flags == _HLL_COMPACT | _HLL_EMPTY) & (count == 0) & (length == 8))
                        | ((flags == _HLL_COMPACT) & (count > 0) & (count < 8) & (length == 8 + 4 * count)))
    usable = updatable | compact
    # Every slot of an updatable LIST (empty ones 0, dropped), the first `count` of a compact one.
    slots = np.where(updatable, 1 << _HLL_LIST_LG_ARR, np.where(compact, count, 0))
    group = _groups_of(parts)
    bounds = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    maybe = np.logical_and.reduceat(usable, bounds)
    take = maybe[group]
    coupons = _gather(data, at[take] + 8, slots[take], 4).copy().view("<u4").ravel()
    coupon_group = np.repeat(group[take], slots[take])
    kept = coupons != 0
    coupons, coupon_group = coupons[kept], coupon_group[kept]
    first = first_comings(coupon_group, coupons)
    coupons, coupon_group = coupons[first], coupon_group[first]  # first comings, in the parts' order
    distinct = np.bincount(coupon_group, minlength=len(sizes))
    done = maybe & (distinct < 8)
    mine = done[coupon_group]
    coupons, coupon_group = coupons[mine], coupon_group[mine]
    counts = distinct[done]
    width = 8 + 4 * counts
    out_offsets = np.concatenate(([0], np.cumsum(width))).astype(np.int64)
    out = np.zeros(int(out_offsets[-1]), np.uint8)
    heads = np.zeros((len(counts), 8), np.uint8)
    heads[:] = (2, 1, _HLL_FAMILY, lg_k, _HLL_LIST_LG_ARR, _HLL_COMPACT, 0, _HLL_LIST_HLL8)
    heads[:, 5] = np.where(counts == 0, _HLL_COMPACT | _HLL_EMPTY, _HLL_COMPACT)
    heads[:, 6] = counts
    out[out_offsets[:-1][:, None] + np.arange(8)] = heads
    index = np.cumsum(done) - 1  # a done group's place among them
    slot = np.arange(len(coupons)) - np.concatenate(([0], np.cumsum(counts)[:-1]))[index[coupon_group]]
    dest = out_offsets[index[coupon_group]] + 8 + 4 * slot
    out[dest[:, None] + np.arange(4)] = coupons.astype("<u4").view(np.uint8).reshape(-1, 4)
    return pa.Array.from_buffers(pa.large_binary(), len(counts), [None, pa.py_buffer(out_offsets),
                                                                   pa.py_buffer(out)]), done

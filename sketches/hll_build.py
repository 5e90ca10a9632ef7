"""HLL_8 sketches updated with many items, in order, without one DataSketches call per item.

`hll_sketch(lg_k, HLL_8)` updated item by item costs ~140 ns an item here, nearly all of it the
call; a batch's partials update a few hundred groups' sketches with hundreds of thousands of users
in all. What DataSketches does with them is simple enough to redo from their coupons
(sketches/hll_coupons.py), compiled by Numba, for every group of a batch in one call
(`promoted_hll_bytes`):

- Below HLL mode a sketch holds its distinct coupons (a LIST, then a SET). It leaves them for HLL
  mode when it holds a fixed number of them, found once per lg_k from DataSketches itself
  (`promotion`: 385 at lg_k 12). The buckets it then holds are the maximum per bucket over those
  coupons, whatever their order; KxQ0 the sum of 2^-value over the buckets (exact in any order:
  multiples of 2^-31 below 2^22, up to lg_k 21); the count at the minimum the buckets at 0; and the
  HIP accumulator the coupon set's estimate, which depends on their number alone, so it is the same
  for every sketch of that lg_k and is read from DataSketches' own promoted sketch.
- Each later coupon raises its bucket when its value is higher, and each raise first adds
  k / KxQ0 to the HIP accumulator, then moves KxQ0 by 2^-new - 2^-old; a bucket leaving 0 lowers
  the count at the minimum. That is replayed one coupon after another, in the items' order, as
  DataSketches makes it (a repeat raises nothing: it changes no byte).

A group whose sketch stays below HLL mode, or reaches a bucket of 32 or more (KxQ1's terms: a
chance of 2^-31 an item), is left to DataSketches (`updated_hll_bytes` feeds it the items).
tests/unit/test_hll_build.py pins the bytes to DataSketches' own updates."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
from datasketches import hll_sketch, tgt_hll_type
from numba import njit

from sketches.hll_coupons import KEY_BITS, coupons_of_strings
from sketches.hll_dense import HLL_HEAD, HLL_MODE_HLL8, INVERSE_POWERS

NOT_PROMOTED, BUCKET_OF_32 = -1, -2  # a group's state, where it is no count at the minimum


def promotion_guess(lg_k: int) -> int:
    """Distinct coupons after which a sketch is in HLL mode: below lg_k 8 its LIST of 8 goes straight
    to HLL mode; from 8 a coupon set promotes once it would hold more than 3/4 of 2^(lg_k - 3)
    coupons (385 at lg_k 12)."""
    return 8 if lg_k < 8 else 3 * (1 << (lg_k - 3)) // 4 + 1


@functools.cache
def promotion(lg_k: int) -> tuple[int, bytes]:
    """How many distinct coupons put DataSketches' HLL_8 sketch of `lg_k` in HLL mode, and its
    updatable bytes right then (their header and HIP accumulator are every such sketch's): found by
    feeding it items of distinct coupons, all of them below 32."""
    guess = promotion_guess(lg_k)
    names = pa.array([f"promotion-{i}" for i in range(2 * guess + 64)], pa.string())
    coupons = coupons_of_strings(names)
    _, first = np.unique(coupons, return_index=True)
    usable = [i for i in sorted(first.tolist()) if coupons[i] != 0 and coupons[i] >> KEY_BITS < 32]
    sketch = hll_sketch(lg_k, tgt_hll_type.HLL_8)
    for count, i in enumerate(usable, start=1):
        sketch.update(names[i].as_py())
        if count >= guess - 1:
            blob = sketch.serialize_updatable()
            if blob[7] == HLL_MODE_HLL8:
                if count < guess:
                    raise AssertionError(f"HLL mode before {guess} distinct coupons at lg_k {lg_k}")
                return count, blob
    raise AssertionError(f"no HLL mode after {len(usable)} distinct coupons at lg_k {lg_k}")


def promoted_hll_bytes(coupons: np.ndarray, starts: np.ndarray, ends: np.ndarray, lg_k: int) -> list[bytes | None]:
    """Per group, the updatable bytes of `hll_sketch(lg_k, HLL_8)` updated with the items whose
    coupons are coupons[starts[g]:ends[g]], in that order (0: an item DataSketches ignores, the
    empty string); None where that sketch stays below HLL mode or reaches a bucket of 32 or more."""
    groups = len(starts)
    promote_at, blob = promotion(lg_k)
    head = HLL_HEAD.unpack_from(blob)
    if groups == 0:
        return []
    buckets = np.zeros((groups, 1 << lg_k), np.uint8)
    hip_kxq0 = np.zeros((groups, 2), np.float64)
    at_min = np.zeros(groups, np.int64)
    _replay(np.ascontiguousarray(coupons, np.uint32), np.asarray(starts, np.int64), np.asarray(ends, np.int64),
            lg_k, promote_at, head[8], INVERSE_POWERS, buckets, hip_kxq0, at_min)
    return [None if at_min[g] < 0 else
            HLL_HEAD.pack(*head[:8], hip_kxq0[g, 0], hip_kxq0[g, 1], 0.0, int(at_min[g]), 0) + buckets[g].tobytes()
            for g in range(groups)]


@njit(nogil=True, cache=True)
def _replay(coupons, starts, ends, lg_k, promote_at, promoted_hip, inverse_powers, buckets, hip_kxq0, at_min):
    """Each group's sketch as DataSketches updates it: its distinct coupons gathered until there are
    `promote_at` (an open-addressing set), their buckets' maximum, then the rest replayed one by one.
    at_min[g] is NOT_PROMOTED or BUCKET_OF_32 where the group is left to DataSketches."""
    k = 1 << lg_k
    mask = k - 1
    size = 16
    while size < 2 * promote_at:
        size <<= 1
    seen = np.zeros(size, np.int64)
    for g in range(len(starts)):
        seen[:] = 0
        row = buckets[g]
        count = 0
        i, end = starts[g], ends[g]
        while i < end and count < promote_at:
            coupon = np.int64(coupons[i])
            i += 1
            if coupon == 0:
                continue
            h = coupon & (size - 1)  # a coupon's low bits are a hash's
            while seen[h] != 0 and seen[h] != coupon:
                h = (h + 1) & (size - 1)
            if seen[h] == coupon:
                continue
            seen[h] = coupon
            count += 1
            slot, value = coupon & mask, coupon >> KEY_BITS
            if value > row[slot]:
                row[slot] = value
        if count < promote_at:
            at_min[g] = NOT_PROMOTED
            continue
        kxq0, zeros, big = 0.0, 0, False
        for slot in range(k):
            value = row[slot]
            if value >= 32:
                big = True
            else:
                kxq0 += inverse_powers[value]
            if value == 0:
                zeros += 1
        hip = promoted_hip
        while i < end and not big:
            coupon = np.int64(coupons[i])
            i += 1
            if coupon == 0:
                continue
            slot, value = coupon & mask, coupon >> KEY_BITS
            old = row[slot]
            if value > old:
                if value >= 32:
                    big = True
                    break
                hip += k / kxq0  # before KxQ0 moves, as DataSketches adds it
                kxq0 -= inverse_powers[old]
                kxq0 += inverse_powers[value]
                row[slot] = value
                if old == 0:
                    zeros -= 1
        if big:
            at_min[g] = BUCKET_OF_32
            continue
        hip_kxq0[g, 0] = hip
        hip_kxq0[g, 1] = kxq0
        at_min[g] = zeros


def warm(lg_k: int) -> None:
    """Found and loaded before the first batch needs them: the promotion of `lg_k` (from DataSketches)
    and the compiled replay (from Numba's cache in sketches/__pycache__, ~0.3 s; compiled there
    first where it is not, ~1.5 s)."""
    at = promotion(lg_k)[0]
    promoted_hll_bytes(np.arange(1, at + 1, dtype=np.uint32) | np.uint32(1 << KEY_BITS), np.array([0]),
                       np.array([at]), lg_k)


def updated_hll_bytes(items: pa.Array | Sequence[str], coupons: np.ndarray | None, lg_k: int) -> bytes:
    """The bytes (serialize_updatable) of `hll_sketch(lg_k, HLL_8)` updated with `items` (strings)
    in order; `coupons[i]` is items[i]'s coupon (sketches/hll_coupons.py; None: every item is fed
    to DataSketches)."""
    n = len(items)
    if coupons is not None and n >= promotion(lg_k)[0]:
        blob = promoted_hll_bytes(coupons, np.array([0]), np.array([n]), lg_k)[0]
        if blob is not None:
            return blob
    sketch = hll_sketch(lg_k, tgt_hll_type.HLL_8)
    for item in (items.to_pylist() if isinstance(items, pa.Array) else items):
        sketch.update(item)
    return sketch.serialize_updatable()


__all__ = ["BUCKET_OF_32", "NOT_PROMOTED", "promoted_hll_bytes", "promotion", "promotion_guess",
           "updated_hll_bytes", "warm"]

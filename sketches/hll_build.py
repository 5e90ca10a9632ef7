"""An HLL_8 sketch updated with many items, in order, mostly without one DataSketches call per item.

`hll_sketch(lg_k, HLL_8)` updated item by item costs ~140 ns an item here, nearly all of it the
call; a batch's partials update ~150 groups' sketches with ~240 000 distinct users in all (a batch
of 500 000 events: docs/benchmarks.md, session 76). Once a sketch is in HLL mode (at lg_k 12 from
its 385th distinct coupon), an update is simple enough to replay in numpy: the coupon's bucket
takes its value when that is higher, and each such raise first adds k / (KxQ0 + KxQ1) to the HIP
accumulator, then moves KxQ0 (or KxQ1) by 2^-new - 2^-old; a bucket leaving 0 lowers the count at
the current minimum (0 for HLL_8). So DataSketches is fed the items until its sketch is in HLL
mode (the LIST and SET modes before it, and the promotion, which sets the HIP accumulator to the
set's estimate, stay its own), and the rest are its coupons (sketches/hll_coupons.py) replayed:
which updates raise a bucket by a running maximum per bucket, KxQ0 before each raise by a
cumulative sum (exact: multiples of 2^-31 below 2^22, up to lg_k 21), and the HIP accumulator by a cumulative sum
in the updates' order, one addition after another as DataSketches makes them. A bucket of 32 or more
(KxQ1's terms) leaves the rest to DataSketches too. tests/unit/test_hll_build.py pins the bytes
to DataSketches' own updates."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
from datasketches import hll_sketch, tgt_hll_type

from sketches.hll_coupons import KEY_BITS
from sketches.hll_dense import HLL_HEAD, HLL_MODE_HLL8, HLL_PRE_INTS, INVERSE_POWERS

MIN_REPLAYED = 256  # items after the HLL mode worth replaying (fewer: the numpy steps cost more than the calls)


def promotion_guess(lg_k: int) -> int:
    """Items after which a sketch of distinct items is in HLL mode, collisions apart: a coupon set
    promotes once it would hold more than 3/4 of 2^(lg_k - 3) coupons (385 at lg_k 12)."""
    return max(8, 3 * (1 << max(lg_k - 3, 3)) // 4 + 1)


def replays(items: int, lg_k: int) -> bool:
    """Whether a sketch of this many distinct items would have some replayed (and so needs their coupons)."""
    return items >= promotion_guess(lg_k) + MIN_REPLAYED


def updated_hll_bytes(items: pa.Array | Sequence[str], coupons: np.ndarray | None, lg_k: int) -> bytes:
    """The bytes (serialize_updatable) of `hll_sketch(lg_k, HLL_8)` updated with `items` (strings)
    in order; `coupons[i]` is items[i]'s coupon (sketches/hll_coupons.py; None: every item is fed
    to DataSketches)."""
    sketch = hll_sketch(lg_k, tgt_hll_type.HLL_8)
    n = len(items)

    def feed(lo: int, hi: int) -> int:
        hi = min(n, hi)
        for item in (items.slice(lo, hi - lo).to_pylist() if isinstance(items, pa.Array) else items[lo:hi]):
            sketch.update(item)
        return hi

    if coupons is None:
        feed(0, n)
        return sketch.serialize_updatable()
    fed = feed(0, promotion_guess(lg_k))
    blob = sketch.serialize_updatable()
    while blob[7] != HLL_MODE_HLL8 and n - fed >= MIN_REPLAYED:  # not in HLL mode yet (a collision): a few more
        fed = feed(fed, fed + 32)
        blob = sketch.serialize_updatable()
    replayed = _replayed(blob, coupons[fed:], lg_k) if n - fed >= MIN_REPLAYED and blob[7] == HLL_MODE_HLL8 else None
    if replayed is None:
        feed(fed, n)
        return sketch.serialize_updatable()
    return replayed


def _replayed(blob: bytes, coupons: np.ndarray, lg_k: int) -> bytes | None:
    """An HLL_8 sketch's updatable bytes after the updates of `coupons`, in order; None where a
    bucket would reach 32 or more (or held KxQ1 already)."""
    k = 1 << lg_k
    head = HLL_HEAD.unpack_from(blob)
    pre, _, _, _, _, flags, cur_min, mode, hip, kxq0, kxq1, at_min, aux = head
    if len(blob) != HLL_HEAD.size + k \
            or (pre, flags, cur_min, mode, aux, kxq1) != (HLL_PRE_INTS, 0, 0, HLL_MODE_HLL8, 0, 0.0):
        return None
    buckets = np.frombuffer(blob, np.uint8, k, HLL_HEAD.size).copy()
    coupons = coupons[coupons != 0]  # the empty string's: DataSketches ignores it
    slot = (coupons & np.uint32(k - 1)).astype(np.int64)
    value = (coupons >> np.uint32(KEY_BITS)).astype(np.int64)
    if len(value) and (int(value.max()) >= 32 or int(buckets.max()) >= 32):
        return None
    # Each update's bucket value before it: the stored one, or the highest an earlier update of
    # the same bucket wrote (a running maximum over the updates sorted stably by bucket).
    # Stable, by radix on 16-bit buckets (lg_k up to 16): ~10 times a sort of int64s.
    order = np.argsort(slot.astype(np.uint16) if lg_k <= 16 else slot, kind="stable")
    s, v = slot[order], value[order]
    running = np.maximum.accumulate(s * 64 + v)
    before_in_bucket = np.zeros(len(s), np.int64)
    if len(s) > 1:
        same = s[1:] == s[:-1]
        before_in_bucket[1:] = np.where(same, running[:-1] - s[1:] * 64, 0)
    old_sorted = np.maximum(buckets[s].astype(np.int64), before_in_bucket)
    old = np.empty_like(old_sorted)
    old[order] = old_sorted
    raised = np.flatnonzero(value > old)  # in the updates' order
    old, new = old[raised], value[raised]
    moves = INVERSE_POWERS[new] - INVERSE_POWERS[old]
    kxq_before = kxq0 + np.concatenate(([0.0], np.cumsum(moves)[:-1])) if len(moves) else moves
    hip = float(np.cumsum(np.concatenate(([hip], k / kxq_before)))[-1])  # one addition after another
    kxq0 = float(kxq0 + moves.sum()) if len(moves) else kxq0
    np.maximum.at(buckets, slot[raised], new.astype(np.uint8))
    at_min -= int(np.count_nonzero(old == 0))
    return HLL_HEAD.pack(*head[:8], hip, kxq0, 0.0, at_min, 0) + buckets.tobytes()

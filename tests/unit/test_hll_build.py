"""An HLL_8 sketch's bytes after many updates (sketches/hll_build.py: its promotion to HLL mode and every
update after it redone from the coupons, compiled) against DataSketches' own updates of the same items
in the same order, byte for byte: HIP accumulator, KxQ, the count at the minimum and every bucket."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from datasketches import hll_sketch, tgt_hll_type
from hypothesis import given, settings
from hypothesis import strategies as st

from sketches.hll_build import promoted_hll_bytes, promotion, updated_hll_bytes
from sketches.hll_coupons import coupons_of_strings


def _library(items: list[str], lg_k: int) -> bytes:
    sketch = hll_sketch(lg_k, tgt_hll_type.HLL_8)
    for item in items:
        sketch.update(item)
    return sketch.serialize_updatable()


def _built(items: list[str], lg_k: int) -> bytes:
    return updated_hll_bytes(items, coupons_of_strings(pa.array(items, pa.string())), lg_k)


@settings(max_examples=60, deadline=None)
@given(lg_k=st.integers(4, 13), count=st.integers(0, 5_000), start=st.integers(0, 10**6),
       repeats=st.integers(0, 40), blanks=st.integers(0, 5), seed=st.randoms(use_true_random=False))
def test_the_bytes_are_datasketches_updates(lg_k, count, start, repeats, blanks, seed):
    items = [f"user-{i}" for i in range(start, start + count)]
    items += [seed.choice(items) for _ in range(repeats)] if items else []  # repeats change nothing
    items += [""] * blanks  # DataSketches ignores the empty string
    seed.shuffle(items)
    assert _built(items, lg_k) == _library(items, lg_k)


@pytest.mark.parametrize("lg_k", [4, 7, 8, 11, 12, 14])
def test_past_the_promotion_by_every_margin(lg_k):
    """Right before the HLL mode, at it, one past it and far past it."""
    at = promotion(lg_k)[0]
    for count in (at - 1, at, at + 1, at + 300, at + 3_000):
        items = [f"u{i:05d}" for i in range(count)]
        assert _built(items, lg_k) == _library(items, lg_k), count


@pytest.mark.parametrize("lg_k", range(4, 17))
def test_a_sketch_reaches_hll_mode_at_the_same_count_of_distinct_coupons_whatever_they_are(lg_k):
    """What `promotion` rests on: DataSketches leaves the LIST or SET mode at one number of distinct
    coupons for a lg_k, whichever coupons and in whatever order (repeats of an item change nothing)."""
    at = promotion(lg_k)[0]
    for trial in range(3):
        items = [f"t{trial}-{i}" for i in range(at + 5)]
        items = [x for pair in zip(items, items) for x in pair]  # each twice: repeats on the way
        coupons = coupons_of_strings(pa.array(items, pa.string()))
        sketch, seen = hll_sketch(lg_k, tgt_hll_type.HLL_8), set()
        for item, coupon in zip(items, coupons.tolist()):
            sketch.update(item)
            seen.add(coupon)
            if sketch.serialize_updatable()[7] == 10:  # HLL mode, HLL_8
                break
        assert len(seen) == at, trial


def test_many_groups_at_once_are_each_datasketches_updates_or_left_to_it():
    """`promoted_hll_bytes` over groups of every size in one call: each group's own bytes where it
    reaches HLL mode, None where it stays a LIST or a SET (then DataSketches is fed its items)."""
    lg_k = 10
    at = promotion(lg_k)[0]
    groups = [[f"g{g}-{i % (size // 2 + 1)}" for i in range(size)] + [""] for g, size in
              enumerate((0, 3, at, 2 * at - 1, 2 * at, 2 * at + 2, 5_000))]
    flat = [item for group in groups for item in group]
    ends = np.cumsum([len(group) for group in groups])
    got = promoted_hll_bytes(coupons_of_strings(pa.array(flat, pa.string())), ends - [len(g) for g in groups], ends,
                             lg_k)
    for group, blob in zip(groups, got):
        distinct = len(set(group) - {""})
        assert blob == (_library(group, lg_k) if distinct >= at else None), len(group)


def test_a_demo_sized_group_is_never_fed_to_datasketches(monkeypatch):
    import sketches.hll_build as build

    expected = _library([f"u{i:05d}" for i in range(0, 45_000, 3)], 12)
    promotion(12)  # found once from DataSketches itself, then kept

    def fed(*_):
        raise AssertionError("DataSketches was fed the items")

    monkeypatch.setattr(build, "hll_sketch", fed)
    assert _built([f"u{i:05d}" for i in range(0, 45_000, 3)], 12) == expected


def test_a_bucket_of_32_or_more_is_left_to_datasketches():
    """Its term would belong to KxQ1 (a real item reaches it about once in 2^31: forged coupons),
    before the promotion or after it."""
    at = promotion(12)[0]
    ordinary = [(1 << 26) | (i * 7 + 1) for i in range(at + 300)]

    def built(coupons):
        return promoted_hll_bytes(np.array(coupons, np.uint32), np.array([0]), np.array([len(coupons)]), 12)[0]

    assert built([(31 << 26) | 5] + ordinary) is not None
    assert built(ordinary + [(31 << 26) | 5]) is not None
    for value in (32, 63):
        assert built([(value << 26) | 5] + ordinary) is None
        assert built(ordinary + [(value << 26) | 5]) is None

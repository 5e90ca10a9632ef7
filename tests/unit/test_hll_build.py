"""An HLL_8 sketch's bytes after many updates (sketches/hll_build.py: DataSketches up to its HLL mode,
numpy for the rest) against DataSketches' own updates of the same items in the same order, byte
for byte: HIP accumulator, KxQ, the count at the minimum and every bucket."""

from __future__ import annotations

import pyarrow as pa
import pytest
from datasketches import hll_sketch, tgt_hll_type
from hypothesis import given, settings
from hypothesis import strategies as st

from sketches.hll_build import MIN_REPLAYED, promotion_guess, updated_hll_bytes
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


@pytest.mark.parametrize("lg_k", [4, 8, 11, 12, 14])
def test_past_the_promotion_by_every_margin(lg_k):
    """Right at the HLL mode, just past the point the numpy steps take over, and far past it."""
    guess = promotion_guess(lg_k)
    for count in (guess - 1, guess, guess + MIN_REPLAYED - 1, guess + MIN_REPLAYED, guess + 5 * MIN_REPLAYED):
        items = [f"u{i:05d}" for i in range(count)]
        assert _built(items, lg_k) == _library(items, lg_k), count


def test_a_demo_sized_group_is_replayed_in_numpy(monkeypatch):
    import sketches.hll_build as build

    replayed = []
    real = build._replayed
    monkeypatch.setattr(build, "_replayed", lambda *a: replayed.append(real(*a)) or replayed[-1])
    items = [f"u{i:05d}" for i in range(0, 45_000, 3)]
    assert _built(items, 12) == _library(items, 12)
    assert len(replayed) == 1 and replayed[0] is not None


def test_a_bucket_of_32_or_more_is_left_to_datasketches():
    """Its term would belong to KxQ1 (a real item reaches it about once in 2^31: forged coupons)."""
    import numpy as np

    from sketches.hll_build import _replayed

    sketch = hll_sketch(12, tgt_hll_type.HLL_8)
    for i in range(1_000):
        sketch.update(f"a{i}")
    blob = sketch.serialize_updatable()
    ordinary = [(1 << 26) | i for i in range(300)]
    assert _replayed(blob, np.array([(31 << 26) | 5] + ordinary, np.uint32), 12) is not None
    for value in (32, 63):
        assert _replayed(blob, np.array([(value << 26) | 5] + ordinary, np.uint32), 12) is None

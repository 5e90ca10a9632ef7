"""DataSketches' HLL coupons of many strings at once (sketches/hll_coupons.py) against a DataSketches
sketch of each string alone, whatever the strings' lengths (blocks of 16 bytes, tails of 1 to 15),
characters and slicing; the strings no array step takes (long ones, rare lengths) included."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sketches.hll_coupons import FEW_PER_LENGTH, LONG_KEY, coupons_of_strings, library_coupon

# No lone surrogates: the items are UTF-8 text (Arrow strings).
texts = st.text(st.characters(exclude_categories=("Cs",)), max_size=LONG_KEY + 20)


@settings(max_examples=100, deadline=None)
@given(items=st.lists(texts, max_size=40), cut=st.integers(0, 3))
def test_every_coupon_is_datasketches(items, cut):
    strings = pa.array(items, pa.string())
    strings = strings.slice(min(cut, len(items)), max(0, len(items) - 2 * cut))  # offsets that do not start at 0
    assert coupons_of_strings(strings).tolist() == [library_coupon(s) for s in strings.to_pylist()]


@pytest.mark.parametrize("length", range(0, LONG_KEY + 3))
def test_every_length_through_the_array_steps(length):
    """FEW_PER_LENGTH strings of each length, so each length takes the array steps (or the one by
    one path past LONG_KEY)."""
    items = [(f"{i:03d}" + "x€" * length)[:length] for i in range(FEW_PER_LENGTH + 3)]
    strings = pa.array(items, pa.string())
    assert coupons_of_strings(strings).tolist() == [library_coupon(s) for s in items]


def test_the_empty_string_has_no_coupon():
    assert coupons_of_strings(pa.array([""] * 20 + ["a"])).tolist()[:20] == [0] * 20 == [library_coupon("")] * 20


def test_the_demos_user_ids():
    items = [f"u{i:05d}" for i in range(5_000)]
    assert coupons_of_strings(pa.array(items)).tolist() == [library_coupon(s) for s in items]


def test_nulls_and_other_types_are_refused():
    with pytest.raises(ValueError):
        coupons_of_strings(pa.array(["a", None]))
    with pytest.raises(TypeError):
        coupons_of_strings(pa.array([b"a"], pa.binary()))


def test_leading_zeros_of_every_bit_length():
    """The coupon's value counts h2's leading zeros (at most 62, plus one) whatever its bit length:
    the high word's and the low word's alike, which hashes of real items seldom show."""
    import numpy as np

    from sketches.hll_coupons import _coupons

    h2 = [0, 1, 2, 3] + [1 << b for b in range(2, 64)] + [(1 << b) - 1 for b in range(2, 65)]
    h1 = [(i * 0x9E3779B97F4A7C15) % 2**64 for i in range(len(h2))]
    got = _coupons((np.array(h1, np.uint64), np.array(h2, np.uint64))).tolist()
    want = [((min(64 - b.bit_length(), 62) + 1) << 26) | (a & ((1 << 26) - 1)) for a, b in zip(h1, h2)]
    assert got == want

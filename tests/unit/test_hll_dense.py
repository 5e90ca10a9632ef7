"""The numpy union of HLL-mode HLL_8 sketches (sketches/hll_dense.py) against DataSketches' own
union: the same bytes whenever it answers, an answer wherever two parts or more are all in HLL
mode, and None (DataSketches merges) for the rest. HllSketch.merge_all and merged_bytes, which
take it first, answer as the union does."""

from __future__ import annotations

import struct

import datasketches as ds
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sketches import HllSketch
from sketches.hll_dense import dense_registers, merged_dense_bytes

LG_K = 10  # 1 024 buckets, the least the numpy union takes: HLL mode from 97 distinct items, so examples stay small


def _sketch(first: int, count: int, step: int, *, lg_k: int = LG_K, target=ds.tgt_hll_type.HLL_8,
            updatable: bool = False) -> bytes:
    sketch = ds.hll_sketch(lg_k, target)
    for i in range(first, first + count * step, step):
        sketch.update(f"user-{i}")
    return sketch.serialize_updatable() if updatable else sketch.serialize_compact()


def _union(parts: list, lg_k: int = LG_K) -> bytes:
    union = ds.hll_union(lg_k)
    for part in parts:
        union.update(ds.hll_sketch.deserialize(part))
    return union.get_result(ds.tgt_hll_type.HLL_8).serialize_compact()


def _mode(blob: bytes) -> int:
    return blob[7] & 3  # LIST 0, SET 1, HLL 2


dense = st.builds(_sketch, st.integers(0, 10_000), st.integers(300, 3_000), st.integers(1, 5),
                  updatable=st.booleans())
sketches = st.builds(_sketch, st.integers(0, 10_000), st.one_of(st.integers(0, 30), st.integers(300, 3_000)),
                     st.integers(1, 5), updatable=st.booleans())


@st.composite
def parts(draw) -> list[bytes]:
    """Two to six sketches: HLL mode ones made by updates (in order, with their HIP estimate),
    compact or updatable, sometimes LIST or SET mode ones among them, and maybe a union of two of
    them (out of order where it is in HLL mode), in any order."""
    out = draw(st.lists(draw(st.sampled_from([dense, sketches])), min_size=2, max_size=5))
    if draw(st.booleans()):
        out.append(_union(draw(st.permutations(out))[:2]))
    return draw(st.permutations(out))


@settings(max_examples=300, deadline=None)
@given(parts())
def test_the_union_is_datasketches_to_the_byte(parts):
    got = merged_dense_bytes(parts, LG_K)
    assert (got is not None) == all(_mode(p) == 2 for p in parts)
    want = _union(parts)
    if got is not None:
        assert got == want
        assert ds.hll_sketch.deserialize(got).serialize_compact() == got  # a sketch DataSketches reads as written
    assert HllSketch.merged_bytes(parts, LG_K) == want
    assert HllSketch.merge_all(parts, LG_K).to_bytes() == want


def test_the_modes_are_what_the_examples_say():
    assert _sketch(0, 5, 1)[7] & 3 == 0 and _sketch(0, 15, 1)[7] & 3 == 1 and _sketch(0, 300, 1)[7] & 3 == 2


@pytest.mark.parametrize("lg_k", [11, 14, 17, 21])
def test_every_size_of_sketch(lg_k):
    """Larger lg_k than the examples', up to DataSketches' largest; bytes, bytearray and memoryview."""
    count = 3 * (1 << max(lg_k - 3, 3)) // 4 * 21 // 20  # past the promotion to HLL mode, coupon collisions and all
    parts = [_sketch(0, count, 1, lg_k=lg_k), _sketch(7, count, 3, lg_k=lg_k, updatable=True)]
    parts.append(_union(parts, lg_k))
    assert all(_mode(p) == 2 for p in parts)
    for kind in (bytes, bytearray, memoryview):
        got = merged_dense_bytes([kind(p) for p in parts], lg_k)
        assert got is not None and got == _union(parts, lg_k)


def test_small_sketches_are_left_to_datasketches():
    """Below lg_k 10 DataSketches' whole union costs less than numpy's fixed steps."""
    parts = [_sketch(0, 2_000, 1, lg_k=9), _sketch(3, 2_000, 2, lg_k=9)]
    assert parts[0][7] & 3 == 2 and merged_dense_bytes(parts, 9) is None
    assert HllSketch.merged_bytes(parts, 9) == _union(parts, 9)


def test_a_part_with_every_bucket_0_is_left_to_datasketches():
    """DataSketches skips such a part as empty (the union is then a copy of the other, HIP
    estimate and all): forged bytes, as the library writes an empty sketch in LIST mode."""
    part = _sketch(0, 2_000, 1)
    empty = bytearray(part)
    empty[40:] = bytes(1 << LG_K)
    struct.pack_into("<dddi", empty, 8, 0.0, float(1 << LG_K), 0.0, 1 << LG_K)
    assert merged_dense_bytes([bytes(empty), part], LG_K) is None
    assert HllSketch.merged_bytes([bytes(empty), part], LG_K) == _union([bytes(empty), part])


def test_the_demo_size_merges_in_numpy():
    """lg_k 12, as stored: a stored row (a union) and a batch's fresh sketch."""
    stored = _union([_sketch(0, 30_000, 1, lg_k=12), _sketch(5, 9_000, 3, lg_k=12)], 12)
    fresh = _sketch(7, 2_500, 7, lg_k=12, updatable=True)
    got = merged_dense_bytes([stored, fresh], 12)
    assert got is not None and got == _union([stored, fresh], 12)


def test_a_stored_union_and_a_batchs_dense_sketch():
    """A stored row (a union, out of order) and a batch's fresh sketch (in order, HIP estimate)."""
    stored = _union([_sketch(0, 300, 1), _sketch(9, 300, 3)])
    fresh = _sketch(50_000, 400, 1, updatable=True)
    assert _mode(stored) == _mode(fresh) == 2
    got = merged_dense_bytes([stored, fresh], LG_K)
    assert got is not None and got == _union([stored, fresh]) == merged_dense_bytes([fresh, stored], LG_K)
    assert got != merged_dense_bytes([stored, stored], LG_K)  # the fresh sketch raised buckets
    # A union's HIP accumulator is not read: DataSketches writes 0 after any union of two.
    forged = bytearray(stored)
    struct.pack_into("<d", forged, 8, 123.5)
    assert merged_dense_bytes([bytes(forged), fresh], LG_K) == _union([bytes(forged), fresh]) == got


@pytest.mark.parametrize("other, readable", [
    pytest.param(lambda: _sketch(0, 5, 1), True, id="LIST mode"),
    pytest.param(lambda: _sketch(0, 15, 1), True, id="SET mode"),
    pytest.param(lambda: ds.hll_sketch(LG_K, ds.tgt_hll_type.HLL_8).serialize_compact(), True, id="empty"),
    pytest.param(lambda: _sketch(0, 2_000, 1, target=ds.tgt_hll_type.HLL_4), True, id="HLL_4"),
    pytest.param(lambda: _sketch(0, 2_000, 1, target=ds.tgt_hll_type.HLL_6), True, id="HLL_6"),
    pytest.param(lambda: _sketch(0, 2_000, 1, lg_k=LG_K + 1), False, id="another lg_k"),
    pytest.param(lambda: _sketch(0, 2_000, 1)[:-1], False, id="cut short"),
    pytest.param(lambda: _sketch(0, 15, 1)[:-4], False, id="SET cut short"),
])
def test_any_other_part_is_left_to_datasketches(other, readable):
    part = other()
    stored = _union([_sketch(0, 2_000, 1), _sketch(9, 2_000, 3)])
    for parts in ([_sketch(0, 2_000, 1), part], [part, stored], [stored, _sketch(0, 2_000, 1), part]):
        assert merged_dense_bytes(parts, LG_K) is None
    if readable:  # the merge is still the union's
        assert HllSketch.merged_bytes([_sketch(0, 2_000, 1), part], LG_K) == _union([_sketch(0, 2_000, 1), part])


def test_one_part_is_left_to_datasketches():
    """A union of one sketch is a copy of it, HIP estimate and order kept: not the numpy union's
    out-of-order bytes."""
    part = _sketch(0, 2_000, 1)
    assert merged_dense_bytes([part], LG_K) is None
    assert HllSketch.merged_bytes([part], LG_K) == _union([part])


def test_a_bucket_of_32_or_more_is_left_to_datasketches():
    """Its term would go to KxQ1, whose sum DataSketches makes in its own order."""
    high = bytearray(_sketch(0, 2_000, 1))
    assert dense_registers(bytes(high), LG_K) is not None
    high[-1] = 40
    assert merged_dense_bytes([bytes(high), _sketch(0, 2_000, 1)], LG_K) is None


def test_a_header_it_does_not_know_is_left_to_datasketches():
    for at, value in ((5, 8 | 2), (5, 8 | 32), (7, 2), (6, 1), (0, 2)):
        # read only; full size; HLL_4's mode; a current minimum; LIST's preamble
        part = bytearray(_sketch(0, 2_000, 1))
        part[at] = value
        assert dense_registers(bytes(part), LG_K) is None, (at, value)

"""KllSketch.merge_all starts from its first part (copied or deserialized) instead of merging it
into an empty sketch: the parts are left as they were, and the answer is the one an empty
sketch merged with every part gives (exactly below k items; KLL's compactions are random above)."""

from __future__ import annotations

import random

import datasketches as ds
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sketches import KllSketch

parts = st.lists(st.lists(st.floats(-1e9, 1e9, allow_nan=False), max_size=60), min_size=1, max_size=5)


def sketch_of(values: list[float], k: int = 200) -> KllSketch:
    s = KllSketch(k)
    for v in values:
        s.update(v)
    return s


def merged_from_empty(sketches: list[KllSketch], k: int = 200) -> ds.kll_doubles_sketch:
    out = ds.kll_doubles_sketch(k)
    for s in sketches:
        out.merge(s._sketch)
    return out


@settings(max_examples=100, deadline=None)
@given(values=parts, as_bytes=st.booleans())
def test_merge_all_answers_as_a_merge_into_an_empty_sketch_and_changes_no_part(values, as_bytes):
    sketches = [sketch_of(v) for v in values]
    before = [s.to_bytes() for s in sketches]
    got = KllSketch.merge_all([s.to_bytes() for s in sketches] if as_bytes else sketches)
    expected = merged_from_empty(sketches)
    assert got.n == expected.n and got.k == 200
    ranks = [0.0, 0.1, 0.5, 0.9, 0.99, 1.0]
    if expected.n:
        assert list(got._sketch.get_quantiles(ranks)) == list(expected.get_quantiles(ranks))
    assert [s.to_bytes() for s in sketches] == before
    got.update(1.0)  # the result is a sketch of its own
    assert [s.to_bytes() for s in sketches] == before


def test_a_first_part_of_another_k_is_merged_into_a_sketch_of_the_asked_k():
    got = KllSketch.merge_all([sketch_of([1.0, 2.0], k=100), sketch_of([3.0])])
    assert got.k == 200 and got.n == 3
    assert KllSketch.merge_all([]).is_empty()


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-1e9, 1e9, allow_nan=False), max_size=800), st.floats(0.0, 1.0))
def test_quantile_bounds_are_the_quantiles_fields(values, q):
    s = sketch_of(values)
    est = s.quantile(q)
    got = s.quantile_bounds(q)
    assert got == (None if est is None else (est.value, est.lower, est.upper, est.rank_error))


@pytest.mark.parametrize("seed", range(20))
def test_p0_and_p100_are_the_exact_min_and_max_and_a_range_reaching_an_end_holds_it(seed):
    # A compacted sketch's rank 1 answered the largest value it kept, under the true max, with a
    # range that left the max out (a hunt: stat=p100 under stat=max through the API).
    rng = random.Random(seed)
    values = [rng.random() * 1000 for _ in range(1000)]
    s = KllSketch()
    for v in values:
        s.update(v)
    low, high = s.quantile(0.0), s.quantile(1.0)
    assert (low.value, low.lower) == (min(values), min(values))
    assert (high.value, high.upper) == (max(values), max(values))
    for q in (0.001, 0.5, 0.999):
        est = s.quantile(q)
        assert est.lower <= est.value <= est.upper


@pytest.mark.parametrize("q", [0.0, 0.5, 0.9, 1.0])
def test_a_zero_is_answered_with_one_sign_whichever_order_its_parts_were_merged_in(q):
    # 0.0 and -0.0 compare equal: the sorted view held whichever a merge met first, and a chunk
    # cached apart answered 0.0 where the whole range answered -0.0 (tests/unit/test_chunk_reuse.py).
    answers = {KllSketch.merge_all([sketch_of(a), sketch_of(b)]).quantile_bounds(q)
               for a, b in [([0.0], [-0.0, -0.0]), ([-0.0, -0.0], [0.0]), ([-0.0], [-0.0])]}
    assert [str(v) for answer in answers for v in answer[:3]] == ["0.0"] * 3

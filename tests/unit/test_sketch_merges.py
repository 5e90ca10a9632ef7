"""The sketch merges the map-side Arrow partials use (sketches.kll_exact.merged_sketch_bytes,
sketches.hll_list.merged_sketch_bytes) against DataSketches' own merge of the same parts: the
same bytes where DataSketches is deterministic (an HLL union always; a KLL merge that holds at
most k items), else the same n, min and max and quantiles within the sketch's rank error."""

from __future__ import annotations

from datasketches import hll_sketch, kll_doubles_sketch, tgt_hll_type
from hypothesis import given, settings
from hypothesis import strategies as st

from sketches import HllSketch, KllSketch
from sketches import hll_list, kll_exact

K = 16
floats = st.floats(-1e9, 1e9, allow_nan=False).map(lambda f: f + 0.0)  # no -0.0


def _kll(items: list[float], k: int = K) -> bytes:
    sketch = kll_doubles_sketch(k)
    for x in items:
        sketch.update(x)
    return sketch.serialize()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(floats, max_size=2 * K), min_size=1, max_size=6))
def test_kll_merges_equal_datasketches_merge(parts):
    blobs = [_kll(items) for items in parts]
    merged = kll_exact.merged_sketch_bytes(blobs, K)
    items = sorted(x for p in parts for x in p)
    exact = len(items) <= K and all(len(p) <= K for p in parts)
    if exact:
        assert merged == KllSketch.merge_all(blobs, K).to_bytes()
        return
    sketch = kll_doubles_sketch.deserialize(merged)
    assert sketch.n == len(items) and sketch.k == K
    assert (sketch.get_min_value(), sketch.get_max_value()) == (items[0], items[-1])
    bound = kll_doubles_sketch.get_normalized_rank_error(K, False)
    for q in (0.1, 0.5, 0.9):
        v = sketch.get_quantile(q)
        low = sum(x < v for x in items) / len(items)
        high = sum(x <= v for x in items) / len(items)
        assert low - 3 * bound <= q <= high + 3 * bound


users = st.lists(st.sampled_from([f"u{i}" for i in range(40)] + [""]), max_size=20)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(users, st.booleans()), min_size=1, max_size=6))
def test_hll_unions_write_the_bytes_datasketches_union_writes(parts):
    """Parts in Spark's updatable layout or compact, LIST, SET or HLL mode: the union's bytes."""
    blobs = []
    for items, updatable in parts:
        sketch = hll_sketch(12, tgt_hll_type.HLL_8)
        for u in items:
            sketch.update(u)
        blobs.append(sketch.serialize_updatable() if updatable else sketch.serialize_compact())
    assert hll_list.merged_sketch_bytes(blobs, 12) == HllSketch.merge_all(blobs, 12).to_bytes()

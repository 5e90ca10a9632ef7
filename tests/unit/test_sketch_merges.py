"""Sketch bytes merged per group for many groups at once (sketches/grouped.py, what the map-side
Arrow partials use) against DataSketches' own merge of each group's parts: the same bytes where
DataSketches is deterministic (an HLL union always; a KLL merge holding at most k items), else the
same n, min and max and quantiles within the sketch's rank error; a group of one part its bytes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from datasketches import hll_sketch, kll_doubles_sketch, tgt_hll_type
from hypothesis import given, settings
from hypothesis import strategies as st

from sketches import HllSketch, KllSketch
from sketches.grouped import merged_hlls, merged_klls

K = 16
floats = st.floats(-1e9, 1e9, allow_nan=False).map(lambda f: f + 0.0)  # no -0.0


def _kll(items: list[float], k: int = K) -> bytes:
    sketch = kll_doubles_sketch(k)
    for x in items:
        sketch.update(x)
    return sketch.serialize()


def _groups(parts_per_group: list[list]) -> tuple[list, np.ndarray]:
    """The parts one group after the other, and where each group starts."""
    flat = [p for group in parts_per_group for p in group]
    return flat, np.cumsum([0] + [len(g) for g in parts_per_group[:-1]]).astype(np.int64)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.lists(floats, max_size=2 * K), min_size=1, max_size=5), min_size=1, max_size=6),
       st.sampled_from([pa.binary(), pa.large_binary()]))
def test_kll_groups_merge_as_datasketches_merges_them(groups, binary):
    sketches = [[_kll(items) for items in parts] for parts in groups]  # once: a compaction is random
    flat, starts = _groups(sketches)
    got = merged_klls(pa.array(flat, binary), starts, K)
    assert got.type == binary and len(got) == len(groups)
    for parts, blobs, blob in zip(groups, sketches, got.to_pylist()):
        items = sorted(x for p in parts for x in p)
        if len(parts) == 1 or len(items) <= K and all(len(p) <= K for p in parts):
            assert blob == (blobs[0] if len(parts) == 1 else KllSketch.merge_all(blobs, K).to_bytes())
            continue
        sketch = kll_doubles_sketch.deserialize(blob)
        assert sketch.n == len(items) and sketch.k == K
        assert (sketch.get_min_value(), sketch.get_max_value()) == (items[0], items[-1])
        bound = kll_doubles_sketch.get_normalized_rank_error(K, False)
        for q in (0.1, 0.5, 0.9):
            v = sketch.get_quantile(q)
            low = sum(x < v for x in items) / len(items)
            high = sum(x <= v for x in items) / len(items)
            assert low - 3 * bound <= q <= high + 3 * bound


users = st.lists(st.sampled_from([f"u{i}" for i in range(40)] + [""]), max_size=20)


def _hll(items: list[str], updatable: bool) -> bytes:
    sketch = hll_sketch(12, tgt_hll_type.HLL_8)
    for u in items:
        sketch.update(u)
    return sketch.serialize_updatable() if updatable else sketch.serialize_compact()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(users, st.booleans()), min_size=1, max_size=5), min_size=1, max_size=6))
def test_hll_groups_merge_to_the_bytes_of_datasketches_union(groups):
    """Parts in Spark's updatable layout or compact, LIST, SET or HLL mode."""
    flat, starts = _groups(groups)
    got = merged_hlls(pa.array([_hll(*part) for part in flat], pa.binary()), starts, 12).to_pylist()
    for parts, blob in zip(groups, got):
        blobs = [_hll(*part) for part in parts]
        assert blob == (blobs[0] if len(parts) == 1 else HllSketch.library_union(blobs, 12).to_bytes())


def test_groups_of_one_part_are_returned_as_they_are():
    blobs = pa.array([_kll([1.0]), _kll([2.0, 3.0])], pa.binary())
    assert merged_klls(blobs, np.array([0, 1]), K) is blobs


@given(st.lists(st.text(max_size=6), max_size=300), st.sampled_from([1, 2, 3]))
def test_hll_estimate_bounds_are_the_estimates_fields(users, num_std):
    s = HllSketch()
    for u in users:
        s.update(u)
    est = s.estimate(num_std)
    assert s.estimate_bounds(num_std) == (est.estimate, est.lower, est.upper, est.relative_error)
    assert est.relative_error == abs(hll_sketch.get_rel_err(True, True, s.lg_k, 1))

"""The column-wise tier derivation (store/tier_levels.py, issue 27) equals the row-wise one it
replaced (tests/tier_reference.py): the same tier rows, counts, n, sums, min, max and
revisions identical, sketches holding the same items; and the byte-level merge of small KLLs
(sketches/kll_exact.py) and the union of small HLLs (sketches/hll_list.py) write exactly the
bytes DataSketches writes."""

from __future__ import annotations

import math
import operator

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sketches import HllSketch, KllSketch
from sketches.hll_list import list_coupons, merged_list_bytes
from sketches.kll_exact import exact_items, merged_bytes
from store import PaneData, ValueStats
from store.panes import dims_key
from store.tier_folds import SHARDS, shard
from store.tiers import TierLayout, project, tier_deltas
from tests.tier_reference import tier_deltas_by_row

PANE = 10_000
HOUR = 3_600_000
T0 = 1_700_000_000_000 - 1_700_000_000_000 % 3_600_000
LAYOUT = TierLayout(PANE, 86_400_000, ((60_000, 86_400_000), (3_600_000, 86_400_000)), ("", "a", "a,b", "c"))

values = st.lists(st.one_of(st.integers(-5, 5).map(float), st.floats(-1e6, 1e6, allow_nan=False)), max_size=6)


def _pane(vals: list[float], other: list[float], users: list[str], bounds: bool) -> PaneData:
    stats = {}
    for name, xs in (("v", vals), ("w", other)):
        if xs:
            kll = KllSketch()
            for x in xs:
                kll.update(x)
            stats[name] = ValueStats(len(xs), math.fsum(xs), min(xs) if bounds else None, max(xs), kll.to_bytes())
    distincts = {}
    if users:
        hll = HllSketch()
        for u in users:
            hll.update(u)
        distincts["u"] = hll.to_bytes()
    return PaneData(len(vals) + len(other) or 1, stats, distincts)


pane_rows = st.lists(st.tuples(
    st.integers(-30, 400).map(lambda i: T0 + i * PANE),  # also before T0: floor, not truncation, of the granule
    st.fixed_dictionaries({}, optional={"a": st.sampled_from("xy"), "b": st.sampled_from("pq"), "c": st.just("z")}),
    values, values, st.lists(st.sampled_from(["u1", "u2", "u3", "u4", "u5"]), max_size=3), st.booleans(),
    st.integers(1, 4),
), max_size=60, unique_by=lambda r: (r[0], tuple(sorted(r[1].items()))))


def _sorted_items(blob: bytes | None):
    return None if blob is None else sorted(KllSketch.from_bytes(blob)._sketch.get_quantiles(
        [i / 200 for i in range(201)])) + [KllSketch.from_bytes(blob).n]


@settings(max_examples=80, deadline=None)
@given(pane_rows)
def test_column_wise_deltas_equal_the_row_wise_ones(rows):
    panes = [(start, dims, _pane(v, w, users, bounds), revision) for start, dims, v, w, users, bounds, revision in rows]
    _assert_same(tier_deltas(panes, LAYOUT), tier_deltas_by_row(panes, LAYOUT))


def _assert_same(got: dict, want: dict, sums=operator.eq) -> None:
    assert set(got) == set(want)
    for key, w in want.items():
        g = got[key]
        assert dict(g.dims) == dict(w.dims) and g.revision == w.revision and g.data.count == w.data.count, key
        assert set(g.data.values) == set(w.data.values), key
        for name, wv in w.data.values.items():
            gv = g.data.values[name]
            assert (gv.n, gv.min, gv.max) == (wv.n, wv.min, wv.max) and sums(gv.sum, wv.sum), (key, name)
            assert _sorted_items(gv.kll) == _sorted_items(wv.kll), (key, name)
        assert set(g.data.distincts) == set(w.data.distincts), key
        for name, blob in w.data.distincts.items():
            assert (HllSketch.from_bytes(g.data.distincts[name]).estimate()
                    == HllSketch.from_bytes(blob).estimate()), (key, name)


@settings(max_examples=60, deadline=None)
@given(pane_rows, st.integers(-30, 400).map(lambda i: T0 + i * PANE))
# Every row early: the hour from the panes (1e16 + 2), not from the minutes' rounded sums (1e16 + 1 -> 1e16).
@example([(T0, {}, [1e16], [], [], True, 1), (T0 + PANE, {}, [1.0], [], [], True, 1),
          (T0 + 60_000, {}, [1.0], [], [], True, 1)], T0 + HOUR)
def test_a_split_tier_takes_the_rows_before_the_point_the_others_every_row(rows, point):
    """A folded tier's deltas (store/tier_folds.py: the partials before the fold point) made in the
    same pass as the other tiers', from one root: exactly what a pass over the early panes makes for
    the folded granule, and a pass over every pane for the others; and the row-wise reference's rows."""
    panes = [(start, dims, _pane(v, w, users, bounds), revision) for start, dims, v, w, users, bounds, revision in rows]
    early = [p for p in panes if p[0] < point]
    got = tier_deltas(panes, LAYOUT, split=((HOUR,), point))
    two_passes = tier_deltas(panes, LAYOUT, {PANE, 60_000})
    two_passes.update(tier_deltas(early, LAYOUT, {HOUR}))
    _assert_same(got, two_passes)
    # The reference makes an hour from the minutes, the split from the early panes or hour levels of
    # them: sums of other roundings (the last bit), the rest the same.
    want = {key: w for key, w in tier_deltas_by_row(panes, LAYOUT).items() if key.granule_ms != HOUR}
    want.update((key, w) for key, w in tier_deltas_by_row(early, LAYOUT).items() if key.granule_ms == HOUR)
    _assert_same(got, want, sums=lambda a, b: math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-9))


@settings(max_examples=40, deadline=None)
@given(pane_rows, st.lists(st.integers(-30, 400).map(lambda i: T0 + i * PANE), min_size=SHARDS, max_size=SHARDS))
def test_a_split_tier_takes_each_combinations_rows_before_its_shards_point(rows, points):
    """The shards' points (store/tier_folds.py): each row is early by its combination's shard's
    point; the one pass is exactly the two passes over those early rows and over every row."""
    panes = [(start, dims, _pane(v, w, users, bounds), revision) for start, dims, v, w, users, bounds, revision in rows]
    early = [p for p in panes if p[0] < points[shard(dims_key(p[1]))]]
    got = tier_deltas(panes, LAYOUT, split=((HOUR,), tuple(points)))
    two_passes = tier_deltas(panes, LAYOUT, {PANE, 60_000})
    if early:
        two_passes.update(tier_deltas(early, LAYOUT, {HOUR}))
    _assert_same(got, two_passes)


def test_no_rows_no_deltas():
    assert tier_deltas([], LAYOUT) == {}


many_values = st.lists(st.integers(-1000, 1000).map(float), min_size=20, max_size=80)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40).map(lambda i: T0 + i * PANE), st.sampled_from("xy"), many_values,
                          st.booleans()), min_size=1, max_size=30, unique_by=lambda r: (r[0], r[1])))
def test_groups_that_compact_keep_n_bounds_and_their_quantiles_within_the_rank_error(rows):
    # Tier rows of more than k = 200 items: their parts in exact mode go into DataSketches as
    # items (an update), others as sketches (a merge); compaction is random, so the sketch
    # is pinned by what KLL guarantees: n, min and max exact, each quantile within its rank error.
    panes = []
    for start, a, xs, other_k in rows:
        pane = _pane(xs, [], [], True)
        if other_k:  # a part DataSketches must merge (not in exact mode at k = 200)
            kll = KllSketch(k=100)
            for x in xs:
                kll.update(x)
            pane = PaneData(pane.count, {"v": ValueStats(len(xs), math.fsum(xs), min(xs), max(xs), kll.to_bytes())})
        panes.append((start, {"a": a}, pane, 1))
    got = tier_deltas(panes, LAYOUT)
    want = tier_deltas_by_row(panes, LAYOUT)
    assert set(got) == set(want)
    items: dict = {}
    for start, a, xs, _ in rows:
        for key in got:
            if key.start_ms <= start < key.start_ms + key.granule_ms and key.dims == dims_key(project({"a": a}, key.proj)):
                items.setdefault(key, []).extend(xs)
    for key, w in want.items():
        gv, wv = got[key].data.values["v"], w.data.values["v"]
        assert (gv.n, gv.sum, gv.min, gv.max) == (wv.n, wv.sum, wv.min, wv.max), key
        sketch = KllSketch.from_bytes(gv.kll)._sketch
        xs = np.sort(items[key])
        assert (sketch.n, sketch.get_min_value(), sketch.get_max_value()) == (len(xs), xs[0], xs[-1]), key
        eps = sketch.normalized_rank_error(False)
        for q in (0.1, 0.5, 0.9, 0.99):
            value = sketch.get_quantile(q)
            below, upto = np.searchsorted(xs, value, "left") / len(xs), np.searchsorted(xs, value, "right") / len(xs)
            assert below - 2 * eps <= q <= upto + 2 * eps, (key, q)


def _kll(xs) -> bytes:
    kll = KllSketch()
    for x in xs:
        kll.update(x)
    return kll.to_bytes()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.floats(-1e9, 1e9, allow_nan=False), max_size=90), min_size=1, max_size=5))
def test_small_kll_merges_write_the_bytes_datasketches_writes(parts):
    blobs = [_kll(xs) for xs in parts]
    merged = merged_bytes(blobs, 200)
    if sum(len(xs) for xs in parts) > 200:
        assert merged is None  # DataSketches would compact (randomly): left to it
    else:
        assert merged == KllSketch.merge_all(blobs).to_bytes()


def test_sketches_in_estimation_mode_or_of_another_k_are_left_to_datasketches():
    big = _kll(range(500))
    assert exact_items(big, 200) is None and merged_bytes([big, _kll([1.0])], 200) is None
    other_k = KllSketch(k=100)
    other_k.update(1.0)
    assert merged_bytes([other_k.to_bytes(), _kll([2.0])], 200) is None
    assert merged_bytes([b"\x00" * 7, _kll([2.0])], 200) is None


def _hll(users) -> bytes:
    hll = HllSketch()
    for u in users:
        hll.update(u)
    return hll.to_bytes()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.sampled_from([f"u{i}" for i in range(12)]), max_size=9), min_size=1, max_size=5))
def test_small_hll_unions_write_the_bytes_datasketches_writes(parts):
    blobs = [_hll(users) for users in parts]
    merged = merged_list_bytes(blobs, 12)
    if len({u for users in parts for u in users}) >= 8:
        assert merged is None  # a SET or HLL sketch: left to DataSketches
    else:
        assert merged == HllSketch.library_union(blobs).to_bytes()


def test_hll_lists_in_the_updatable_layout_spark_writes_are_read():
    # Spark's hll_sketch_agg of u0, u1, u2 (lg_k 12): a LIST with all 8 slots, empty ones 0.
    compact = _hll(["u0", "u1", "u2"])
    coupons = list_coupons(compact, 12)
    updatable = bytes([2, 1, 7, 12, 3, 0, 3, 8]) + b"".join(c.to_bytes(4, "little") for c in coupons) + bytes(20)
    assert list_coupons(updatable, 12) == coupons
    assert merged_list_bytes([updatable, _hll(["u3"])], 12) == HllSketch.merge_all([compact, _hll(["u3"])]).to_bytes()
    assert list_coupons(_hll([f"u{i}" for i in range(30)]), 12) is None


def test_the_collector_is_paused_during_a_commit_and_restored_by_the_last_one_out(tmp_path):
    import gc
    import threading

    from store import BatchCommit, PanePartial, SqlitePaneStore
    from store.gc_pause import paused_gc

    seen = []

    class Watching(SqlitePaneStore):
        def _commit_locked(self, *args):
            seen.append(gc.isenabled())
            return super()._commit_locked(*args)

    assert gc.isenabled()
    store = Watching(tmp_path / "s.db", synchronous="OFF")
    partial = PanePartial("s", T0, T0 + PANE, {"a": "x"}, _pane([1.0], [], [], True))
    store.commit_batch(BatchCommit("main", 0, [partial], 1, {"s": T0}, {}), lateness_ms={}, now_ms=T0)
    store.close()
    assert seen == [False] and gc.isenabled()
    inside, release = threading.Event(), threading.Event()

    def other():
        with paused_gc():
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    thread.start()
    inside.wait(10)
    with paused_gc():
        assert not gc.isenabled()
    assert not gc.isenabled()  # the other thread still commits
    release.set()
    thread.join()
    assert gc.isenabled()
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()  # left as it was found
    finally:
        gc.enable()


def test_holders_that_overlap_for_longer_than_the_limit_get_a_collection_when_one_leaves(monkeypatch):
    import gc

    from store import gc_pause

    now = [0.0]
    collected = []
    monkeypatch.setattr(gc_pause.gc, "collect", lambda *a: collected.append(now[0]) or 0)
    clock = lambda: now[0]  # noqa: E731
    first = gc_pause.paused_gc(clock)
    first.__enter__()
    with gc_pause.paused_gc(clock):  # a second pipeline's batch, within the limit: nothing
        now[0] = 10.0
    assert collected == [] and not gc.isenabled()
    with gc_pause.paused_gc(clock):  # overlapping on past the limit: the one leaving collects
        now[0] = gc_pause.MAX_PAUSE_S + 1
    assert collected == [gc_pause.MAX_PAUSE_S + 1] and not gc.isenabled()
    first.__exit__(None, None, None)
    assert gc.isenabled() and collected == [gc_pause.MAX_PAUSE_S + 1]  # the last one out enables it

"""The column-wise tier derivation (store/tier_levels.py, issue 27) equals the row-wise one it
replaced (tests/tier_reference.py): the same tier rows, counts, n, sums, min, max and
revisions identical, sketches holding the same items; and the byte-level merge of small KLLs
(sketches/kll_exact.py) and the union of small HLLs (sketches/hll_list.py) write exactly the
bytes DataSketches writes."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from sketches import HllSketch, KllSketch
from sketches.hll_list import list_coupons, merged_list_bytes
from sketches.kll_exact import exact_items, merged_bytes
from store import PaneData, ValueStats
from store.tiers import TierLayout, tier_deltas
from tests.tier_reference import tier_deltas_by_row

PANE = 10_000
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
    got = tier_deltas(panes, LAYOUT)
    want = tier_deltas_by_row(panes, LAYOUT)
    assert set(got) == set(want)
    for key, w in want.items():
        g = got[key]
        assert dict(g.dims) == dict(w.dims) and g.revision == w.revision and g.data.count == w.data.count, key
        assert set(g.data.values) == set(w.data.values), key
        for name, wv in w.data.values.items():
            gv = g.data.values[name]
            assert (gv.n, gv.sum, gv.min, gv.max) == (wv.n, wv.sum, wv.min, wv.max), (key, name)
            assert _sorted_items(gv.kll) == _sorted_items(wv.kll), (key, name)
        assert set(g.data.distincts) == set(w.data.distincts), key
        for name, blob in w.data.distincts.items():
            assert (HllSketch.from_bytes(g.data.distincts[name]).estimate()
                    == HllSketch.from_bytes(blob).estimate()), (key, name)


def test_no_rows_no_deltas():
    assert tier_deltas([], LAYOUT) == {}


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
        assert merged == HllSketch.merge_all(blobs).to_bytes()


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

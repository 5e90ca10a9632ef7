"""A sketch stat's cold read (issue 27): the stores read each row's one sketch as a SketchRow
(no Pane built, the other sketches skipped), and the roll-up of SketchRows answers exactly what
the roll-up of the same rows as Panes answers, value, bounds, count, final and revision alike.

Written against the PaneStore interface, so PostgreSQL runs them too."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from store import PaneStore
from store.point_cache import PointCache
from store.row_codec import HLL, KLL, encode_sketches, sketch_of, unpack_sketches
from store.rollup import RollupError, SketchRow, rollup, rollup_sketch_rows
from tests.unit.test_tiers import LAYOUT, PANE, T0, answer, batches, commit_all, store_at

names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8)
blobs = st.binary(max_size=300)


@given(st.dictionaries(st.tuples(names, st.sampled_from([KLL, HLL])), blobs, max_size=6),
       names, st.sampled_from([KLL, HLL]))
def test_one_sketch_is_found_in_a_rows_blob_as_unpacking_finds_it(sketches, name, kind):
    blob = encode_sketches([(n, k, b) for (n, k), b in sketches.items()])
    unpacked = {(n, k): b for n, k, b in unpack_sketches(blob)}
    assert sketch_of(blob, name, kind) == unpacked.get((name, kind))
    for (n, k), b in sketches.items():
        assert sketch_of(memoryview(blob), n, k) == b  # as psycopg may hand it


def test_a_row_without_sketches_or_of_another_version():
    assert sketch_of(None, "v", KLL) is None
    assert sketch_of(b"\x01", "v", KLL) is None
    with pytest.raises(ValueError, match="version 2"):
        sketch_of(b"\x02k", "v", KLL)


# Every table a sketch stat may read: the panes (pane granule, all dimensions) and the tier rows.
READS = [(PANE, "*"), (60_000, ""), (60_000, "a"), (60_000, "a,b"), (600_000, ""), (600_000, "a,b")]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=batches, lo=st.integers(-6, 3 * 360), span=st.integers(1, 3 * 360))
def test_the_stores_read_the_sketch_rows_that_read_tier_gives(store_backend, batches, lo, span):
    store = store_at(store_backend, LAYOUT)
    commit_all(store, batches)
    start, end = T0 + lo * PANE, T0 + (lo + span) * PANE
    for granule, proj in READS:
        for field, kind in (("v", KLL), ("u", HLL), ("nothing", KLL)):
            lean = store.read_tier_sketch("s", granule, proj, start, end, field=field, kind=kind, pane_ms=PANE)
            # The interface's default builds them from read_tier: the stores must read the same.
            assert lean == PaneStore.read_tier_sketch(store, "s", granule, proj, start, end, field=field, kind=kind,
                                                      pane_ms=PANE)
            assert all(type(r) is SketchRow for r in lean)
            assert [r.start_ms for r in lean] == sorted(r.start_ms for r in lean)
            assert all(r.sketch is None for r in lean) or field != "nothing"


@st.composite
def sketch_queries(draw):
    step = draw(st.sampled_from([PANE, 60_000, 120_000, 600_000]))
    window = step * draw(st.sampled_from([1, 1, 2, 3, 6])) + PANE * draw(st.sampled_from([0, 0, 1, 3]))
    start = T0 + step * draw(st.integers(-2, 3 * 3_600_000 // step))
    start -= start % step
    return dict(stat=draw(st.sampled_from(["p90", "p0", "p100", "distinct"])), start=start,
                end=start + step * draw(st.integers(1, 40)), step=step, window=window,
                group_by=draw(st.lists(st.sampled_from("abc"), unique=True, max_size=2)),
                filters=draw(st.dictionaries(st.sampled_from("abc"), st.sampled_from("xypqrmn"), max_size=1)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=batches, asked=st.lists(sketch_queries(), min_size=1, max_size=4), watermark=st.booleans())
def test_rolling_up_sketch_rows_answers_what_rolling_up_their_panes_does(tmp_path_factory, batches, asked,
                                                                         watermark):
    from tests.store_backends import SqliteBackend

    backend = SqliteBackend(lambda: tmp_path_factory.mktemp("store"))
    try:
        store = store_at(backend, LAYOUT)
        commit_all(store, batches)
        mark = store.watermarks().get("s") if watermark else None
        for q in asked:
            quantile = {"p90": 0.9, "p0": 0.0, "p100": 1.0}.get(q["stat"])
            field, kind = ("u", HLL) if q["stat"] == "distinct" else ("v", KLL)
            span_end = q["start"] + ((q["end"] - q["start"] - 1) // q["step"]) * q["step"] + q["window"]
            panes = store.read_panes("s", q["start"], span_end, value_field="v", distinct_field="u", with_sketches=True)
            rows = store.read_tier_sketch("s", PANE, "*", q["start"], span_end, field=field, kind=kind, pane_ms=PANE)
            args = dict(stat=q["stat"], quantile=quantile, value_field="v", distinct_field="u", start_ms=q["start"],
                        end_ms=q["end"], step_ms=q["step"], window_ms=q["window"], pane_ms=PANE,
                        group_by=q["group_by"], filters=q["filters"], watermark_ms=mark)
            # These sketches hold fewer than k items (KLL) and few keys (HLL), so merging the same
            # sketches in the same order gives the same bytes: the points must be equal, bounds too.
            assert rollup_sketch_rows(rows, **args) == rollup(panes, **args)
    finally:
        backend.close()


def test_sketch_rows_refuse_what_the_roll_up_refuses():
    args = dict(quantile=None, value_field="v", distinct_field=None, start_ms=0, end_ms=60_000, step_ms=60_000,
                window_ms=None, pane_ms=PANE)
    with pytest.raises(RollupError, match="summed by the store"):
        rollup_sketch_rows([], stat="count", **args)
    with pytest.raises(RollupError, match="distinct field"):
        rollup_sketch_rows([], stat="distinct", **args)
    with pytest.raises(RollupError, match="unknown stat"):
        rollup_sketch_rows([], stat="median", **args)


AN_HOUR = [(T0 + i * 7_000, {"a": "xy"[i % 2], "b": "pqr"[i % 3], "c": "mn"[i % 2]}, float(i % 97), f"u{i % 40}")
           for i in range(514)]
LATER = [(T0 + 4 * 3_600_000, {"a": "x", "b": "p", "c": "m"}, 1.0, "u1")]  # makes the first hour's windows final
in_the_hour = st.tuples(st.integers(T0, T0 + 3_600_000 - 1),
                        st.fixed_dictionaries({"a": st.sampled_from("xy"), "b": st.sampled_from("pqr"),
                                               "c": st.sampled_from("mn")}),
                        st.floats(-1e3, 1e3, allow_nan=False), st.sampled_from([f"u{i}" for i in range(40)]))


@st.composite
def hour_queries(draw):
    step = draw(st.sampled_from([PANE, 60_000, 120_000, 600_000]))
    window = step * draw(st.sampled_from([1, 2, 6])) + PANE * draw(st.sampled_from([0, 0, 1]))
    start = T0 + step * draw(st.integers(-2, 3_600_000 // step))
    return dict(stat=draw(st.sampled_from(["p90", "distinct"])), start=start, end=start + step * draw(st.integers(1, 40)),
                step=step, window=window, group_by=draw(st.lists(st.sampled_from("abc"), unique=True, max_size=2)),
                filters=draw(st.sampled_from([{}, {}, {"a": "x"}, {"b": "q"}])))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stragglers=st.lists(st.lists(in_the_hour, min_size=1, max_size=10), max_size=4),
       asked=st.lists(hour_queries(), min_size=1, max_size=4))
# Windows of only a provisional point (the later event's, past the watermark): the shape is held.
@example(stragglers=[], asked=[dict(stat="p90", start=T0 + 3_600_000, end=T0 + 27_600_000, step=600_000,
                                    window=600_000, group_by=[], filters={})])
def test_a_cold_querys_points_are_found_by_the_next_query(store_backend, stragglers, asked):
    """A cold query (no point of its shape kept) reads its rows once and fingerprints its windows
    from them; the next query fingerprints them from the store's sums. Both must agree (events,
    rows, newest batch, highest revision), or every point computed cold is computed again."""
    store = store_at(store_backend, LAYOUT)
    try:
        commit_all(store, [AN_HOUR, *stragglers, LATER])  # stragglers: newer batches and revisions
        for q in asked:
            cache = PointCache()
            cold = answer(store, **q, cache=cache)
            assert cache.hits == cache.misses == 0  # nothing looked up: every window computed from its rows
            # Windows without a row are made as asked, never looked up (store/series.py _fill_empty).
            final = sum(p.final and p.count > 0 for s in cold for p in s.points)
            provisional = sum(not p.final and p.count > 0 for s in cold for p in s.points)
            assert answer(store, **q, cache=cache) == cold
            # Every window with a row is looked up: the final ones found as kept points (hits), the
            # provisional ones missed as such and found among the provisional points (the same
            # batch, the same watermark: store/point_cache.py). A shape of only provisional points is
            # held too (session 70); one with no point at all is cold again: nothing looked up.
            assert (cache.hits, cache.misses, cache.provisional_hits) == (final, provisional, provisional)
    finally:
        store.close()


@pytest.mark.parametrize("stat", ["p90", "distinct"])
@pytest.mark.parametrize("step, window", [(PANE, 60_000 + PANE), (60_000, 60_000 + PANE), (60_000, 360_000 + PANE)])
def test_a_cold_window_over_two_tiers_is_found_by_the_next_query(store_backend, stat, step, window):
    """A window of whole minutes and one more pane reads a 1-minute tier's segment and a pane
    segment into the same bucket: the cold fingerprint must sum them as the store's sums do
    (per segment), not take one newest batch over both, or the point is computed again."""
    store = store_at(store_backend, LAYOUT)
    try:
        commit_all(store, [AN_HOUR, LATER])
        cache = PointCache()
        q = dict(stat=stat, start=T0, end=T0 + step, step=step, window=window, group_by=[], filters={})
        cold = answer(store, **q, cache=cache)
        assert [p.final for s in cold for p in s.points] == [True]
        assert answer(store, **q, cache=cache) == cold
        assert (cache.hits, cache.misses) == (1, 0)
    finally:
        store.close()


def test_a_cold_query_reads_each_row_once(store_backend):
    store = store_at(store_backend, LAYOUT)
    commit_all(store, [[(T0 + i * 7_000, {"a": "x", "b": "p", "c": "m"}, float(i), "u1") for i in range(600)]])
    sums, reads = [], []
    store.aggregate_tier = _counting(store.aggregate_tier, sums)
    store.read_tier_sketch = _counting(store.read_tier_sketch, reads)
    q = dict(stat="p90", start=T0, end=T0 + 3_600_000, step=60_000, window=600_000)
    cache = PointCache()
    answer(store, **q, cache=cache)
    assert (len(sums), len(reads)) == (0, 1)  # the 1-minute rows, once; no sums read for fingerprints
    answer(store, **q, cache=cache)
    # Warm: the sums say nothing changed, no row read (one sum for the final windows' chunk,
    # store/series.py _chunk_validities, one for their fingerprints).
    assert (len(sums), len(reads)) == (2, 1)
    answer(store, **q, cache=cache)
    assert (len(sums), len(reads), cache.chunk_hits) == (3, 1, 1)  # the chunk's summary alone: unchanged


def _counting(method, calls):
    def counted(*args, **kwargs):
        calls.append(args)
        return method(*args, **kwargs)
    return counted


def test_the_cache_knows_which_shapes_it_holds_through_evictions_and_clears():
    from store.rollup import Point

    cache = PointCache(max_points=2)
    point = Point(0, 1.0, 1, True, 1, None)
    assert not cache.holds("a")
    cache.put(("a", (), 0), (1, 1, 1, 1), point)
    cache.put(("a", (), 0), (1, 1, 1, 2), point)  # the same key again: still one point of "a"
    cache.put(("b", (), 0), (1, 1, 1, 1), point)
    assert cache.holds("a") and cache.holds("b")
    cache.put(("b", (), 60), (1, 1, 1, 1), point)  # evicts a's only point
    assert not cache.holds("a") and cache.holds("b")
    cache.put(("c", (), 0), (1, 1, 1, 1), point._replace(final=False))  # provisional: not kept
    assert not cache.holds("c")
    cache.clear()
    assert not cache.holds("b")

"""A sketch stat's cold read (issue 27): the stores read each row's one sketch as a SketchRow
(no Pane built, the other sketches skipped), and the roll-up of SketchRows answers exactly what
the roll-up of the same rows as Panes answers, value, bounds, count, final and revision alike.

Written against the PaneStore interface, so PostgreSQL runs them too."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import PaneStore
from store.row_codec import HLL, KLL, encode_sketches, sketch_of, unpack_sketches
from store.rollup import RollupError, SketchRow, rollup, rollup_sketch_rows
from tests.unit.test_tiers import LAYOUT, PANE, T0, batches, commit_all, store_at

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

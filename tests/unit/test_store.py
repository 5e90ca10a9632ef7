"""The serving store's contract: exactly-once batch commits into panes of mergeable sketches,
on every backend (real SQLite files, a real PostgreSQL server: the store_backend fixture)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sketches import HllSketch, KllSketch
from store import (
    BatchCommit,
    Change,
    PaneData,
    PanePartial,
    PaneStore,
    SqlitePaneStore,
    ValueStats,
    dims_key,
)
from store.panes import merge_all

PANE = 10_000
T0 = 1_700_000_000_000  # a pane boundary
LATENESS = {"http": 30_000, "orders": 60_000}


def make_data(values: Sequence[float] = (), users: Sequence[str] = (), count: int | None = None) -> PaneData:
    """One partial as the executors would build it: real KLL and HLL bytes."""
    stats = {}
    if values:
        kll = KllSketch()
        for v in values:
            kll.update(v)
        stats["latency"] = ValueStats(len(values), math.fsum(values), min(values), max(values), kll.to_bytes())
    distincts = {}
    if users:
        hll = HllSketch()
        for u in users:
            hll.update(u)
        distincts["user"] = hll.to_bytes()
    return PaneData(count=len(values) if count is None else count, values=stats, distincts=distincts)


def partial(start: int, dims: dict[str, str], data: PaneData, stream: str = "http") -> PanePartial:
    return PanePartial(stream, start, start + PANE, dims, data)


def commit(batch_id: int, partials: Sequence[PanePartial], *, pipeline: str = "main", max_event: dict | None = None,
           offsets: dict | None = None, events: int | None = None) -> BatchCommit:
    return BatchCommit(
        pipeline=pipeline,
        batch_id=batch_id,
        partials=list(partials),
        events_read=sum(p.data.count for p in partials) if events is None else events,
        max_event_ms=max_event or {},
        end_offsets=offsets or {},
    )


def snapshot(store: PaneStore, backend) -> tuple:
    """Everything observable: panes with sketches, the change feed, watermarks, progress, and every table."""
    panes = store.read_panes("http", 0, 2**62, value_field="latency", distinct_field="user", with_sketches=True)
    panes += store.read_panes("orders", 0, 2**62, value_field="latency", distinct_field="user", with_sketches=True)
    tables = backend.tables(store, ("panes", "changes", "batches", "stream_progress",
                                    "pipeline_offsets"))
    return panes, store.changes_since(0), store.watermarks(), store.progress("main"), tables


@pytest.fixture
def store(store_backend) -> PaneStore:
    return store_backend.create()


# -- first commit -----------------------------------------------------------------------


def test_empty_store(store: PaneStore) -> None:
    assert store.read_panes("http", 0, 2**62) == []
    assert store.changes_since(0) == []
    assert store.watermarks() == {}
    assert store.last_batch_id("main") is None
    progress = store.progress("main")
    assert (progress.last_batch_id, progress.batches, progress.events_read) == (None, 0, 0)
    assert progress.end_offsets == {} and progress.streams == {}


def test_first_commit_creates_panes(store: PaneStore) -> None:
    a = partial(T0, {"endpoint": "/a", "region": "eu"}, make_data([1.0, 2.0, 3.0], ["u1", "u2"]))
    b = partial(T0 + PANE, {"endpoint": "/b", "region": "eu"}, make_data([10.0], ["u3"]))
    result = store.commit_batch(commit(0, [a, b], max_event={"http": T0 + 15_000}), lateness_ms=LATENESS, now_ms=T0 + 20_000)
    assert result.committed
    assert (result.panes_new, result.panes_updated) == (2, 0)
    assert (result.first_change_seq, result.last_change_seq) == (1, 2)
    panes = store.read_panes("http", T0, T0 + 2 * PANE)
    assert [p.key.start_ms for p in panes] == [T0, T0 + PANE]
    first = panes[0]
    assert first.revision == 1
    assert first.end_ms == T0 + PANE
    assert first.last_batch == 0
    assert first.updated_at_ms == T0 + 20_000
    assert first.key.dims == dims_key({"region": "eu", "endpoint": "/a"})
    assert first.key.dims_dict() == {"endpoint": "/a", "region": "eu"}
    assert first.data.count == 3
    stats = first.data.values["latency"]
    assert (stats.n, stats.sum, stats.min, stats.max) == (3, 6.0, 1.0, 3.0)
    assert stats.kll is None  # sketches only when asked
    assert first.data.distincts == {}
    assert store.changes_since(0) == [
        Change(1, "http", T0, first.key.dims, 1, 0, 3, T0 + 20_000),
        Change(2, "http", T0 + PANE, panes[1].key.dims, 1, 0, 1, T0 + 20_000),
    ]
    assert store.changes_since(1) == store.changes_since(0)[1:]
    assert store.changes_since(0, limit=1) == store.changes_since(0)[:1]
    assert store.last_batch_id("main") == 0


def test_read_panes_window_and_sketches(store: PaneStore) -> None:
    partials = [partial(T0 + i * PANE, {"e": "/"}, make_data([float(i)], [f"u{i}"])) for i in range(5)]
    store.commit_batch(commit(0, partials), lateness_ms=LATENESS, now_ms=T0)
    assert [p.key.start_ms for p in store.read_panes("http", T0 + PANE, T0 + 3 * PANE)] == [T0 + PANE, T0 + 2 * PANE]
    assert store.read_panes("http", T0 + 5 * PANE, T0 + 9 * PANE) == []
    assert store.read_panes("orders", 0, 2**62) == []
    with_kll = store.read_panes("http", T0, T0 + PANE, value_field="latency", with_sketches=True)[0]
    assert KllSketch.from_bytes(with_kll.data.values["latency"].kll).n == 1
    assert with_kll.data.distincts == {}
    with_hll = store.read_panes("http", T0, T0 + PANE, distinct_field="user", with_sketches=True)[0]
    assert with_hll.data.values["latency"].kll is None
    assert HllSketch.from_bytes(with_hll.data.distincts["user"]).estimate().estimate == pytest.approx(1.0)


# -- exactly once -----------------------------------------------------------------------


def test_replayed_batch_changes_nothing(store: PaneStore, store_backend) -> None:
    batch = commit(
        7,
        [partial(T0, {"e": "/"}, make_data([1.0, 2.0], ["u1"]))],
        max_event={"http": T0 + 5_000},
        offsets={"http": {0: 2}},
    )
    assert store.commit_batch(batch, lateness_ms=LATENESS, now_ms=T0).committed
    before = snapshot(store, store_backend)
    again = store.commit_batch(batch, lateness_ms=LATENESS, now_ms=T0 + 99_000)
    assert again.committed is False
    assert (again.panes_new, again.panes_updated, again.first_change_seq, again.last_change_seq) == (0, 0, None, None)
    assert snapshot(store, store_backend) == before
    # even with different content: the batch id decides
    other = commit(7, [partial(T0, {"e": "/"}, make_data([50.0], ["u9"]))], max_event={"http": T0 + 90_000})
    assert store.commit_batch(other, lateness_ms=LATENESS, now_ms=T0 + 99_000).committed is False
    assert snapshot(store, store_backend) == before


def test_batch_ids_are_per_pipeline(store: PaneStore) -> None:
    p = [partial(T0, {"e": "/"}, make_data([1.0]))]
    assert store.commit_batch(commit(0, p, pipeline="a"), lateness_ms=LATENESS, now_ms=T0).committed
    assert store.commit_batch(commit(0, p, pipeline="b"), lateness_ms=LATENESS, now_ms=T0).committed
    assert store.read_panes("http", T0, T0 + PANE)[0].data.count == 2
    assert store.last_batch_id("a") == store.last_batch_id("b") == 0
    assert store.last_batch_id("c") is None


def test_replay_after_reopening(store: PaneStore, store_backend) -> None:
    batch = commit(3, [partial(T0, {"e": "/"}, make_data([1.0]))])
    assert store.commit_batch(batch, lateness_ms=LATENESS, now_ms=T0).committed
    store.close()
    store = store_backend.reopen(store)
    assert store.commit_batch(batch, lateness_ms=LATENESS, now_ms=T0).committed is False
    assert store.read_panes("http", T0, T0 + PANE)[0].data.count == 1
    assert store.last_batch_id("main") == 3


# -- merging into stored panes ----------------------------------------------------------


def test_second_batch_merges_a_provisional_pane_without_a_new_revision(store: PaneStore) -> None:
    dims = {"endpoint": "/a"}
    first_values = [5.0, 1.5, 9.0, 2.0]
    second_values = [0.25, 100.0, 7.0]
    users_1 = [f"u{i}" for i in range(100)]
    users_2 = [f"u{i}" for i in range(50, 150)]
    store.commit_batch(commit(0, [partial(T0, dims, make_data(first_values, users_1))]), lateness_ms=LATENESS, now_ms=T0)
    result = store.commit_batch(
        commit(1, [partial(T0, dims, make_data(second_values, users_2)), partial(T0 + PANE, dims, make_data([1.0]))]),
        lateness_ms=LATENESS,
        now_ms=T0 + 1,
    )
    assert result.committed
    assert (result.panes_new, result.panes_updated) == (1, 1)
    assert (result.first_change_seq, result.last_change_seq) == (2, 3)
    pane = store.read_panes("http", T0, T0 + PANE, value_field="latency", distinct_field="user", with_sketches=True)[0]
    assert pane.revision == 1  # no watermark yet: provisional, so no new revision
    assert pane.last_batch == 1
    assert pane.updated_at_ms == T0 + 1
    assert pane.data.count == 7
    stats = pane.data.values["latency"]
    assert stats.n == 7
    assert stats.sum == math.fsum(first_values) + math.fsum(second_values)
    assert (stats.min, stats.max) == (0.25, 100.0)
    kll = KllSketch.from_bytes(stats.kll)
    assert kll.n == 7
    assert kll.quantile(0.0).value == 0.25 and kll.quantile(1.0).value == 100.0
    estimate = HllSketch.from_bytes(pane.data.distincts["user"]).estimate().estimate
    assert estimate == pytest.approx(150, rel=0.02)
    changes = store.changes_since(1)
    assert [(c.start_ms, c.revision, c.batch_id, c.count_added) for c in changes] == [
        (T0, 1, 1, 3),
        (T0 + PANE, 1, 1, 1),
    ]
    # a third batch: still revision 1, still exact
    store.commit_batch(commit(2, [partial(T0, dims, make_data([-1.0]))]), lateness_ms=LATENESS, now_ms=T0 + 2)
    pane = store.read_panes("http", T0, T0 + PANE, value_field="latency", with_sketches=True)[0]
    assert (pane.revision, pane.data.count, pane.data.values["latency"].min) == (1, 8, -1.0)
    assert KllSketch.from_bytes(pane.data.values["latency"].kll).n == 8


def test_dimension_combinations_are_separate_panes(store: PaneStore) -> None:
    parts = [
        partial(T0, {"endpoint": "/a", "region": "eu"}, make_data([1.0])),
        partial(T0, {"region": "eu", "endpoint": "/a"}, make_data([2.0])),  # same combination, other order
        partial(T0, {"endpoint": "/a", "region": "us"}, make_data([3.0])),
        partial(T0, {"endpoint": "/a", "region": ""}, make_data([4.0])),
    ]
    result = store.commit_batch(commit(0, parts), lateness_ms=LATENESS, now_ms=T0)
    panes = {p.key.dims: p for p in store.read_panes("http", T0, T0 + PANE)}
    assert len(panes) == 3
    assert panes[dims_key({"endpoint": "/a", "region": "eu"})].data.count == 2
    assert (result.panes_new, result.panes_updated) == (3, 1)


def test_panes_of_streams_are_separate(store: PaneStore) -> None:
    parts = [partial(T0, {}, make_data([1.0])), partial(T0, {}, make_data([2.0, 3.0]), stream="orders")]
    store.commit_batch(commit(0, parts), lateness_ms=LATENESS, now_ms=T0)
    assert store.read_panes("http", T0, T0 + PANE)[0].data.count == 1
    assert store.read_panes("orders", T0, T0 + PANE)[0].data.count == 2


def test_pane_without_values_merges_with_one_with_values(store: PaneStore) -> None:
    store.commit_batch(commit(0, [partial(T0, {}, make_data(count=4))]), lateness_ms=LATENESS, now_ms=T0)
    store.commit_batch(commit(1, [partial(T0, {}, make_data([2.0, 4.0], ["u"]))]), lateness_ms=LATENESS, now_ms=T0)
    store.commit_batch(commit(2, [partial(T0, {}, make_data(count=1))]), lateness_ms=LATENESS, now_ms=T0)
    pane = store.read_panes("http", T0, T0 + PANE, value_field="latency", distinct_field="user", with_sketches=True)[0]
    assert pane.data.count == 7
    stats = pane.data.values["latency"]
    assert (stats.n, stats.sum, stats.min, stats.max) == (2, 6.0, 2.0, 4.0)
    assert KllSketch.from_bytes(stats.kll).n == 2
    assert "user" in pane.data.distincts


# -- watermarks and progress ------------------------------------------------------------


def test_watermarks_never_go_backwards(store: PaneStore) -> None:
    p = [partial(T0, {}, make_data([1.0]))]
    store.commit_batch(commit(0, p, max_event={"http": T0 + 100_000}), lateness_ms=LATENESS, now_ms=T0)
    assert store.watermarks() == {"http": T0 + 100_000 - 30_000}
    # a later batch whose newest event is older
    store.commit_batch(commit(1, p, max_event={"http": T0 + 50_000}), lateness_ms=LATENESS, now_ms=T0)
    assert store.watermarks() == {"http": T0 + 70_000}
    assert store.progress("main").streams["http"].max_event_ms == T0 + 100_000
    # a batch without events for the stream keeps it
    store.commit_batch(commit(2, [], max_event={"orders": T0 + 90_000}), lateness_ms=LATENESS, now_ms=T0)
    assert store.watermarks() == {"http": T0 + 70_000, "orders": T0 + 30_000}
    # and a newer event moves it on
    store.commit_batch(commit(3, p, max_event={"http": T0 + 200_000}), lateness_ms=LATENESS, now_ms=T0)
    assert store.watermarks()["http"] == T0 + 170_000


def test_stream_with_partials_but_no_max_event_has_no_watermark(store: PaneStore) -> None:
    store.commit_batch(commit(0, [partial(T0, {}, make_data([1.0]))]), lateness_ms=LATENESS, now_ms=T0)
    assert store.watermarks() == {}
    assert store.progress("main").streams["http"].watermark_ms is None
    store.commit_batch(commit(1, [], max_event={"http": T0 + 40_000}), lateness_ms=LATENESS, now_ms=T0)
    assert store.watermarks() == {"http": T0 + 10_000}


def test_lateness_defaults_to_zero(store: PaneStore) -> None:
    store.commit_batch(commit(0, [], max_event={"other": T0}), lateness_ms=LATENESS, now_ms=T0)
    assert store.watermarks() == {"other": T0}


def test_progress(store: PaneStore) -> None:
    store.commit_batch(
        commit(
            0,
            [partial(T0, {"e": "/a"}, make_data([1.0, 2.0])), partial(T0, {"e": "/b"}, make_data([3.0]))],
            max_event={"http": T0 + 9_000},
            offsets={"http": {0: 10, 1: 5}},
            events=4,
        ),
        lateness_ms=LATENESS,
        now_ms=T0 + 1_000,
    )
    store.commit_batch(
        commit(
            1,
            [partial(T0 + PANE, {"e": "/a"}, make_data([4.0])), partial(T0, {}, make_data([5.0]), stream="orders")],
            max_event={"http": T0 + 12_000, "orders": T0 + 1},
            offsets={"http": {1: 8, 2: 3}, "orders": {0: 1}},
            events=2,
        ),
        lateness_ms=LATENESS,
        now_ms=T0 + 2_000,
    )
    progress = store.progress("main")
    assert progress.pipeline == "main"
    assert progress.last_batch_id == 1
    assert progress.last_commit_ms == T0 + 2_000
    assert progress.batches == 2
    assert progress.events_read == 6
    assert progress.end_offsets == {"http": {0: 10, 1: 8, 2: 3}, "orders": {0: 1}}
    http = progress.streams["http"]
    assert (http.watermark_ms, http.max_event_ms, http.events_aggregated, http.panes) == (
        T0 + 12_000 - 30_000, T0 + 12_000, 4, 3,
    )
    orders = progress.streams["orders"]
    assert (orders.watermark_ms, orders.max_event_ms, orders.events_aggregated, orders.panes) == (
        T0 + 1 - 60_000, T0 + 1, 1, 1,
    )
    assert store.progress("other").batches == 0
    assert store.progress("other").end_offsets == {}


def test_progress_without_row_counts_is_the_same_without_the_pane_and_correction_counts(store: PaneStore) -> None:
    """What polls progress (the websocket's pipeline feed every second, lag rounds, /metrics
    scrapes) asks it without the counts of panes and corrections, which read every pane: the
    same answer, with None for those two."""
    store.commit_batch(commit(0, [partial(T0, {"e": "/a"}, make_data([1.0])), partial(T0, {"e": "/b"}, make_data([2.0]))],
                              max_event={"http": T0 + 9_000}, offsets={"http": {0: 2}}),
                       lateness_ms=LATENESS, now_ms=T0 + 1_000)
    counted, light = store.progress("main"), store.progress("main", row_counts=False)
    assert (counted.streams["http"].panes, counted.streams["http"].corrections) == (2, 0)
    assert light == dataclasses.replace(counted, streams={
        name: dataclasses.replace(s, panes=None, corrections=None) for name, s in counted.streams.items()})


def test_counting_the_panes_leaves_the_sqlite_stores_connection_to_the_queries(tmp_path) -> None:
    """GET /api/v1/pipeline counts every pane (~130 ms at a day of 3 M events): on a connection
    of its own, so that the queries sharing the store's connection behind its lock (REST, the
    websocket hub) do not wait for the count. They did, once a second (the pipeline feed's
    poll): a cheap query's p99 was 140 ms under 50 websocket clients, 21 ms without."""
    store = SqlitePaneStore(tmp_path / "store.db", synchronous="OFF")
    store.commit_batch(commit(0, [partial(T0, {"e": "/a"}, make_data([1.0]))], max_event={"http": T0 + 9_000},
                              offsets={"http": {0: 1}}), lateness_ms=LATENESS, now_ms=T0 + 1_000)
    with ThreadPoolExecutor(1) as pool, store._lock:  # a query holds the store's connection meanwhile
        counted = pool.submit(store.progress, "main").result(timeout=10)
    assert (counted.last_batch_id, counted.streams["http"].panes) == (0, 1)
    store.close()
    # That connection is to the store's file as it is: gone (a namespace's folder removed), an
    # error, not an empty database and folder made in its place.
    import shutil
    import sqlite3

    gone = SqlitePaneStore(tmp_path / "ns #1" / "store.db", synchronous="OFF")
    shutil.rmtree(tmp_path / "ns #1")
    with pytest.raises(sqlite3.OperationalError):
        gone.progress("main")
    assert not (tmp_path / "ns #1").exists()
    gone.close()


def test_the_sqlite_stores_connection_caches_a_live_batchs_pages(tmp_path) -> None:
    """The connection commits write through keeps PAGE_CACHE_KIB of pages, not SQLite's 2 000 KiB:
    a live batch's ~1 000 panes and tier rows outgrew that, and were read again between the load and
    the save (store/sqlite.py)."""
    from store.sqlite import PAGE_CACHE_KIB

    store = SqlitePaneStore(tmp_path / "store.db", synchronous="OFF")
    assert store._conn.execute("PRAGMA cache_size").fetchone()[0] == -PAGE_CACHE_KIB
    assert PAGE_CACHE_KIB >= 16 * 1024
    store.close()


def test_corrections_since_a_decision_are_counted_from_the_index(tmp_path) -> None:
    """An alert's `corrections_since` counts a window's corrections published after its decision
    (PaneStore.count_corrections): from the index by pane and time alone, not from the rows with
    their old and new stats (100 entries over a window of 50 000 corrections took ~10 s). A store
    made with the index by pane alone gets the new one when opened."""
    import sqlite3

    path = tmp_path / "store.db"
    SqlitePaneStore(path, synchronous="OFF").close()
    with sqlite3.connect(path) as conn:  # as a store made before it
        conn.execute("DROP INDEX corrections_by_pane_time")
        conn.execute("CREATE INDEX corrections_by_pane ON corrections (stream, pane_start_ms)")
    store = SqlitePaneStore(path, synchronous="OFF")
    asked: list[str] = []
    store._conn.set_trace_callback(asked.append)  # the statement as run, its values in place
    assert store.count_corrections("http", T0, T0 + PANE, T0, {}) == 0
    store._conn.set_trace_callback(None)
    store.close()
    [count] = [sql for sql in asked if "FROM corrections" in sql]
    with sqlite3.connect(path) as conn:
        indexes = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE tbl_name = 'corrections'"
                                                  " AND type = 'index' AND sql IS NOT NULL")}
        plan = " ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + count))
    assert indexes == {"corrections_by_pane_time"}
    assert "COVERING INDEX corrections_by_pane_time" in plan, plan


def test_the_batches_totals_are_kept_by_each_commit_and_made_once_for_a_store_without_them(store: PaneStore) -> None:
    """progress's batch count, events read, last batch id and commit time are summed as batches
    are committed (store/batch_totals.py), not from every batch ever committed at each read (the
    pipeline feed reads them every second). A store whose batches were committed before the sums
    existed, or by a version from before them, reads them from its batches, and its next commit
    makes them from all of them."""
    def batch(i: int, events: int, now_ms: int) -> None:
        assert store.commit_batch(commit(i, [partial(T0, {"e": "/a"}, make_data([1.0] * events))],
                                         max_event={"http": T0 + i}, offsets={"http": {0: i + 1}}),
                                  lateness_ms=LATENESS, now_ms=now_ms).committed

    def totals(pipeline: str = "main") -> tuple:
        p = store.progress(pipeline)
        return (p.last_batch_id, p.last_commit_ms, p.batches, p.events_read,
                store.last_batch_id(pipeline), store.last_commit_ms(pipeline))

    assert totals() == (None, None, 0, 0, None, None)
    batch(0, 2, T0 + 5_000)
    batch(1, 3, T0 + 4_000)  # a clock a second behind: the latest commit time stays the newest
    assert not store.commit_batch(commit(1, [partial(T0, {"e": "/a"}, make_data([9.0]))]), lateness_ms=LATENESS,
                                  now_ms=T0 + 9_000).committed  # a replay adds nothing
    assert totals() == (1, T0 + 5_000, 2, 5, 1, T0 + 5_000)
    db = store.side_db()
    db.execute("DELETE FROM batch_totals")  # as a store from before them
    db.close()
    assert totals() == (1, T0 + 5_000, 2, 5, 1, T0 + 5_000)
    batch(2, 4, T0 + 6_000)
    assert totals() == (2, T0 + 6_000, 3, 9, 2, T0 + 6_000)
    # A Sketchboard from before the totals shares the store (a rolling upgrade): its commit adds a
    # batch and not the totals, which are then read from the batches, and made again by the next commit.
    db = store.side_db()
    db.execute("INSERT INTO batches (pipeline, batch_id, committed_at_ms, events_read, panes_new, panes_updated)"
               " VALUES ('main', 3, ?, 7, 0, 1)", (T0 + 7_000,))
    db.close()
    assert totals() == (3, T0 + 7_000, 4, 16, 3, T0 + 7_000)
    batch(4, 1, T0 + 8_000)
    assert totals() == (4, T0 + 8_000, 5, 17, 4, T0 + 8_000)
    assert totals("other") == (None, None, 0, 0, None, None)


def test_progress_polled_reads_no_table_that_grows_with_the_data(tmp_path) -> None:
    """What the pipeline feed (every second) and each batch with sessions or a join read of the
    progress: nothing that scans the batches ever committed or the panes kept (SQLite's statements)."""
    store = SqlitePaneStore(tmp_path / "store.db", synchronous="OFF")
    for i in range(3):
        store.commit_batch(commit(i, [partial(T0, {"e": "/a"}, make_data([1.0]))], max_event={"http": T0 + i},
                                  offsets={"http": {0: i + 1}}), lateness_ms=LATENESS, now_ms=T0 + i)
    asked: list[str] = []
    store._conn.set_trace_callback(asked.append)
    progress = store.progress("main", row_counts=False)
    store._conn.set_trace_callback(None)
    assert (progress.batches, progress.events_read, progress.last_batch_id) == (3, 3, 2)
    # The newest batch id only (the primary key's last entry), no count or sum over them or the panes.
    assert [sql for sql in asked if "FROM panes" in sql or "FROM batches" in sql and "SELECT MAX(batch_id)" not in sql] == []
    store.close()


def test_progress_is_what_one_commit_left_while_another_process_commits(store: PaneStore, store_backend,
                                                                         monkeypatch) -> None:
    """progress() reads several tables (batches, offsets, the streams' counters): all as one
    commit left them, not the batches of one commit and the streams of the next one, which
    another process committed meanwhile (here between two of its reads)."""
    from store import event_ids

    def batch(i: int) -> BatchCommit:
        return commit(i, [partial(T0, {"e": "/a"}, make_data([1.0] * 5))], max_event={"http": T0 + i},
                      offsets={"http": {0: 5 * (i + 1)}})

    store.commit_batch(batch(0), lateness_ms=LATENESS, now_ms=T0)
    other = store_backend.reopen(store)
    read = event_ids.duplicate_counts  # progress() calls it between its reads, on either backend

    def meanwhile(cursor):
        monkeypatch.setattr(event_ids, "duplicate_counts", read)
        assert other.commit_batch(batch(1), lateness_ms=LATENESS, now_ms=T0 + 1).committed
        return read(cursor)

    monkeypatch.setattr(event_ids, "duplicate_counts", meanwhile)
    progress = store.progress("main")
    http = progress.streams["http"]
    assert (progress.batches, progress.events_read, progress.end_offsets) == (1, 5, {"http": {0: 5}})
    assert (http.max_event_ms, http.events_aggregated) == (T0, 5)
    again = store.progress("main")
    assert (again.batches, again.streams["http"].events_aggregated) == (2, 10)


# -- atomicity --------------------------------------------------------------------------


def test_failed_commit_leaves_the_store_unchanged(store: PaneStore, store_backend) -> None:
    store.commit_batch(
        commit(0, [partial(T0, {"e": "/a"}, make_data([1.0], ["u1"]))], max_event={"http": T0}, offsets={"http": {0: 1}}),
        lateness_ms=LATENESS,
        now_ms=T0,
    )
    before = snapshot(store, store_backend)
    bad = PaneData(count=1, values={"latency": ValueStats(1, 2.0, 2.0, 2.0, b"garbage")})
    batch = commit(
        1,
        [
            partial(T0 + PANE, {"e": "/new"}, make_data([5.0])),  # a new pane, written before the failure
            partial(T0 + 2 * PANE, {"e": "/a"}, make_data([6.0])),
            partial(T0, {"e": "/a"}, bad),  # merging this with the stored KLL fails
        ],
        max_event={"http": T0 + 500_000},
        offsets={"http": {0: 99}},
    )
    with pytest.raises((IndexError, RuntimeError, ValueError)):  # datasketches: "Insufficient buffer size"
        store.commit_batch(batch, lateness_ms=LATENESS, now_ms=T0 + 1)
    assert snapshot(store, store_backend) == before
    assert store.last_batch_id("main") == 0
    # the batch id was not taken: a good retry commits
    good = commit(1, [partial(T0, {"e": "/a"}, make_data([6.0]))], max_event={"http": T0 + 1})
    assert store.commit_batch(good, lateness_ms=LATENESS, now_ms=T0 + 2).committed
    assert store.read_panes("http", T0, T0 + PANE)[0].revision == 1  # still provisional
    assert [c.seq for c in store.changes_since(0)] == [1, 2]  # the rolled-back rows left no trace in the feed


def test_a_commit_refused_by_the_database_leaves_the_store_able_to_commit(store: PaneStore) -> None:
    """A commit that fails inside the database after its panes were written (here an offset past
    64 bits; a lock timeout is the everyday one, retried by aggregates/commit_retry.py) rolls
    back, and the next commits of the same store go through: PostgreSQL's rollback once took
    the commit's staging tables away with it, and every later commit on that connection failed."""
    from store.table_state import TableChange

    refused = dataclasses.replace(commit(0, [partial(T0, {"e": "/a"}, make_data([1.0]))]),
                                  table_changes={"t": {"k": TableChange({"n": 1.0}, T0, 0, 2**63)}})
    with pytest.raises(Exception, match="(?i)too large|out of range"):  # SQLite OverflowError, PostgreSQL DataError
        store.commit_batch(refused, lateness_ms=LATENESS, now_ms=T0)
    assert store.last_batch_id("main") is None
    for batch_id in range(3):  # more than the pool holds connections
        assert store.commit_batch(commit(batch_id, [partial(T0, {"e": "/a"}, make_data([1.0]))]),
                                  lateness_ms=LATENESS, now_ms=T0).committed
    assert store.read_panes("http", T0, T0 + PANE)[0].data.count == 3


# -- merge laws -------------------------------------------------------------------------

part_values = st.lists(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False), min_size=0, max_size=30
)


@st.composite
def parts_and_groupings(draw):
    parts = draw(st.lists(part_values, min_size=1, max_size=6))
    order = draw(st.permutations(range(len(parts))))
    cuts = sorted(draw(st.sets(st.integers(min_value=1, max_value=max(1, len(parts) - 1)), max_size=len(parts))))
    return parts, list(order), [c for c in cuts if c < len(parts)]


@settings(max_examples=60, deadline=None)
@given(parts_and_groupings())
def test_merge_is_order_and_grouping_independent(case) -> None:
    raw_parts, order, cuts = case
    datas = [make_data(values, count=len(values) + 1) for values in raw_parts]
    straight = merge_all(datas)
    permuted = [datas[i] for i in order]
    bounds = [0, *cuts, len(permuted)]
    grouped = merge_all(merge_all(permuted[a:b]) for a, b in zip(bounds, bounds[1:]))
    # right-nested: a.merge(b.merge(c...))
    nested = PaneData(count=0)
    for data in reversed(permuted):
        nested = data.merge(nested)
    everything = [v for values in raw_parts for v in values]
    for merged in (straight, grouped, nested):
        assert merged.count == sum(len(v) + 1 for v in raw_parts)
        if not everything:
            assert merged.values == {}
            continue
        stats = merged.values["latency"]
        assert stats.n == len(everything)
        assert stats.sum == pytest.approx(math.fsum(everything), rel=1e-9, abs=1e-3)
        assert stats.min == min(everything)
        assert stats.max == max(everything)
        assert KllSketch.from_bytes(stats.kll).n == len(everything)

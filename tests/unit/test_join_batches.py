"""A window join's driver side without Spark (aggregates/joins.py): the batch's records as the
pipeline collects them -> the rule with the stored state -> derived pane partials and state in
one store commit -> the query's sums, latency percentiles and the ratio stat (CTR), on SQLite
and PostgreSQL."""

from __future__ import annotations

import pyarrow as pa
import pytest

from aggregates.joins import WindowJoins, with_joins
from alerts.source import StoreAlertData
from catalog import parse_catalog
from query import compute, resolve
from query.model import QueryError
from store import BatchCommit

T0 = 1_700_000_000_000 - 1_700_000_000_000 % 3_600_000
MIN = 60_000
CONFIG = """
streams:
  searches: {key_field: search_id, dimensions: [query_category], allowed_lateness: 30s}
  clicks: {key_field: search_id, dimensions: [position], allowed_lateness: 30s}
joins:
  - name: search_clicks
    left: {stream: searches, key: search_id}
    right: {stream: clicks, key: search_id}
    within: 30m
    late_horizon: 1h
"""


def records(rows) -> pa.Table:
    """(stream, partition, offset, time, dims, ids) as the pipeline collects them."""
    cols = list(zip(*rows)) if rows else [[]] * 6
    return pa.table({"stream": pa.array(cols[0], pa.string()), "partition": pa.array(cols[1], pa.int32()),
                     "offset": pa.array(cols[2], pa.int64()), "event_time": pa.array(cols[3], pa.int64()),
                     "dims": pa.array(cols[4], pa.list_(pa.string())), "ids": pa.array(cols[5], pa.list_(pa.string()))})


def commit(store, joins, batch_id, rows) -> None:
    """One batch: the joined streams' progress (their newest events: the stream-wide watermark
    rule, one partition caught up) and the join's derived partials and state, in one commit."""
    newest: dict[str, int] = {}
    for stream, _, _, t, _, _ in rows:
        newest[stream] = max(newest.get(stream, t), t)
    base = BatchCommit(pipeline="main", batch_id=batch_id, partials=[], events_read=0, max_event_ms=newest)
    c = with_joins(base, joins.join(records(rows), base, now_ms=T0), joins.names)
    lateness = {n: s.allowed_lateness for n, s in joins.catalog.streams.items()}
    assert store.commit_batch(c, lateness_ms=lateness, now_ms=T0).committed


def query(store, catalog, metric, stat, **kw):
    q = resolve(catalog, metric=metric, stats=[stat], start=T0, end=T0 + 3 * 3_600_000, step="1h",
                now_ms=T0 + 10 * 3_600_000, max_points=1000, **kw)
    lo, hi = q.range_at(T0)
    return {tuple(sorted(s.group.items())): {p.t_ms: p for p in s.points}
            for s in compute(store, q, lo, hi, watermark_ms=store.watermarks().get(q.stream), max_points=1000)}


def test_searches_and_clicks_become_pairs_ctr_latency_and_unmatched_exactly_once(store_backend):
    catalog = parse_catalog(CONFIG)
    store = store_backend.create()
    joins = WindowJoins(catalog, store)
    # Batch 0: four searches in two categories; a click on s1 at +2 min; a click before its search (s4).
    commit(store, joins, 0, [("searches", 0, 0, T0, ["books"], ["s1"]), ("searches", 0, 1, T0 + MIN, ["books"], ["s2"]),
                             ("searches", 1, 0, T0 + 2 * MIN, ["toys"], ["s3"]),
                             ("clicks", 0, 0, T0 + 2 * MIN, ["1"], ["s1"]), ("clicks", 0, 1, T0 + 5 * MIN, ["2"], ["s4"])])
    # Batch 1: s4's search comes late; a second click on s1; a click whose search is unknown.
    commit(store, joins, 1, [("searches", 1, 1, T0 + 4 * MIN, ["toys"], ["s4"]),
                             ("clicks", 1, 0, T0 + 10 * MIN, ["1"], ["s1"]), ("clicks", 1, 1, T0 + 11 * MIN, ["1"], ["zz"])])
    # Batch 2: both streams move on 80 min (the searches' panes of the first hour become final).
    commit(store, joins, 2, [("searches", 0, 2, T0 + 80 * MIN, ["books"], ["s5"]),
                             ("clicks", 0, 2, T0 + 80 * MIN, ["1"], ["other"])])
    # Batch 3: a click on s2 after the allowed lateness, within the late horizon: still a pair,
    # merged into its search's final pane as a correction.
    commit(store, joins, 3, [("clicks", 0, 3, T0 + 20 * MIN, ["3"], ["s2"])])
    assert store.join_sizes()["search_clicks"].unmatched_right == 0
    # Batch 4: the clicks' watermark moves 3 h on, the searches' does not: the join's clock
    # waits for the searches (a click-only batch expires nothing).
    commit(store, joins, 4, [("clicks", 1, 2, T0 + 3 * 3_600_000, ["1"], ["later"])])
    assert store.join_sizes()["search_clicks"].left_rows == 5
    assert store.watermarks()["search_clicks"] == T0 + 80 * MIN - 30 * MIN - 30_000  # by the searches only
    # Batch 5: the searches move 3 h on too: what waited expires; the clicks that matched
    # nothing (zz, other) are counted unmatched at their own times, the state is bounded.
    commit(store, joins, 5, [("searches", 1, 2, T0 + 3 * 3_600_000, ["toys"], ["s6"])])
    sizes = store.join_sizes()["search_clicks"]
    assert (sizes.unmatched_right, sizes.left_rows, sizes.pending_right, sizes.pairs) == (2, 1, 1, 4)

    sums = {v: query(store, catalog, f"search_clicks_{v}", "sum", group_by="query_category")
            for v in ("searches", "pairs", "clicked")}
    books, toys = (("query_category", "books"),), (("query_category", "toys"),)
    assert sums["searches"][books][T0].value == 2 and sums["searches"][toys][T0].value == 2
    assert sums["pairs"][books][T0].value == 3 and sums["pairs"][toys][T0].value == 1
    assert sums["clicked"][books][T0].value == 2 and sums["clicked"][toys][T0].value == 1
    ctr = query(store, catalog, "search_clicks_clicked", "ratio", group_by="query_category")
    assert ctr[books][T0].value == 1.0 and ctr[toys][T0].value == 0.5
    assert query(store, catalog, "search_clicks_clicked", "ratio")[()][T0].value == 0.75
    assert query(store, catalog, "search_clicks_clicked", "ratio")[()][T0 + 3_600_000].value == 0.0
    assert query(store, catalog, "search_clicks_clicked", "ratio")[()][T0 + 2 * 3_600_000].value is None  # 0 searches
    assert sums["pairs"][books][T0].revision > 1  # the late pair was a correction
    latency = query(store, catalog, "search_clicks_latency", "max")[()][T0].value
    assert latency == 19 * MIN  # s2's late click
    assert query(store, catalog, "search_clicks_latency", "p50")[()][T0].value in (2 * MIN, MIN, 10 * MIN, 19 * MIN)
    # Alert rules read the same stat through the same query path.
    windows = StoreAlertData(catalog, store).window_values("search_clicks_clicked", "ratio", T0, T0 + 3_600_000,
                                                           ["query_category"], {}, now_ms=T0 + 3 * 3_600_000)
    assert {w.group["query_category"]: w.value for w in windows if w.group["query_category"]} == {
        "books": 1.0, "toys": 0.5}
    unmatched = query(store, catalog, "search_clicks_unmatched_right", "sum")[()]
    assert unmatched[T0].value == 1 and unmatched[T0 + 3_600_000].value == 1  # at the clicks' own times


def test_the_ratio_stat_needs_a_metric_with_ratio_of():
    catalog = parse_catalog(CONFIG)
    with pytest.raises(QueryError, match="no ratio_of"):
        resolve(catalog, metric="search_clicks_pairs", stats=["ratio"], now_ms=T0, max_points=100)
    assert "ratio" in catalog.metric("search_clicks_clicked").stats()


def test_a_lagging_partition_holds_the_joins_clock_so_its_clicks_still_find_their_searches(store_backend):
    """Per-partition watermarks (store/watermarks.py): clicks' partition 0 runs 3 h ahead while
    partition 1 still has unread records; the join's clock waits for partition 1, whose click on
    a search of 3 h earlier is then still a pair (a stream-wide clock would have expired the search)."""
    catalog = parse_catalog(CONFIG)
    store = store_backend.create()
    joins = WindowJoins(catalog, store)
    far = T0 + 3 * 3_600_000

    def batch(batch_id, rows, end_offsets, log_end_offsets):
        newest: dict[str, dict[int, int]] = {"searches": {}, "clicks": {}}
        for stream, partition, _, t, _, _ in rows:
            newest[stream][partition] = max(newest[stream].get(partition, t), t)
        base = BatchCommit(pipeline="main", batch_id=batch_id, partials=[], events_read=0,
                           max_event_ms={s: max(p.values()) for s, p in newest.items() if p},
                           end_offsets=end_offsets, partition_max_event_ms=newest, log_end_offsets=log_end_offsets)
        c = with_joins(base, joins.join(records(rows), base, now_ms=T0), joins.names)
        lateness = {n: s.allowed_lateness for n, s in catalog.streams.items()}
        assert store.commit_batch(c, lateness_ms=lateness, now_ms=T0).committed

    # Both streams' partition 0 move 3 h on; the clicks' partition 1 has 5 records not read yet.
    batch(0, [("searches", 0, 0, T0, ["books"], ["s1"]), ("searches", 0, 1, far, ["toys"], ["s2"]),
              ("clicks", 0, 0, far, ["1"], ["x"])],
          {"searches": {0: 2}, "clicks": {0: 1, 1: 0}}, {"searches": {0: 2}, "clicks": {0: 1, 1: 5}})
    assert store.join_sizes()["search_clicks"].clock_ms is None  # held: partition 1 cannot tell how far it reaches
    # ... and so is the derived stream's watermark: s1's pane may still get its click, so it is
    # not final (the searches alone would have moved it to `far` - lateness - within).
    assert store.watermarks().get("search_clicks") is None
    batch(1, [("clicks", 1, 0, T0 + 5 * MIN, ["1"], ["s1"])],
          {"searches": {0: 2}, "clicks": {0: 1, 1: 1}}, {"searches": {0: 2}, "clicks": {0: 1, 1: 5}})
    sizes = store.join_sizes()["search_clicks"]
    assert (sizes.pairs, sizes.unmatched_right) == (1, 0)
    assert sizes.clock_ms == T0 + 5 * MIN - 30_000  # partition 1's watermark: it still has unread records
    assert store.watermarks()["search_clicks"] == sizes.clock_ms - 30 * MIN  # the clock - within
    ctr = query(store, catalog, "search_clicks_clicked", "ratio", group_by="query_category")
    assert ctr[(("query_category", "books"),)][T0].value == 1.0
    pairs = query(store, catalog, "search_clicks_pairs", "sum")[()][T0]
    assert (pairs.value, pairs.final, pairs.revision) == (1, False, 1)  # its pair came in time: no correction


def test_records_without_the_join_key_pair_with_nothing(store_backend):
    """A join keyed on a dimension: a missing dimension is stored as "", and "" is no key, so
    searches and clicks without one pair with nothing (not every one with every other)."""
    catalog = parse_catalog(CONFIG.replace("key: search_id}", "key: query_category}")
                            .replace("dimensions: [position]", "dimensions: [position, query_category]"))
    store = store_backend.create()
    joins = WindowJoins(catalog, store)
    rows = ([("searches", 0, i, T0 + i, [""], [f"s{i}"]) for i in range(3)]
            + [("clicks", 0, i, T0 + 1000 + i, ["1", ""], [f"c{i}"]) for i in range(3)])
    base = BatchCommit(pipeline="main", batch_id=0, partials=[], events_read=0,
                       max_event_ms={"searches": T0 + 2, "clicks": T0 + 1002})
    out = joins.join(records(rows), base, now_ms=T0)
    assert (out.pairs, out.unmatched_right) == (0, 3)

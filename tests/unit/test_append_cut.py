"""Batches cut at one log append time (ingest/append_cut.py), against a brute-force reference that
lists every record's append time. Pure: no log, no Spark."""

from __future__ import annotations

from itertools import accumulate

from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.append_cut import cut_end_offsets, cut_group, share


def end_at_of(times: dict, starts: dict):
    """The log's answer from every record's append time ({key: [time of start, start+1, ...]})."""
    rising = {k: list(accumulate(ts, max)) for k, ts in times.items()}

    def end_at(cut: int) -> dict:
        return {k: next((starts[k] + i for i, t in enumerate(ts) if t > cut), None) for k, ts in rising.items()}

    return end_at


def reference(times: dict, starts: dict, max_rows: int, first=()) -> dict:
    """Brute force: the latest cut among the records' own (rising) times that keeps the batch
    within max_rows; the earliest time split when it alone is more."""
    rising = {k: list(accumulate(ts, max)) for k, ts in times.items()}
    total = sum(len(ts) for ts in rising.values())
    if total <= max_rows:
        return {k: starts[k] + len(ts) for k, ts in rising.items()}
    fits = [t for t in sorted({t for ts in rising.values() for t in ts})
            if sum(t2 <= t for ts in rising.values() for t2 in ts) <= max_rows]
    if fits:
        return {k: starts[k] + sum(t <= fits[-1] for t in ts) for k, ts in rising.items()}
    earliest = min(t for ts in rising.values() for t in ts)
    tied = {k: sum(t == earliest for t in ts) for k, ts in rising.items()}
    grants = share({k: n for k, n in tied.items() if k in first}, max_rows)
    grants.update(share({k: n for k, n in tied.items() if k not in first}, max_rows - sum(grants.values())))
    return {k: starts[k] + grants.get(k, 0) for k in rising}


def partitions(rising_only: bool):
    times = st.lists(st.integers(0, 40), max_size=25)
    if rising_only:
        times = times.map(sorted)
    return st.dictionaries(st.tuples(st.sampled_from(["users", "http_requests"]), st.integers(0, 2)),
                           st.tuples(st.integers(0, 1_000), times), min_size=1, max_size=5)


@settings(max_examples=400, deadline=None)
@given(parts=partitions(rising_only=False), max_rows=st.integers(1, 60), tables_first=st.booleans())
def test_the_cut_equals_the_brute_force_reference(parts, max_rows, tables_first):
    starts = {k: s for k, (s, _) in parts.items()}
    times = {k: ts for k, (_, ts) in parts.items()}
    ranges = {k: (s, s + len(ts)) for k, (s, ts) in parts.items()}
    first = {k for k in parts if k[0] == "users"} if tables_first else set()
    end = cut_end_offsets(ranges, end_at_of(times, starts), max_rows, first=first)
    assert end == reference(times, starts, max_rows, first)


@settings(max_examples=300, deadline=None)
@given(parts=partitions(rising_only=True), max_rows=st.integers(1, 60))
def test_no_record_after_the_cut_is_read_and_none_at_or_before_it_left_out(parts, max_rows):
    starts = {k: s for k, (s, _) in parts.items()}
    times = {k: ts for k, (_, ts) in parts.items()}
    ranges = {k: (s, s + len(ts)) for k, (s, ts) in parts.items()}
    end = cut_end_offsets(ranges, end_at_of(times, starts), max_rows, first={k for k in parts if k[0] == "users"})
    taken = {k: ts[:end[k] - starts[k]] for k, ts in times.items()}
    left = {k: ts[end[k] - starts[k]:] for k, ts in times.items()}
    read = sum(len(ts) for ts in taken.values())
    total = sum(len(ts) for ts in times.values())
    assert read <= max_rows and (read > 0 or total == 0)  # within the bound, always progressing
    assert all(starts[k] <= end[k] <= ranges[k][1] for k in ranges)
    if read == total:
        return
    cut = max((t for ts in taken.values() for t in ts), default=None)
    earliest_left = min(t for ts in left.values() for t in ts)
    if earliest_left > cut:  # one cut: nothing read after it, nothing left at or before it
        # ... and the latest such cut: the next time's records would not fit.
        assert read + sum(t == earliest_left for ts in left.values() for t in ts) > max_rows
    else:  # the earliest millisecond alone is more than max_rows: it is split, and nothing else read
        assert earliest_left == cut == min(t for ts in times.values() for t in ts) and read == max_rows
        # the table's tied records first
        if any(taken[k] for k in taken if k[0] == "http_requests"):
            assert all(t > cut for k, ts in left.items() if k[0] == "users" for t in ts)


@settings(max_examples=100, deadline=None)
@given(parts=partitions(rising_only=True), max_rows=st.integers(1, 60),
       lo=st.integers(-5, 45), hi=st.integers(-5, 45))
def test_a_wrong_bounds_hint_changes_nothing(parts, max_rows, lo, hi):
    starts = {k: s for k, (s, _) in parts.items()}
    times = {k: ts for k, (_, ts) in parts.items()}
    ranges = {k: (s, s + len(ts)) for k, (s, ts) in parts.items()}
    end_at = end_at_of(times, starts)
    assert cut_end_offsets(ranges, end_at, max_rows, bounds=(lo, hi)) == cut_end_offsets(ranges, end_at, max_rows)


def test_a_table_with_many_changes_before_a_streams_few_events_is_read_up_to_them_first():
    # users p0: 8 changes appended at 1..8 ms; http_requests p0: 2 events at 5 and 9 ms. A fair
    # share of 6 (3 each) would read both events and only the changes up to 3 ms.
    times = {("users", 0): [1, 2, 3, 4, 5, 6, 7, 8], ("http_requests", 0): [5, 9]}
    starts = {k: 0 for k in times}
    end = cut_end_offsets({k: (0, len(ts)) for k, ts in times.items()}, end_at_of(times, starts), 6)
    assert end == {("users", 0): 5, ("http_requests", 0): 1}  # the cut at 5 ms: 6 records


def test_the_group_is_cut_within_its_fair_share_and_the_other_streams_keep_theirs():
    start = {"users": {0: 0}, "http_requests": {0: 0}, "other": {0: 0}}
    targets = {"users": {0: 8}, "http_requests": {0: 2}, "other": {0: 100}}
    planned = {"users": {0: 3}, "http_requests": {0: 2}, "other": {0: 5}}  # a fair share of 10
    times = {("users", 0): [1, 2, 3, 4, 5, 6, 7, 8], ("http_requests", 0): [5, 9]}
    end_at = end_at_of(times, {k: 0 for k in times})
    assert cut_group(start, targets, planned, ["users", "http_requests"], end_at) == {
        "users": {0: 4}, "http_requests": {0: 0}, "other": {0: 5}}  # 5 for the group: cut at 4 ms
    assert cut_group(start, targets, planned, [], end_at) == planned


CATALOG = {"streams": {"users": {"kind": "table", "key_field": "user_id", "dimensions": ["plan"], "partitions": 1},
                       "http_requests": {"key_field": "user_id", "dimensions": ["method"], "partitions": 1,
                                         "enrich": [{"table": "users", "by": "user_id", "columns": ["plan"]}]}}}
T0 = 1_700_000_000_000


def changes_before_few_events(log) -> None:
    """users: 8 changes appended at T0+1..8 ms; http_requests: events appended at T0+5 and T0+9."""
    from catalog import Catalog
    from ingest.events import EventValidator
    from ingest.tables import TableRowValidator

    catalog = Catalog(**CATALOG)
    users, requests = catalog.streams["users"], catalog.streams["http_requests"]
    for s in (users, requests):
        log.ensure_topic(s)
    for i in range(1, 9):
        log.append(users, [TableRowValidator(users).validate({"user_id": "u1", "plan": f"p{i}"}, T0 + i)], T0 + i)
    for at in (5, 9):
        log.append(requests, [EventValidator(requests).validate({"time": T0 + at, "user_id": "u1", "method": "GET"})],
                   T0 + at)


def test_the_embedded_source_cuts_a_pipeline_that_enriches_at_one_append_time(tmp_path):
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from catalog import Catalog
    from ingest.log import SqliteEventLog
    from ingest.spark_source import SketchboardLogReader, source_options

    log = SqliteEventLog(tmp_path / "log.db")
    changes_before_few_events(log)
    log.close()
    reader = SketchboardLogReader(source_options(tmp_path / "log.db", Catalog(**CATALOG), 6, 100))
    try:
        start = reader.initialOffset()
        # The fair share (users 4, both events) would read the event appended at 9 ms with the
        # changes up to 4 ms only, and the one at 5 ms before the change appended with it.
        assert reader.latestOffset(start, ReadMaxRows(6)) == {"users": {"0": 5}, "http_requests": {"0": 1}}
        assert reader.latestOffset(start, ReadMaxRows(100)) == {"users": {"0": 8}, "http_requests": {"0": 2}}
        plain = {"streams": {n: {k: v for k, v in s.items() if k != "enrich"} for n, s in CATALOG["streams"].items()}}
        fair = SketchboardLogReader(source_options(tmp_path / "log.db", Catalog(**plain), 6, 100))
        assert fair.latestOffset(start, ReadMaxRows(6)) == {"users": {"0": 4}, "http_requests": {"0": 2}}
        fair.stop()
    finally:
        reader.stop()


def test_batches_of_their_own_are_cut_too(tmp_path):
    from aggregates.bounded_batches import next_batch
    from catalog import Catalog
    from ingest.append_cut import catalog_cut
    from ingest.log import SqliteEventLog

    log = SqliteEventLog(tmp_path / "log.db")
    try:
        changes_before_few_events(log)
        cut = catalog_cut(Catalog(**CATALOG), log.first_appended_after)
        start, targets = {"users": {0: 0}, "http_requests": {0: 0}}, {"users": {0: 8}, "http_requests": {0: 2}}
        assert next_batch(start, targets, 6, cut) == {"users": {0: 5}, "http_requests": {0: 1}}
        assert next_batch(start, targets, 6) == {"users": {0: 4}, "http_requests": {0: 2}}
        assert next_batch({"users": {0: 5}, "http_requests": {0: 1}}, targets, 6, cut) == targets
        # The search started between the backlog's first and last append times: the same batches.
        hinted = catalog_cut(Catalog(**CATALOG), log.first_appended_after, log.ingest_time_ms)
        assert next_batch(start, targets, 6, hinted) == {"users": {0: 5}, "http_requests": {0: 1}}
        assert next_batch(start, targets, 1, hinted) == {"users": {0: 1}, "http_requests": {0: 0}}
    finally:
        log.close()


def test_the_search_starts_between_the_backlogs_first_and_last_append_times():
    from ingest.append_cut import time_bounds

    times = {("users", 0): [3, 4, 9], ("http_requests", 0): [5, 7], ("http_requests", 1): [1]}

    def ingest_time_ms(stream, partition, offset):
        ts = times[(stream, partition)]
        return ts[offset] if offset < len(ts) else None

    start = {"users": {0: 0}, "http_requests": {0: 1, 1: 1}}  # http_requests p1: nothing left
    targets = {"users": {0: 3}, "http_requests": {0: 2, 1: 1}}
    assert time_bounds(ingest_time_ms, start, targets, ["users", "http_requests"]) == (2, 9)
    assert time_bounds(ingest_time_ms, start, {"users": {0: 4}}, ["users"]) is None  # a time the log cannot tell
    assert time_bounds(ingest_time_ms, targets, targets, ["users", "http_requests"]) is None  # nothing left


def test_what_a_pipeline_cuts_the_tables_its_streams_are_enriched_from_directly_or_through_a_view(demo_catalog):
    from catalog import Catalog
    from catalog.enrichment import append_cut_streams

    assert append_cut_streams(Catalog(**CATALOG)) == (["http_requests", "users"], ["users"])
    assert append_cut_streams(demo_catalog) == (["http_requests", "plans", "users"], ["plans", "users"])
    plain = {"streams": {n: {k: v for k, v in s.items() if k != "enrich"} for n, s in CATALOG["streams"].items()}}
    assert append_cut_streams(Catalog(**plain)) == ([], [])

"""Exact duplicate drops by event id: the pure rule (aggregates/event_ids.py), the pruning
horizon (store/event_ids.py), the catalog's declaration, and the store's contract on every
backend (the ids of a batch are saved in its own transaction, pruned after the window)."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from pydantic import ValidationError

from aggregates.event_ids import COLUMNS, find_duplicates, is_duplicate
from aggregates.eventtime import MISSING_EVENT_ID, dead_letter_reason
from catalog import Catalog
from catalog.model import DEFAULT_DEDUP_WINDOW_MS
from ingest.events import EventValidator
from store import BatchCommit, PaneData, PanePartial
from store.event_ids import EventIdCommit, advance_positions, prune_horizon

MIN = 60_000


def records(rows) -> pa.Table:
    """rows: (stream, partition, offset, ingest_ms, event_id)."""
    cols = list(zip(*rows, strict=True)) if rows else [[] for _ in COLUMNS]
    types = [pa.string(), pa.int32(), pa.int64(), pa.int64(), pa.string()]
    return pa.table({c: pa.array(v, t) for c, v, t in zip(COLUMNS, cols, types, strict=True)})


def oracle(rows, stored, window):
    """The rule, one record at a time in (ingest, partition, offset) order: what is dropped."""
    last = {(s, i): t for s, ids in stored.items() for i, t in ids.items()}
    dropped = set()
    for s, p, o, t, i in sorted(rows, key=lambda r: (r[3], r[1], r[2])):
        before = last.get((s, i))
        if before is not None and abs(t - before) <= window[s]:
            dropped.add((s, p, o))
        else:
            last[(s, i)] = t if before is None else max(before, t)
    return dropped


# -- the rule -----------------------------------------------------------------------------

def test_copies_within_the_window_are_dropped_once_counted_in_the_batch_and_in_the_store():
    rows = [
        ("orders", 0, 0, 1000, "a"), ("orders", 1, 0, 1500, "a"),   # in-batch copy: dropped
        ("orders", 0, 1, 2000, "b"),                               # counted before (store): dropped
        ("orders", 0, 2, 2000, "c"),                               # counted before, window passed: counted again
        ("orders", 0, 3, 2000, "d"),                               # new
        ("http", 0, 0, 1000, "a"),                                 # another stream's id space
    ]
    stored = {"orders": {"b": 1000, "c": 2000 - 10 * MIN - 1}}
    out = find_duplicates(records(rows), stored, {"orders": 10 * MIN, "http": 10 * MIN})
    assert sorted(out.dropped) == [("orders", 0, 1), ("orders", 1, 0)]
    assert out.duplicates == {"orders": 2}
    assert sorted(out.counted) == [("http", "a", 1000), ("orders", "a", 1000), ("orders", "c", 2000),
                                   ("orders", "d", 2000)]
    assert out.read_ingest_ms == {"orders": {0: 2000, 1: 1500}, "http": {0: 1000}}


def test_a_copy_after_the_window_starts_a_new_window():
    rows = [("s", 0, k, k * 6 * MIN, "x") for k in range(5)]  # every 6 minutes, window 10 minutes
    out = find_duplicates(records(rows), {}, {"s": 10 * MIN})
    # counted at 0, dropped at 6, counted at 12 (12 > 0 + 10), dropped at 18, counted at 24
    assert sorted(out.dropped) == [("s", 0, 1), ("s", 0, 3)]
    assert [t for _, _, t in out.counted] == [0, 12 * MIN, 24 * MIN]


def test_order_within_a_batch_is_by_ingest_time_then_partition_and_offset():
    rows = [("s", 3, 9, 500, "x"), ("s", 1, 4, 500, "x"), ("s", 0, 0, 700, "x")]
    out = find_duplicates(records(rows), {}, {"s": MIN})
    assert sorted(out.dropped) == [("s", 0, 0), ("s", 3, 9)]  # (1, 4) is first: same time, lower partition
    assert is_duplicate(100, 100 + MIN, MIN) and not is_duplicate(100, 101 + MIN, MIN)
    assert not is_duplicate(100, None, MIN)


@pytest.mark.parametrize("seed", range(5))
def test_the_vectorised_rule_equals_the_one_at_a_time_oracle(seed):
    rng = random.Random(seed)
    rows = [(rng.choice(["a", "b"]), rng.randrange(4), o, rng.randrange(0, 30 * MIN), f"id{rng.randrange(300)}")
            for o in range(2000)]
    stored = {"a": {f"id{k}": rng.randrange(0, 30 * MIN) for k in range(0, 300, 7)}}
    window = {"a": 5 * MIN, "b": 20 * MIN}
    out = find_duplicates(records(rows), stored, window)
    assert set(out.dropped) == oracle(rows, stored, window)
    assert len(out.dropped) == sum(out.duplicates.values())
    assert len(out.counted) + len(out.dropped) == len(rows)


def test_an_empty_batch_judges_nothing():
    out = find_duplicates(records([]), {"s": {"x": 1}}, {"s": MIN})
    assert (out.dropped, out.counted, out.duplicates) == ([], [], {})


# -- pruning ------------------------------------------------------------------------------

def test_the_horizon_follows_the_oldest_partition_read_not_the_clock():
    t = 10 * 3_600_000
    # Partition 1 lags two hours behind (a catch-up): ids of its time must stay.
    horizon = prune_horizon({0: t - MIN, 1: t - 2 * 3_600_000}, 10 * MIN, read_offsets={0: 50, 1: 10},
                            log_end_offsets={0: 60, 1: 500})
    assert horizon == t - 2 * 3_600_000 - 10 * MIN
    # Both read to the log's end: what comes next is appended after the newest record read.
    assert prune_horizon({0: t - 3_600_000, 1: t - 2 * 3_600_000}, 10 * MIN, read_offsets={0: 60, 1: 500},
                         log_end_offsets={0: 60, 1: 500}) == t - 3_600_000 - 10 * MIN
    # A partition with unread records of unknown age holds pruning off; nothing known: none.
    assert prune_horizon({0: t}, MIN, read_offsets={}, log_end_offsets={0: 5, 1: 7}) is None
    assert prune_horizon({0: t}, MIN, read_offsets={}, log_end_offsets={0: 5, 1: 0}) == t - MIN  # 1 is empty
    assert prune_horizon({}, MIN, read_offsets={}, log_end_offsets={}) is None
    assert advance_positions({0: 5, 1: 9}, {1: 7, 2: 3}) == {0: 5, 1: 9, 2: 3}


# -- declaration and validation -----------------------------------------------------------

def stream(**extra) -> dict:
    return {"time_field": "ts", "key_field": "user", "dimensions": ["country"], "values": ["amount"], **extra}


def test_a_stream_declares_an_event_id_with_a_default_window():
    cat = Catalog(streams={"orders": stream(event_id_field="request_id")})
    s = cat.streams["orders"]
    assert s.dedup_window_ms == DEFAULT_DEDUP_WINDOW_MS
    assert s.source_ids == ("user", "request_id") and "request_id" in s.string_fields
    assert Catalog(streams={"o": stream(event_id_field="user", dedup_window="5m")}).streams["o"].source_ids == ("user",)
    assert Catalog(streams={"o": stream()}).streams["o"].dedup_window_ms is None
    # Sessions run in the pane batch after duplicates are dropped (aggregates/session_batch.py): both may be declared.
    both = Catalog(streams={"o": stream(event_id_field="rid", sessions={"key": "user", "gap": "5m"})})
    assert both.streams["o"].sessions.gap == 300_000 and "o_sessions" in both.streams


@pytest.mark.parametrize("extra, message", [
    ({"dedup_window": "5m"}, "dedup_window needs event_id_field"),
    ({"event_id_field": "country"}, "event_id_field 'country' is also a dimensions field"),
    ({"event_id_field": "amount"}, "also a values field"),
    ({"event_id_field": "rid", "dedup_window": "500ms"}, "dedup_window (500ms) must be at least 1s"),
    ({"event_id_field": "rid", "dedup_window": "30d"}, "must not be longer than retention (1w)"),
    ({"event_id_field": "rid", "dedup_window": "soon"}, "not a duration"),
    ({"event_id_field": "bad-name"}, "pattern"),
])
def test_bad_declarations_say_what_is_wrong(extra, message):
    with pytest.raises(ValidationError) as err:
        Catalog(streams={"orders": stream(**extra)})
    assert message in str(err.value)


def test_the_api_refuses_an_event_without_its_id_and_the_pipeline_dead_letters_one():
    v = EventValidator(Catalog(streams={"orders": stream(event_id_field="rid")}).streams["orders"])
    assert v.validate({"ts": 1_700_000_000, "user": "u", "rid": 17}).strings["rid"] == "17"
    with pytest.raises(ValueError, match="rid: required field is missing"):
        v.validate({"ts": 1_700_000_000, "user": "u"})
    with pytest.raises(ValueError, match="rid: event id field must not be null"):
        v.validate({"ts": 1_700_000_000, "user": "u", "rid": None})
    kw = dict(batch_now_ms=10**13, retention_ms=10**13, max_future_skew_ms=0)
    assert dead_letter_reason(5, 5, None, event_id_missing=True, **kw) == MISSING_EVENT_ID
    assert dead_letter_reason(5, 5, "bad", event_id_missing=True, **kw) == "unparseable"


# -- the store's contract -----------------------------------------------------------------

T0 = 1_700_000_000_000


def batch(batch_id: int, counted, duplicates: int, read_ingest: dict, *, aggregated: int | None = None,
          end: int = 10, log_end: int = 10) -> BatchCommit:
    n = len(counted) if aggregated is None else aggregated
    partials = [PanePartial("orders", T0, T0 + 10_000, {}, PaneData(n))] if n else []
    return BatchCommit(
        pipeline="main", batch_id=batch_id, partials=partials, events_read=n + duplicates,
        end_offsets={"orders": {0: end}}, log_end_offsets={"orders": {0: log_end}},
        read_by_stream={"orders": n + duplicates},
        event_ids=EventIdCommit({"orders": 10 * MIN}, [("orders", i, t) for i, t in counted],
                                {"orders": duplicates} if duplicates else {}, {"orders": read_ingest}))


def test_ids_duplicates_and_positions_are_saved_with_the_batch_once(store_backend):
    store = store_backend.create()
    first = batch(0, [("a", T0), ("b", T0 + 2 * MIN)], 1, {0: T0 + 2 * MIN}, end=3, log_end=9)
    assert store.commit_batch(first, lateness_ms={}, now_ms=T0).committed
    assert not store.commit_batch(first, lateness_ms={}, now_ms=T0).committed  # a replay: nothing twice
    assert store.seen_event_ids("orders", ["a", "b", "c"]) == {"a": T0, "b": T0 + 2 * MIN}
    assert store.seen_event_ids("http", ["a"]) == {} and store.seen_event_ids("orders", []) == {}
    s = store.progress("main").streams["orders"]
    assert (s.events_read, s.events_aggregated, s.duplicates_dropped) == (3, 2, 1)
    # A restart sees the same; a copy counted again after its window moves the id's time.
    store = store_backend.reopen(store)
    assert store.commit_batch(batch(1, [("a", T0 + 11 * MIN)], 2, {0: T0 + 11 * MIN}, end=6, log_end=9),
                              lateness_ms={}, now_ms=T0 + 11 * MIN).committed
    assert store.seen_event_ids("orders", ["a", "b"]) == {"a": T0 + 11 * MIN, "b": T0 + 2 * MIN}
    assert store.progress("main").streams["orders"].duplicates_dropped == 3


def test_ids_are_pruned_once_every_partition_read_is_past_the_window(store_backend):
    store = store_backend.create()
    store.commit_batch(batch(0, [("a", T0), ("b", T0 + 5 * MIN)], 0, {0: T0 + 5 * MIN}, end=2, log_end=50),
                       lateness_ms={}, now_ms=T0 + 99 * MIN)
    # Still reading the backlog: the clock is far ahead, but what is read next is near T0.
    assert set(store.seen_event_ids("orders", ["a", "b"])) == {"a", "b"}
    store.commit_batch(batch(1, [("c", T0 + 12 * MIN)], 0, {0: T0 + 12 * MIN}, end=3, log_end=50),
                       lateness_ms={}, now_ms=T0 + 99 * MIN)
    assert set(store.seen_event_ids("orders", ["a", "b", "c"])) == {"b", "c"}  # a: older than 12 - 10 minutes
    # Read to the log's end: past the window of the newest record read, whatever the clock says.
    store.commit_batch(batch(2, [], 0, {0: T0 + 21 * MIN}, end=50, log_end=50), lateness_ms={}, now_ms=T0)
    assert store.seen_event_ids("orders", ["a", "b", "c"]) == {"c": T0 + 12 * MIN}


def test_a_failed_commit_saves_no_id(store_backend):
    store = store_backend.create()
    bad = batch(0, [("a", T0)], 0, {0: T0}, aggregated=1)
    bad = BatchCommit(**{**bad.__dict__, "read_by_stream": {"orders": 5}})  # read != aggregated + dead + duplicates
    with pytest.raises(ValueError, match="1 aggregated \\+ 0 dead-lettered \\+ 0 duplicates dropped"):
        store.commit_batch(bad, lateness_ms={}, now_ms=T0)
    assert store.seen_event_ids("orders", ["a"]) == {}
    assert store.last_batch_id("main") is None


def test_the_demo_gives_every_event_its_own_id_where_the_stream_declares_one():
    from demo.traffic import DemoTraffic

    cat = Catalog(streams={"orders": stream(event_id_field="rid")})
    events = DemoTraffic(cat, seed=1).generate_stream("orders", 500) + DemoTraffic(cat, seed=1).generate_stream("orders", 500)
    assert len({e["rid"] for e in events}) == 1000  # the same seed twice: still no id in common
    v = EventValidator(cat.streams["orders"])
    assert all(v.validate(e) for e in events)

"""The Spark source's reader never raises on bad log content (no JVM: read_slice directly):
a corrupt segment becomes one error row per offset in it, a record without an event time one
error row, and reading goes on after them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalog import load_catalog
from ingest.events import EventValidator
from ingest.log import SqliteEventLog
from ingest.log.records import encode_segment, segment_schema
from ingest.spark_source import (MISSING_EVENT_TIME, SOURCE_SCHEMA, SketchboardLogReader, batch_slices, read_batch,
                                read_slice, source_options)
from tests.support.events import validate_many

CONFIG = Path(__file__).resolve().parents[2] / "config" / "streams.yaml"
T0 = 1_700_000_000_000


def test_corrupt_segment_and_null_event_time_become_error_rows(tmp_path):
    stream = load_catalog(CONFIG).stream("orders")
    log = SqliteEventLog(tmp_path / "log.db")
    log.ensure_topic(stream)
    v = EventValidator(stream)

    def append(n):
        good, _ = validate_many(v, [{"time": T0 + i, "customer_id": "c1", "country": "DE", "payment_method": "card",
                                    "amount": 1.0, "items": 1} for i in range(n)])
        return log.append(stream, good, T0)

    p = next(iter(append(2).ranges))  # one key: one partition
    schema = pa.schema([pa.field(f.name, f.type) for f in segment_schema(stream)])
    nulled = encode_segment(pa.RecordBatch.from_pylist([{"__event_time": None, "__ingest_time": T0}], schema=schema))
    with sqlite3.connect(tmp_path / "log.db") as conn:
        conn.execute("INSERT INTO segments VALUES ('orders', ?, 2, 5, ?, 3, ?)", (p, T0, b"bad"))
        conn.execute("INSERT INTO segments VALUES ('orders', ?, 7, 1, ?, ?, ?)", (p, T0, len(nulled), nulled))
        conn.execute("UPDATE partitions SET next_offset = 8 WHERE stream = 'orders' AND partition = ?", (p,))
    append(3)

    rows = [r for b in read_slice(log, stream, p, 0, 11) for r in b.to_pylist()]
    assert [r["offset"] for r in rows] == list(range(11))
    errors = {r["offset"]: r["error"] for r in rows if r["error"]}
    assert set(errors) == {2, 3, 4, 5, 6, 7}
    assert all("undecodable log segment (offsets 2..6)" in errors[o] for o in range(2, 7))
    assert errors[7] == MISSING_EVENT_TIME
    assert [r["event_time"] for r in rows if not r["error"]] == [T0, T0 + 1, T0, T0 + 1, T0 + 2]
    # from the middle of the corrupt segment, and only part of it
    rows = [r for b in read_slice(log, stream, p, 4, 6) for r in b.to_pylist()]
    assert [(r["offset"], bool(r["error"])) for r in rows] == [(4, True), (5, True)]
    for b in read_slice(log, stream, p, 0, 11):
        assert b.schema == SOURCE_SCHEMA
    log.close()


def test_a_batch_read_on_the_driver_is_what_the_source_s_tasks_read(tmp_path):
    """The pipeline reads a small batch of the embedded log on the driver (read_batch, no Spark
    job): the same rows, error rows and order as the source's tasks for the batch's offsets, whether
    they come as Spark passes them (partitions as JSON strings) or as the checkpoint's offsets are read."""
    catalog = load_catalog(CONFIG)
    stream = catalog.stream("orders")
    log = SqliteEventLog(tmp_path / "log.db")
    for s in catalog.streams.values():
        log.ensure_topic(s)
    good, _ = validate_many(EventValidator(stream), [
        {"time": T0 + i, "customer_id": f"c{i % 7}", "country": "DE", "payment_method": "card", "amount": 1.0 + i,
         "items": 1} for i in range(60)])
    log.append(stream, good, T0)
    p = min(log.offsets("orders"))
    with sqlite3.connect(tmp_path / "log.db") as conn:  # a corrupt segment after the good records
        end = conn.execute("SELECT next_offset FROM partitions WHERE stream = 'orders' AND partition = ?",
                           (p,)).fetchone()[0]
        conn.execute("INSERT INTO segments VALUES ('orders', ?, ?, 2, ?, 3, ?)", (p, end, T0, b"bad"))
        conn.execute("UPDATE partitions SET next_offset = ? WHERE stream = 'orders' AND partition = ?", (end + 2, p))
    ends = {name: {str(q): o.end for q, o in log.offsets(name).items()} for name in catalog.streams}
    starts = {name: {q: min(1, o) for q, o in parts.items()} for name, parts in ends.items()}
    reader = SketchboardLogReader(source_options(str(tmp_path / "log.db"), catalog, 1_000_000, 7))
    by_tasks = [r for task in reader.partitions(starts, ends) for b in reader.read(task) for r in b.to_pylist()]
    as_logged = ({s: {int(q): o for q, o in parts.items()} for s, parts in starts.items()},
                 {s: {int(q): o for q, o in parts.items()} for s, parts in ends.items()})
    for start, end in ((starts, ends), as_logged):
        table = read_batch(log, catalog, start, end)
        assert table.schema == SOURCE_SCHEMA
        assert table.to_pylist() == by_tasks
    assert len(by_tasks) == sum(o - min(1, o) for parts in ends.values() for o in parts.values())
    assert sum(1 for r in by_tasks if r["error"]) == 2
    reader.stop()
    log.close()


def _mobile_event(i: int, device: str) -> dict:
    return {"time": T0 + i, "sent_at": T0 + i + 5, "device_id": device, "user_id": f"u{i % 3}", "screen": "home",
            "platform": "ios", "app_version": "1.0", "duration_ms": float(i)}


def _order(i: int, customer: str) -> dict:
    return {"time": T0 + i, "customer_id": customer, "country": "DE", "payment_method": "card", "amount": 1.0 + i,
            "items": 1}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(appends=st.lists(st.tuples(st.sampled_from(["orders", "mobile_app"]), st.integers(1, 30), st.integers(0, 5),
                                  st.sampled_from([None, None, "corrupt", "no time"])), min_size=1, max_size=10),
       skip=st.integers(0, 12))
def test_a_batch_of_many_segments_and_streams_reads_as_its_slices_do(tmp_path_factory, appends, skip):
    """read_batch turns a stream's segments, read one after the other, into source rows in one
    conversion: the same rows, in the same order, as each slice read segment by segment
    (read_slice, the source's tasks), across streams, partitions, corrupt segments and records
    without an event time."""
    tmp_path = tmp_path_factory.mktemp("log")
    catalog = load_catalog(CONFIG)
    log = SqliteEventLog(tmp_path / "log.db")
    for s in catalog.streams.values():
        log.ensure_topic(s)
    make = {"orders": _order, "mobile_app": _mobile_event}
    for n_append, (name, n, keys, extra) in enumerate(appends):
        stream = catalog.stream(name)
        key = "customer_id" if name == "orders" else "device_id"
        good, _ = validate_many(EventValidator(stream), [make[name](i, f"k{i % (keys + 1)}") for i in range(n)])
        log.append(stream, good, T0 + n_append)
        if extra is None:
            continue
        p = min(log.offsets(name))
        schema = pa.schema([pa.field(f.name, f.type) for f in segment_schema(stream)])
        data = (b"bad" if extra == "corrupt" else
                encode_segment(pa.RecordBatch.from_pylist([{"__event_time": None, "__ingest_time": T0, key: "k"}],
                                                          schema=schema)))
        count = 2 if extra == "corrupt" else 1
        with sqlite3.connect(tmp_path / "log.db") as conn:
            end = conn.execute("SELECT next_offset FROM partitions WHERE stream = ? AND partition = ?",
                               (name, p)).fetchone()[0]
            conn.execute("INSERT INTO segments VALUES (?, ?, ?, ?, ?, ?, ?)", (name, p, end, count, T0, T0, data))
            conn.execute("UPDATE partitions SET next_offset = ? WHERE stream = ? AND partition = ?",
                         (end + count, name, p))
    ends = {name: {q: o.end for q, o in log.offsets(name).items()} for name in catalog.streams}
    starts = {name: {q: min(skip, o) for q, o in parts.items()} for name, parts in ends.items()}
    by_slices = [r for s in batch_slices(catalog, starts, ends, 2**62)
                 for b in read_slice(log, catalog.stream(s.stream), s.partition, s.start, s.end) for r in b.to_pylist()]
    table = read_batch(log, catalog, starts, ends)
    assert table.schema == SOURCE_SCHEMA
    assert all(c.num_chunks <= 1 for c in table.columns)
    assert table.to_pylist() == by_slices
    log.close()

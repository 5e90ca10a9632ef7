"""The Spark source's reader never raises on bad log content (no JVM: read_slice directly):
a corrupt segment becomes one error row per offset in it, a record without an event time one
error row, and reading goes on after them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pyarrow as pa

from catalog import load_catalog
from ingest.events import EventValidator
from ingest.log import SqliteEventLog
from ingest.log.records import encode_segment, segment_schema
from ingest.spark_source import MISSING_EVENT_TIME, SOURCE_SCHEMA, read_slice
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

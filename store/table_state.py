"""The current rows of changelog tables (kind: table), as the store keeps them: one row per
(table, key), written in the transaction of the batch that changed it, for every backend.

A batch's changes are, per table and key, its newest change (aggregates/tables.py picks it on
the executors): an upsert replaces the row, a delete removes it. Batches commit in log order, so
the stored rows are the table as of the last committed batch's offsets, exactly once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DDL = """
-- Changelog tables (kind: table): each key's current row (store/table_state.py).
CREATE TABLE IF NOT EXISTS table_rows (
    stream TEXT NOT NULL,
    row_key TEXT NOT NULL,
    row_json TEXT NOT NULL,        -- the row's columns: its dimensions and values (JSON object)
    event_time_ms INTEGER NOT NULL, -- the change's time (the row's time field)
    log_partition INTEGER NOT NULL,
    log_offset INTEGER NOT NULL,   -- where the change is in the log
    batch_id INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (stream, row_key)
);
"""


@dataclass(frozen=True)
class TableChange:
    """The newest change of one key in a batch: `row` None is a delete."""

    row: Mapping[str, Any] | None
    event_time_ms: int
    partition: int
    offset: int
    # When the log accepted the change: what future skew is judged against (aggregates/eventtime.py),
    # for the views' change streams (aggregates/views.py); not stored. None: unknown (unparseable).
    ingest_time_ms: int | None = None


@dataclass(frozen=True)
class TableRow:
    key: str
    row: dict[str, Any]
    event_time_ms: int
    partition: int
    offset: int
    updated_at_ms: int


def apply(cur, changes: Mapping[str, Mapping[str, TableChange]], batch_id: int, now_ms: int,
          placeholder: str) -> None:
    """Write a batch's table changes with `cur` (the batch's transaction)."""
    p = placeholder
    deletes = [(stream, key) for stream, rows in changes.items() for key, c in rows.items() if c.row is None]
    upserts = [(stream, key, json.dumps(c.row, separators=(",", ":"), sort_keys=True), c.event_time_ms, c.partition,
                c.offset, batch_id, now_ms)
               for stream, rows in changes.items() for key, c in rows.items() if c.row is not None]
    if deletes:
        cur.executemany(f"DELETE FROM table_rows WHERE stream = {p} AND row_key = {p}", deletes)
    if upserts:
        cur.executemany(
            "INSERT INTO table_rows (stream, row_key, row_json, event_time_ms, log_partition, log_offset, batch_id,"
            f" updated_at_ms) VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}) ON CONFLICT (stream, row_key) DO UPDATE SET"
            " row_json = excluded.row_json, event_time_ms = excluded.event_time_ms,"
            " log_partition = excluded.log_partition, log_offset = excluded.log_offset,"
            " batch_id = excluded.batch_id, updated_at_ms = excluded.updated_at_ms", upserts)


_COLUMNS = "row_key, row_json, event_time_ms, log_partition, log_offset, updated_at_ms"


def row_query(placeholder: str) -> str:
    """One key's row: args (stream, key)."""
    return f"SELECT {_COLUMNS} FROM table_rows WHERE stream = {placeholder} AND row_key = {placeholder}"


def page_query(placeholder: str, after: str | None) -> str:
    """Rows in key order after the key `after`, or from the first when None: args (stream,
    page_start(after), limit)."""
    p = placeholder
    return (f"SELECT {_COLUMNS} FROM table_rows WHERE stream = {p} AND row_key {page_compare(after)} {p}"
            f" ORDER BY row_key LIMIT {p}")


def page_compare(after: str | None) -> str:
    """From the first row the key compares >= "", so the empty key is read too: it sorts first, and
    a row keyed "" (stored before such keys were refused, ingest/tables.py) was missed by a first
    page read as "after the key ''", also by a view's rebuild."""
    return ">=" if after is None else ">"


def page_start(after: str | None) -> str:
    return "" if after is None else after


def to_row(found: tuple) -> TableRow:
    key, row_json, event_time_ms, partition, offset, updated = found
    return TableRow(key, json.loads(row_json), event_time_ms, partition, offset, updated)

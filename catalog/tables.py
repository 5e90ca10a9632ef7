"""Changelog tables (`kind: table`): what a table stream may declare, and the implicit `op` dimension.

A table stream's records are changes of rows keyed by its `key_field`: an upsert sets the key's
row (its declared dimensions and values), a tombstone deletes it. The pipeline keeps the current
rows (store: table_rows) and counts the changes in panes like any stream's events, grouped by the
implicit dimension `op` ("upsert" or "delete") and the declared dimensions: change data capture
answered by the usual query API. The embedded log compacts a table's partitions (keeps the newest
record per key, drops tombstones after `tombstone_retention`) instead of dropping old segments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from catalog.model import StreamDef

StreamKind = Literal["stream", "table"]

OP_FIELD = "op"  # the implicit dimension of a table: which change a record is
UPSERT = "upsert"
DELETE = "delete"
# The flag of a row that deletes its key in a POST body ({"<key>": "k", "_deleted": true}; ingest/tables.py):
# a field of that name would be read as the flag, so no table may declare one.
DELETED_FLAG = "_deleted"
# Kafka's delete.retention.ms default: how long a tombstone outlives the rows it deleted, so a
# consumer that is behind still sees the delete.
DEFAULT_TOMBSTONE_RETENTION_MS = 86_400_000

# Declarations a table refuses, and why (each is about events, not rows of a keyed table).
_REFUSED = {
    "first_seen": "first-seen keys are a feature of event streams",
    "membership": "membership filters are a feature of event streams",
    "sessions": "sessions are a feature of event streams",
    "event_id_field": "a table's changes are idempotent by key: the newest row wins",
    "sent_time_field": "device clocks are a feature of event streams",
    "device_field": "device clocks are a feature of event streams",
}


def with_op_dimension(data: object) -> object:
    """Raw stream data with the implicit `op` dimension first among a table's dimensions
    (idempotent: a catalog dumped and parsed again has it already)."""
    if not isinstance(data, dict) or data.get("kind") != "table":
        return data
    dims = data.get("dimensions") or ()
    if isinstance(dims, (list, tuple)) and OP_FIELD not in dims:
        data = {**data, "dimensions": (OP_FIELD, *dims)}
    return data


def check_table(stream: StreamDef) -> None:
    """A table's rules (ValueError naming the problem); an event stream must not use table fields."""
    if stream.kind != "table":
        if stream.tombstone_retention is not None:
            raise ValueError("tombstone_retention is a setting of tables (kind: table)")
        return
    if stream.key_field is None:
        raise ValueError("a table (kind: table) needs key_field: the field whose value names a row")
    for name, why in _REFUSED.items():
        if getattr(stream, name) is not None:
            raise ValueError(f"a table (kind: table) cannot declare {name}: {why}")
    if stream.key_field not in stream.distinct_fields:
        raise ValueError(f"a table's distinct fields must include its key_field {stream.key_field!r}"
                         " (the pipeline reads the key from them)")
    if stream.key_field in stream.dimensions or stream.key_field in stream.values:
        raise ValueError(f"key_field {stream.key_field!r} cannot also be a dimension or a value of a table")
    if stream.time_field == OP_FIELD or OP_FIELD in stream.values or OP_FIELD in (stream.distinct or ()) \
            or stream.key_field == OP_FIELD:
        raise ValueError(f"{OP_FIELD!r} is the implicit dimension of a table (upsert or delete): name the field"
                         " otherwise")
    if DELETED_FLAG in (stream.key_field, stream.time_field, *stream.string_fields, *stream.values):
        raise ValueError(f"{DELETED_FLAG!r} is the flag of a row that deletes its key (\"{DELETED_FLAG}\": true):"
                         " name the field otherwise")


def tombstone_retention_ms(stream: StreamDef) -> int:
    """How long the embedded log keeps a table's tombstones (after it is appended)."""
    if stream.tombstone_retention is None:
        return DEFAULT_TOMBSTONE_RETENTION_MS
    return stream.tombstone_retention


def row_columns(stream: StreamDef) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(string columns, number columns) of a table's row: its dimensions but `op`, its values."""
    return tuple(d for d in stream.dimensions if d != OP_FIELD), stream.values

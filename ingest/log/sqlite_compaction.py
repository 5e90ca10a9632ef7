"""The embedded log's compaction pass over changelog tables (the selection: ingest/log/compaction.py).

A pass reads a table partition's segments without holding the log's write lock, decides which
records go, then rewrites only the segments that lose records, in one short transaction: each
keeps its base offset and offset span, its remaining records carry their offsets in an
`__offset` column (read by SqliteEventLog.read), and a segment left empty is deleted. Appends
only add segments above the partition's end, so they never wait on the decoding; a segment that
changed meanwhile (retention, another pass) is left for the next pass.

A partition a pass left nothing to drop in is not read again until something can have changed
that (SqliteEventLog._compaction_quiet): a write to it (its offsets or weight move), the readers'
committed offset, the table's settings, or the time its first read tombstone outlives its
retention (compaction.next_drop_ms). Reading and decoding every segment of every table each
minute grows with the table's history, as the retention pass's full reads did (session 88).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from catalog import StreamDef
from catalog.tables import DELETE, OP_FIELD, tombstone_retention_ms
from ingest.log.compaction import Change, next_drop_ms, offsets_to_drop
from ingest.log.records import INGEST_TIME, OFFSET, decode_segment, encode_segment

if TYPE_CHECKING:
    from ingest.log.sqlite import SqliteEventLog


def register(conn: sqlite3.Connection, stream: StreamDef) -> None:
    """Inside ensure_topic's transaction: a table's partitions are compacted, an event stream's are not."""
    if stream.kind == "table":
        conn.execute("INSERT INTO compacted_topics (stream, key_field, tombstone_retention_ms) VALUES (?, ?, ?)"
                     " ON CONFLICT (stream) DO UPDATE SET key_field = excluded.key_field,"
                     " tombstone_retention_ms = excluded.tombstone_retention_ms",
                     (stream.name, stream.key_field, tombstone_retention_ms(stream)))
    else:
        conn.execute("DELETE FROM compacted_topics WHERE stream = ?", (stream.name,))


def compact(log: SqliteEventLog, now_ms: int, read_through: Mapping[str, Mapping[int, int]] | None = None) -> int:
    """One pass over every compacted partition; returns the records dropped. `read_through`: the
    pipeline's committed offsets ({stream: {partition: offset}}): tombstones it has not read stay."""
    from ingest.log.sqlite import _transaction

    with log._lock:
        tables = log._conn.execute(
            "SELECT t.stream, t.key_field, t.tombstone_retention_ms, p.partition FROM compacted_topics t"
            " JOIN partitions p ON p.stream = t.stream ORDER BY t.stream, p.partition").fetchall()
    dropped = 0
    for stream, key_field, retention_ms, partition in tables:
        through = (read_through or {}).get(stream, {}).get(partition)
        with log._lock:
            # Read before the segments, so that a write between the two reads makes it differ next time.
            position = _position(log, stream, partition)
            state = (key_field, retention_ms, through, *position)
            quiet = log._compaction_quiet.get((stream, partition))
            if quiet is not None and quiet[0] == state and (quiet[1] is None or now_ms < quiet[1]):
                continue
            segments = log._conn.execute(
                "SELECT base_offset, record_count, bytes, data FROM segments WHERE stream = ? AND partition = ?"
                " ORDER BY base_offset", (stream, partition)).fetchall()
        decoded = [(base, count, size, decode_segment(data)) for base, count, size, data in segments]
        changes = [change for base, _, _, batch in decoded for change in _changes(base, batch, key_field)]
        drop = offsets_to_drop(changes, now_ms=now_ms, tombstone_retention_ms=retention_ms, read_through=through)
        if not drop:
            log._compaction_quiet[(stream, partition)] = (
                state, next_drop_ms(changes, tombstone_retention_ms=retention_ms, read_through=through))
            continue
        dropping = np.sort(np.fromiter(drop, dtype=np.int64, count=len(drop)))
        rewrites = []  # (base, old size, records before, new data or None, records after)
        for base, _, size, batch in decoded:
            offsets = _offsets(base, batch)
            keep = ~_among(offsets, dropping)
            if keep.all():
                continue
            if not keep.any():
                rewrites.append((base, size, batch.num_rows, None, 0))
                continue
            kept = batch.drop_columns([OFFSET]) if OFFSET in batch.schema.names else batch
            kept = kept.filter(pa.array(keep)).append_column(OFFSET, pa.array(offsets[keep], pa.int64()))
            rewrites.append((base, size, batch.num_rows, encode_segment(kept), kept.num_rows))
        with log._lock, _transaction(log._conn):
            shrunk, skipped = 0, False  # bytes the partition lost: its weight (ingest/log/sqlite.py BYTES_COLUMN)
            for base, size, before, data, after in rewrites:
                row = log._conn.execute(
                    "SELECT bytes FROM segments WHERE stream = ? AND partition = ? AND base_offset = ?",
                    (stream, partition, base)).fetchone()
                if row is None or row[0] != size:  # a rewrite always shrinks a segment: same size, same records
                    skipped = True
                    continue  # changed since it was read: the next pass sees it again
                if data is None:
                    log._conn.execute("DELETE FROM segments WHERE stream = ? AND partition = ? AND base_offset = ?",
                                      (stream, partition, base))
                else:
                    log._conn.execute("UPDATE segments SET data = ?, bytes = ? WHERE stream = ? AND partition = ?"
                                      " AND base_offset = ?", (data, len(data), stream, partition, base))
                dropped += before - after
                shrunk += size - (0 if data is None else len(data))
            log._conn.execute("UPDATE partitions SET bytes = bytes - ? WHERE stream = ? AND partition = ?",
                              (shrunk, stream, partition))
            after_pass = _position(log, stream, partition)
            # Nothing appended meanwhile and every rewrite made: what is left is the kept changes.
            if not skipped and after_pass[:2] == position[:2]:
                kept_changes = [c for c in changes if c.offset not in drop]
                log._compaction_quiet[(stream, partition)] = (
                    (key_field, retention_ms, through, *after_pass),
                    next_drop_ms(kept_changes, tombstone_retention_ms=retention_ms, read_through=through))
    return dropped


def _position(log: SqliteEventLog, stream: str, partition: int) -> tuple[int, int, int | None]:
    """(start offset, end offset, weight): what any write to the partition moves."""
    return log._conn.execute("SELECT start_offset, next_offset, bytes FROM partitions"
                             " WHERE stream = ? AND partition = ?", (stream, partition)).fetchone()


def _among(offsets: np.ndarray, sorted_drop: np.ndarray) -> np.ndarray:
    """Which of `offsets` are in `sorted_drop`: one binary search each (np.isin sorts its second
    argument again on every call, once per segment of a partition)."""
    at = np.minimum(np.searchsorted(sorted_drop, offsets), len(sorted_drop) - 1)
    return sorted_drop[at] == offsets


def _offsets(base: int, batch: pa.RecordBatch) -> np.ndarray:
    if OFFSET in batch.schema.names:
        return batch.column(OFFSET).to_numpy(zero_copy_only=False).astype(np.int64)
    return np.arange(base, base + batch.num_rows, dtype=np.int64)


def _changes(base: int, batch: pa.RecordBatch, key_field: str) -> list[Change]:
    names = batch.schema.names
    n = batch.num_rows
    keys = batch.column(key_field).to_pylist() if key_field in names else [None] * n
    ops = batch.column(OP_FIELD).to_pylist() if OP_FIELD in names else [None] * n
    times = batch.column(INGEST_TIME).to_pylist()
    return [Change(int(o), k, op == DELETE, t) for o, k, op, t in zip(_offsets(base, batch), keys, ops, times)]

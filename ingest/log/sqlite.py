"""Embedded log backend: one SQLite file in WAL mode, segments of Arrow record batches.

Why SQLite: it is a real, crash-safe embedded store (an append is one transaction, so a
failed request leaves nothing half-written), WAL lets the pipeline read while the API
writes, and it needs no server. Why segments: storing each append as one Arrow batch,
as Kafka stores record batches, makes reads sequential and zero-parse.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from catalog import StreamDef
from ingest.events import Event
from ingest.log.base import (
    AppendResult, EventLog, LogUnavailable, PartitionOffsets, PositionConflict, TopicMismatch,
)
from ingest.log import sqlite_compaction as compaction
from ingest.log.records import (
    OFFSET, columns_to_batch, decode_segment, encode_segment, events_to_batch, project, restamped_segment,
    with_ingest_time, with_offsets,
)
from ingest.partitioner import assign_partitions, assign_partitions_columnar

MAX_SEGMENT_RECORDS = 20_000

# The page size of a log file made new (SQLite fixes it when the file is made: one made before
# keeps its own, and reads and appends alike). A segment is one blob of ~45 bytes an event, so
# appends at line rate write hundreds of KB each: with SQLite's default 4 KiB pages every page is
# a write-ahead log frame of its own (a header, a checksum, a write). 16 KiB pages took ~13 % off
# the appends' CPU (2 M events in appends of 10 000: 1.20-1.23 -> 1.00-1.13 s; 64 KiB no more);
# appends of 100 events and the reads cost the same within the spread.
# `python -m bench.log_pages` (docs/benchmarks.md, session 74).
PAGE_SIZE = 16_384

# A partition's `bytes`: what retention by size weighs, read from one row. Summing the segments
# instead read every segment of every partition once a minute, under the log's write lock: ~300 ms
# at 14 minutes of 20 000 events/s, and growing with the log until the size cap (1 GiB a partition),
# while every append waited (docs/benchmarks.md, session 88). Appends add to it, retention and
# compaction take off what they drop. NULL where a log made before the column has not yet been
# weighed: the first retention pass sums its segments once.
BYTES_COLUMN = "bytes"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (
    stream TEXT PRIMARY KEY,
    partitions INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS partitions (
    stream TEXT NOT NULL,
    partition INTEGER NOT NULL,
    start_offset INTEGER NOT NULL DEFAULT 0,
    next_offset INTEGER NOT NULL DEFAULT 0,
    -- The bytes of the partition's segments, kept by every write (BYTES_COLUMN).
    bytes INTEGER,
    PRIMARY KEY (stream, partition)
);
CREATE TABLE IF NOT EXISTS segments (
    stream TEXT NOT NULL,
    partition INTEGER NOT NULL,
    base_offset INTEGER NOT NULL,
    record_count INTEGER NOT NULL,
    max_ingest_ms INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    data BLOB NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS segments_by_offset ON segments (stream, partition, base_offset);
-- Changelog tables (kind: table): compacted (ingest/log/compaction.py) instead of dropped by age.
CREATE TABLE IF NOT EXISTS compacted_topics (
    stream TEXT PRIMARY KEY,
    key_field TEXT NOT NULL,
    tombstone_retention_ms INTEGER NOT NULL
);
-- Change data capture (ingest/cdc/): how far each source's changes are in the log, written in
-- the transaction of the append that carries them (append_at).
CREATE TABLE IF NOT EXISTS source_positions (
    source TEXT PRIMARY KEY,
    position TEXT NOT NULL,
    updated_ms INTEGER NOT NULL
);
"""


class SqliteEventLog(EventLog):
    def __init__(self, path: str | Path, *, synchronous: str = "NORMAL", busy_timeout_s: float = 30.0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # One connection per instance guarded by a lock: SQLite serialises writers anyway.
        self._conn = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
        self._conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # before WAL: a new file's, else nothing
        self._conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode survives any process crash; FULL also survives power loss.
        self._conn.execute(f"PRAGMA synchronous={synchronous}")
        self._lock = threading.Lock()
        self._round_robin = 0
        # {(stream, partition): (its state, when a pass may next drop)} of table partitions a
        # compaction pass left nothing to drop in: skipped until either changes (sqlite_compaction.py)
        self._compaction_quiet: dict[tuple[str, int], tuple[tuple, int | None]] = {}
        # {(stream, partition): what the last complete pass kept}, so that the next one reads only
        # the segments appended since (sqlite_compaction.py)
        self._compaction_kept: dict[tuple[str, int], compaction.LastPass] = {}
        with self._lock:
            self._conn.executescript(_SCHEMA)
            if BYTES_COLUMN not in _columns(self._conn, "partitions"):
                with _transaction(self._conn):  # another process may add it first: look again under the lock
                    if BYTES_COLUMN not in _columns(self._conn, "partitions"):
                        self._conn.execute(f"ALTER TABLE partitions ADD COLUMN {BYTES_COLUMN} INTEGER")

    # -- topics -------------------------------------------------------------------------

    def ensure_topic(self, stream: StreamDef) -> None:
        with self._lock, _transaction(self._conn):
            row = self._conn.execute("SELECT partitions FROM topics WHERE stream = ?", (stream.name,)).fetchone()
            if row and row[0] > stream.partitions:
                raise TopicMismatch(
                    f"stream {stream.name!r} has {row[0]} partitions in the log; its partition count"
                    f" can grow but not shrink (configured: {stream.partitions})"
                )
            self._conn.execute(
                "INSERT INTO topics (stream, partitions, created_at_ms) VALUES (?, ?, strftime('%s','now') * 1000)"
                " ON CONFLICT (stream) DO UPDATE SET partitions = excluded.partitions",
                (stream.name, stream.partitions),
            )
            self._conn.executemany(
                "INSERT OR IGNORE INTO partitions (stream, partition, bytes) VALUES (?, ?, 0)",
                [(stream.name, p) for p in range(stream.partitions)],
            )
            compaction.register(self._conn, stream)

    # -- writing ------------------------------------------------------------------------

    def append(self, stream: StreamDef, events: Sequence[Event], ingest_time_ms: int) -> AppendResult:
        if not events:
            return AppendResult({})
        return self._append_events(stream, events, ingest_time_ms, None)

    def append_at(self, stream: StreamDef, events: Sequence[Event], ingest_time_ms: int, source: str,
                  position: str, expected: str | None) -> AppendResult:
        return self._append_events(stream, events, ingest_time_ms, (source, position, expected))

    def source_position(self, source: str) -> str | None:
        with self._lock:
            row = self._conn.execute("SELECT position FROM source_positions WHERE source = ?", (source,)).fetchone()
        return None if row is None else row[0]

    def _append_events(self, stream: StreamDef, events: Sequence[Event], ingest_time_ms: int,
                       position: tuple[str, str, str | None] | None) -> AppendResult:
        by_partition: dict[int, list[Event]] = defaultdict(list)
        with self._lock:  # the round-robin counter is shared with concurrent appends
            targets, self._round_robin = assign_partitions([e.key for e in events], stream.partitions,
                                                           self._round_robin)
        for event, partition in zip(events, targets, strict=True):
            by_partition[partition].append(event)
        # Encode outside the lock: it is the expensive part and touches no shared state.
        encoded: dict[int, list[tuple[int, bytes]]] = {}
        for partition, group in by_partition.items():
            encoded[partition] = [
                (len(chunk), encode_segment(events_to_batch(stream, chunk, ingest_time_ms)))
                for chunk in _chunks(group, MAX_SEGMENT_RECORDS)
            ]
        try:
            return self._append_encoded(stream, encoded, ingest_time_ms, position)
        except sqlite3.OperationalError as exc:  # disk full, I/O error, locked past the busy timeout
            raise LogUnavailable(f"the embedded log ({self.path}) cannot write, nothing was appended: {exc}") from exc

    def append_columns(self, stream: StreamDef, columns: pa.Table, ingest_time_ms: int) -> AppendResult:
        """The columns split by partition with Arrow's take, no event objects: the same segments
        `append` writes for the same events."""
        if columns.num_rows == 0:
            return AppendResult({})
        return self._append_tables(stream, columns, [columns.num_rows], ingest_time_ms)[0]

    def append_column_groups(self, stream: StreamDef, tables: Sequence[pa.Table],
                             ingest_time_ms: int) -> list[AppendResult]:
        """All the tables in one transaction and one segment a partition: all or none is written.
        A transaction and a segment cost the same ~1 ms whatever their size, a third of a
        1 000-event append (docs/benchmarks.md, session 84)."""
        if not tables:
            return []
        columns = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        if columns.num_rows == 0:
            return [AppendResult({}) for _ in tables]
        return self._append_tables(stream, columns, [table.num_rows for table in tables], ingest_time_ms)

    def _append_tables(self, stream: StreamDef, columns: pa.Table, pieces: list[int],
                       ingest_time_ms: int) -> list[AppendResult]:
        """`columns`, made of `pieces` appends' rows in their order, appended at once; each piece's
        ranges as if appended one after another (a partition's rows keep their order below)."""
        batch = columns_to_batch(stream, columns, ingest_time_ms)
        keys = batch.column(stream.key_field) if stream.key_field else None
        with self._lock:  # the round-robin counter is shared with concurrent appends
            targets, self._round_robin = assign_partitions_columnar(keys, batch.num_rows, stream.partitions,
                                                                     self._round_robin)
        encoded: dict[int, list[tuple[int, bytes]]] = {}
        # Rows of a partition keep their order. As bytes (a stream has at most 256 partitions, catalog/model.py)
        # numpy sorts them stably by radix: ~33 against ~130 us for 10 000 rows as int64s (docs/benchmarks.md).
        order = np.argsort(targets.astype(np.uint8), kind="stable")
        bounds = np.searchsorted(targets[order], np.arange(stream.partitions + 1))
        # One take into partition order, then a zero-copy slice per partition (a take per
        # partition was a kernel call per column and partition: ~0.5 ms of a 1 000-event request).
        by_partition = batch.take(pa.array(order)) if stream.partitions > 1 else batch
        stamps = self._append_times(stream.name, ingest_time_ms)
        for partition in range(stream.partitions):
            lo, hi = int(bounds[partition]), int(bounds[partition + 1])
            if hi == lo:
                continue
            part = by_partition.slice(lo, hi - lo)
            if stamps.get(partition, ingest_time_ms) != ingest_time_ms:
                part = with_ingest_time(part, stamps[partition])
            encoded[partition] = [
                (min(MAX_SEGMENT_RECORDS, part.num_rows - start),
                 encode_segment(part.slice(start, MAX_SEGMENT_RECORDS)))
                for start in range(0, part.num_rows, MAX_SEGMENT_RECORDS)
            ]
        try:
            result = self._append_encoded(stream, encoded, ingest_time_ms, stamped=stamps)
        except sqlite3.OperationalError as exc:
            raise LogUnavailable(f"the embedded log ({self.path}) cannot write, nothing was appended: {exc}") from exc
        return [result] if len(pieces) == 1 else _split_ranges(result, targets, pieces, stream.partitions)

    def _append_times(self, stream: str, ingest_time_ms: int) -> dict[int, int]:
        """The append time each partition's records would carry if appended now (see
        `_append_encoded`), read before they are encoded. With several writers (the ingest worker
        processes) another one has often appended at a later time meanwhile: a segment encoded
        with the earlier time was decoded and encoded again in the transaction, ~4 % of a worker
        (docs/benchmarks.md, session 87). A guess overtaken before the transaction still is."""
        try:
            with self._lock:
                heads = self._partition_heads(stream)
        except sqlite3.OperationalError:
            return {}  # a guess only: the transaction reads them again, and says what is wrong
        return {p: _append_time(ingest_time_ms, last) for p, (_, last) in heads.items()}

    def _append_encoded(self, stream: StreamDef, encoded: dict[int, list[tuple[int, bytes]]],
                        ingest_time_ms: int, position: tuple[str, str, str | None] | None = None,
                        stamped: Mapping[int, int] | None = None) -> AppendResult:
        """The encoded segments by partition written in one transaction. `stamped`: the append
        time a partition's segments already carry, when not `ingest_time_ms`."""
        ranges: dict[int, tuple[int, int]] = {}
        sizes: dict[int, int] = {}
        segments: list[tuple] = []
        with self._lock, _transaction(self._conn):
            if position is not None:
                self._record_position(*position, ingest_time_ms)
            heads = self._partition_heads(stream.name)
            for partition, parts in sorted(encoded.items()):
                if partition not in heads:
                    raise KeyError(f"stream {stream.name!r} has no partition {partition} in the log")
                offset = first = heads[partition][0]
                # The append time of records appended now: never before the partition's last
                # append's. Two POSTs read the clock before they take the log (or the clock steps
                # back): the later append would otherwise carry the earlier time, and what orders
                # by append time (a table key's newest change, batches cut at one append time)
                # would disagree with the log's order.
                at = _append_time(ingest_time_ms, heads[partition][1])
                carried = (stamped or {}).get(partition, ingest_time_ms)
                for count, data in parts:
                    if at != carried:
                        data = restamped_segment(data, at)
                    segments.append((stream.name, partition, offset, count, at, len(data), data))
                    sizes[partition] = sizes.get(partition, 0) + len(data)
                    offset += count
                ranges[partition] = (first, offset - first)
            # One statement each for all the partitions' segments and offsets: the statements a
            # partition at a time were ~0.4 ms of a 1 000-event append in 4 partitions.
            self._conn.executemany(
                "INSERT INTO segments (stream, partition, base_offset, record_count, max_ingest_ms, bytes, data)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)", segments)
            self._conn.executemany(
                "UPDATE partitions SET next_offset = ?, bytes = bytes + ? WHERE stream = ? AND partition = ?",
                [(first + n, sizes.get(p, 0), stream.name, p) for p, (first, n) in ranges.items()])
        return AppendResult(ranges)

    def _partition_heads(self, stream: str) -> dict[int, tuple[int, int | None]]:
        """Per partition of `stream`: its next offset and its last segment's append time (None
        when it has none), in one statement."""
        return {p: (next_offset, last) for p, next_offset, last in self._conn.execute(
            "SELECT p.partition, p.next_offset, (SELECT s.max_ingest_ms FROM segments s WHERE s.stream = p.stream"
            " AND s.partition = p.partition ORDER BY s.base_offset DESC LIMIT 1) FROM partitions p WHERE p.stream = ?",
            (stream,))}

    def _record_position(self, source: str, position: str, expected: str | None, now_ms: int) -> None:
        row = self._conn.execute("SELECT position FROM source_positions WHERE source = ?", (source,)).fetchone()
        if (row[0] if row else None) != expected:
            raise PositionConflict(f"source {source!r} is at {row[0] if row else None!r} in the log, not at the"
                                   f" expected {expected!r}: another writer follows it")
        self._conn.execute("INSERT INTO source_positions (source, position, updated_ms) VALUES (?, ?, ?)"
                           " ON CONFLICT (source) DO UPDATE SET position = excluded.position,"
                           " updated_ms = excluded.updated_ms", (source, position, now_ms))

    # -- reading ------------------------------------------------------------------------

    def offsets(self, stream: str) -> Mapping[int, PartitionOffsets]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT partition, start_offset, next_offset FROM partitions WHERE stream = ? ORDER BY partition",
                (stream,),
            ).fetchall()
        return {p: PartitionOffsets(start, end) for p, start, end in rows}

    def read(self, stream: StreamDef, partition: int, start: int, end: int) -> Iterator[pa.RecordBatch]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT base_offset, record_count, data FROM segments"
                " WHERE stream = ? AND partition = ? AND base_offset < ? AND base_offset >="
                " COALESCE((SELECT MAX(base_offset) FROM segments"
                "           WHERE stream = ? AND partition = ? AND base_offset <= ?), 0)"
                " ORDER BY base_offset",
                (stream.name, partition, end, stream.name, partition, start),
            ).fetchall()
        for base, count, data in rows:
            lo, hi = max(start, base), min(end, base + count)
            if lo >= hi:
                continue
            segment = decode_segment(data)
            if OFFSET in segment.schema.names:  # compacted: its records keep their own offsets
                offsets = segment.column(OFFSET)
                inside = pc.and_(pc.greater_equal(offsets, lo), pc.less(offsets, hi))
                batch = project(segment, stream).filter(inside)
                if batch.num_rows:
                    yield with_offsets(offsets.filter(inside), batch)
                continue
            batch = project(segment, stream).slice(lo - base, hi - lo)
            yield with_offsets(range(lo, hi), batch)

    def ingest_time_ms(self, stream: str, partition: int, offset: int) -> int | None:
        # Every segment is one append with one ingest time, so the segment holding the offset
        # knows it exactly, without decoding the batch (one index lookup).
        with self._lock:
            row = self._conn.execute(
                "SELECT base_offset, record_count, max_ingest_ms FROM segments"
                " WHERE stream = ? AND partition = ? AND base_offset <= ? ORDER BY base_offset DESC LIMIT 1",
                (stream, partition, offset),
            ).fetchone()
        if row is None or offset >= row[0] + row[1]:
            return None
        return row[2]

    def first_appended_after(self, stream: str, starts: Mapping[int, int], cut_ms: int) -> dict[int, int | None]:
        # A segment is one append with one time (compaction filters records inside a segment,
        # never merges segments): the first segment from the start appended after the cut holds
        # the answer, its first record, from the segment's index without decoding it.
        out: dict[int, int | None] = {}
        with self._lock:
            for partition, start in starts.items():
                row = self._conn.execute(
                    "SELECT base_offset FROM segments"
                    " WHERE stream = ? AND partition = ? AND base_offset + record_count > ? AND max_ingest_ms > ?"
                    " AND base_offset >= COALESCE((SELECT MAX(base_offset) FROM segments"
                    "                              WHERE stream = ? AND partition = ? AND base_offset <= ?), 0)"
                    " ORDER BY base_offset LIMIT 1",
                    (stream, partition, start, cut_ms, stream, partition, start),
                ).fetchone()
                out[partition] = None if row is None else max(start, row[0])
        return out

    def segment_at(self, stream: str, partition: int, offset: int) -> tuple[int, int] | None:
        """(first offset, end offset) of the segment holding `offset`, or of the first segment
        after it; None when there is none. Lets a reader step over a segment it cannot decode."""
        with self._lock:
            row = self._conn.execute(
                "SELECT base_offset, base_offset + record_count FROM segments"
                " WHERE stream = ? AND partition = ? AND base_offset <= ? AND base_offset + record_count > ?"
                " ORDER BY base_offset DESC LIMIT 1",
                (stream, partition, offset, offset),
            ).fetchone() or self._conn.execute(
                "SELECT base_offset, base_offset + record_count FROM segments"
                " WHERE stream = ? AND partition = ? AND base_offset > ? ORDER BY base_offset LIMIT 1",
                (stream, partition, offset),
            ).fetchone()
        return None if row is None else (row[0], row[1])

    # -- retention ----------------------------------------------------------------------

    def compact(self, now_ms: int, read_through: Mapping[str, Mapping[int, int]] | None = None) -> int:
        """One compaction pass over every table's partitions (ingest/log/sqlite_compaction.py)."""
        return compaction.compact(self, now_ms, read_through)

    def apply_retention(self, now_ms: int, max_age_ms: int, max_bytes_per_partition: int) -> int:
        dropped = 0
        with self._lock, _transaction(self._conn):
            # A table's partitions are compacted, never cut by age or size: its old rows are its state.
            parts = self._conn.execute("SELECT stream, partition, bytes FROM partitions"
                                       " WHERE stream NOT IN (SELECT stream FROM compacted_topics)").fetchall()
            for stream, partition, total in parts:
                if total is None:  # a log made before the column: weighed once (BYTES_COLUMN)
                    total = self._conn.execute("SELECT COALESCE(SUM(bytes), 0) FROM segments"
                                               " WHERE stream = ? AND partition = ?", (stream, partition)).fetchone()[0]
                    self._conn.execute("UPDATE partitions SET bytes = ? WHERE stream = ? AND partition = ?",
                                       (total, stream, partition))
                cut, records, size = _retention_cut(self._conn, stream, partition, total, now_ms - max_age_ms,
                                                    max_bytes_per_partition)
                if cut is None:
                    continue
                dropped += records
                self._conn.execute(
                    "DELETE FROM segments WHERE stream = ? AND partition = ? AND base_offset < ?",
                    (stream, partition, cut),
                )
                self._conn.execute(
                    "UPDATE partitions SET start_offset = MAX(start_offset, ?), bytes = bytes - ?"
                    " WHERE stream = ? AND partition = ?",
                    (cut, size, stream, partition),
                )
        return dropped

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class _transaction:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any error (nothing half-written)."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                self.conn.execute("COMMIT")
                return
            except sqlite3.Error:
                self._rollback()  # a COMMIT that failed (disk full) leaves nothing half-written either
                raise
        self._rollback()

    def _rollback(self) -> None:
        # After SQLITE_FULL or an I/O error SQLite may have rolled the transaction back already.
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")


def _retention_cut(conn: sqlite3.Connection, stream: str, partition: int, total_bytes: int, oldest_kept_ms: int,
                   max_bytes: int) -> tuple[int | None, int, int]:
    """(the offset below which a partition's segments go, their records, their bytes), or (None, 0, 0)
    when none goes. A segment goes when it was appended before `oldest_kept_ms`, or when it and the
    newer ones weigh more than `max_bytes` (the newest one stays whatever its size).

    Read from the oldest segment on, and only as far as the first that stays: a partition's append
    times never go back (`_append_time`), so the segments before a young one are the only ones that
    can be too old. A pass once a minute reads what it drops and one segment more, not the whole
    partition (BYTES_COLUMN)."""
    newest = conn.execute("SELECT MAX(base_offset) FROM segments WHERE stream = ? AND partition = ?",
                          (stream, partition)).fetchone()[0]
    cut, records, size = None, 0, 0
    oldest_first = conn.execute("SELECT base_offset, record_count, max_ingest_ms, bytes FROM segments"
                                " WHERE stream = ? AND partition = ? ORDER BY base_offset", (stream, partition))
    try:
        for base, count, appended_ms, segment_bytes in oldest_first:
            too_big = total_bytes - size > max_bytes and base != newest
            if appended_ms >= oldest_kept_ms and not too_big:
                break
            cut, records, size = base + count, records + count, size + segment_bytes
    finally:
        oldest_first.close()  # read no further: the rest stays
    return cut, records, size


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def _chunks(items: list, size: int) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _append_time(ingest_time_ms: int, last: int | None) -> int:
    """The append time of records appended now to a partition whose last append's was `last`
    (None: none yet): never before it (`_append_encoded` says why)."""
    return ingest_time_ms if last is None else max(ingest_time_ms, last)


def _split_ranges(result: AppendResult, targets: np.ndarray, pieces: list[int], partitions: int) -> list[AppendResult]:
    """Each piece's share of `result`: in a partition, a piece's records follow those of the
    pieces before it (`targets`: each row's partition, the pieces' rows one after another)."""
    ends = np.cumsum(pieces)
    counts = [np.bincount(targets[end - rows:end], minlength=partitions) for rows, end in zip(pieces, ends)]
    next_offset = {p: first for p, (first, _) in result.ranges.items()}
    results = []
    for per_partition in counts:
        ranges = {}
        for p in next_offset:
            n = int(per_partition[p])
            if n:
                ranges[p] = (next_offset[p], n)
                next_offset[p] += n
        results.append(AppendResult(ranges))
    return results

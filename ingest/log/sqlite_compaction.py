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

A partition written to is not read whole either (SqliteEventLog._compaction_kept): a pass that
completes (every rewrite made, nothing appended meanwhile) leaves what it kept (compaction.KeptKeys:
each key's newest offset, its tombstones), and the next pass decodes only the segments appended
since and those holding the records they supersede, deciding as a pass over every record would
(the property tests/unit/test_tables.py checks). It reads everything again when the partition
was not only appended to since: its start moved, or it weighs less than what was kept plus what
was appended (another pass took bytes away).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from catalog import StreamDef
from catalog.tables import DELETE, OP_FIELD, tombstone_retention_ms
from ingest.log.compaction import Change, KeptKeys, offsets_to_drop
from ingest.log.records import INGEST_TIME, OFFSET, decode_segment, encode_segment

if TYPE_CHECKING:
    from ingest.log.sqlite import SqliteEventLog

# Keys whose newest offsets a log keeps between passes, over all its table partitions (~130 bytes
# a key in Python: ~260 MB at most): a partition that would go past it is compacted by full
# passes, reading every segment, as every pass did before session 90.
KEPT_KEYS_LIMIT = 2_000_000


@dataclass(frozen=True)
class LastPass:
    """What a table partition's last complete pass left (SqliteEventLog._compaction_kept): the key
    field it was compacted by, the partition's start offset and weight after it, and what it kept."""

    key_field: str
    start_offset: int
    weight: int
    kept: KeptKeys


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
    with log._lock:
        tables = log._conn.execute(
            "SELECT t.stream, t.key_field, t.tombstone_retention_ms, p.partition FROM compacted_topics t"
            " JOIN partitions p ON p.stream = t.stream ORDER BY t.stream, p.partition").fetchall()
    dropped = 0
    for stream, key_field, retention_ms, partition in tables:
        through = (read_through or {}).get(stream, {}).get(partition)
        dropped += _compact_partition(log, stream, partition, key_field, retention_ms, through, now_ms)
    return dropped


def _compact_partition(log: SqliteEventLog, stream: str, partition: int, key_field: str, retention_ms: int,
                       through: int | None, now_ms: int) -> int:
    from ingest.log.sqlite import _transaction

    where = (stream, partition)
    with log._lock:
        # Read before the segments, so that a write between the two reads makes it differ next time.
        position = _position(log, stream, partition)
        state = (key_field, retention_ms, through, *position)
        quiet = log._compaction_quiet.get(where)
        if quiet is not None and quiet[0] == state and (quiet[1] is None or now_ms < quiet[1]):
            return 0
        # Taken out: put back only by a pass that completes (a failed one leaves a full pass next).
        last = log._compaction_kept.pop(where, None)
        kept = last.kept if _only_appended_since(last, key_field, position) else None
        segments = _segments_from(log, stream, partition, kept.end_offset if kept is not None else None)
        if kept is not None and last.weight + sum(size for _, _, size, _ in segments) != position[2]:
            kept = None  # some bytes went meanwhile: another pass's (its own or another process's)
            segments = _segments_from(log, stream, partition, None)
    decoded = [(base, count, size, decode_segment(data)) for base, count, size, data in segments]
    changes = [change for base, _, _, batch in decoded for change in _changes(base, batch, key_field)]
    if kept is None:  # a full pass
        drop = offsets_to_drop(changes, now_ms=now_ms, tombstone_retention_ms=retention_ms, read_through=through)
        survivors = [c for c in changes if c.offset not in drop]
        # Past the limit only the tombstones (for next_drop_ms), not a dict of every key to be dropped.
        keepable = _room_for(log, where, len(survivors))
        kept = KeptKeys.of(survivors if keepable else [c for c in survivors if c.tombstone], position[1])
    else:  # the records appended since the last complete pass, against what it kept
        keepable = True
        kept_below = kept.end_offset
        drop = kept.drop_with(changes, position[1], now_ms=now_ms, tombstone_retention_ms=retention_ms,
                              read_through=through)
        decoded += _segments_holding(log, stream, partition, sorted(o for o in drop if o < kept_below))
    if not drop:
        log._compaction_quiet[where] = (
            state, kept.next_drop_ms(tombstone_retention_ms=retention_ms, read_through=through))
        if keepable:
            _keep(log, where, key_field, position, kept)
        return 0
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
        survivors = batch.drop_columns([OFFSET]) if OFFSET in batch.schema.names else batch
        survivors = survivors.filter(pa.array(keep)).append_column(OFFSET, pa.array(offsets[keep], pa.int64()))
        rewrites.append((base, size, batch.num_rows, encode_segment(survivors), survivors.num_rows))
    dropped = 0
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
        # Nothing appended meanwhile and every rewrite made: what is left is what `kept` says.
        if not skipped and after_pass[:2] == position[:2]:
            log._compaction_quiet[where] = (
                (key_field, retention_ms, through, *after_pass),
                kept.next_drop_ms(tombstone_retention_ms=retention_ms, read_through=through))
            if keepable:
                _keep(log, where, key_field, after_pass, kept)
    return dropped


def _only_appended_since(last: LastPass | None, key_field: str, position) -> bool:
    """Whether the last complete pass's KeptKeys may stand for the partition's records below its
    end: the same key field and start, and (checked with the segments appended since) the weight it left."""
    return (last is not None and position[2] is not None and last.key_field == key_field
            and last.start_offset == position[0] and last.kept.end_offset <= position[1])


def _room_for(log: SqliteEventLog, where: tuple[str, int], keys: int) -> bool:
    """Whether the log may keep `keys` more for `where`, beside what it keeps for its other partitions."""
    others = sum(len(last.kept.newest) for at, last in log._compaction_kept.items() if at != where)
    return others + keys <= KEPT_KEYS_LIMIT


def _keep(log: SqliteEventLog, where: tuple[str, int], key_field: str, position, kept: KeptKeys) -> None:
    """Remember what a complete pass kept, unless that takes the log past the keys it keeps in memory."""
    if position[2] is not None and _room_for(log, where, len(kept.newest)):
        log._compaction_kept[where] = LastPass(key_field, position[0], position[2], kept)


def _segments_from(log: SqliteEventLog, stream: str, partition: int, base: int | None) -> list[tuple]:
    """(base offset, records, bytes, data) of the partition's segments from `base` on (None: all)."""
    return log._conn.execute(
        "SELECT base_offset, record_count, bytes, data FROM segments WHERE stream = ? AND partition = ?"
        " AND base_offset >= ? ORDER BY base_offset", (stream, partition, -1 if base is None else base)).fetchall()


def _segments_holding(log: SqliteEventLog, stream: str, partition: int, offsets: list[int]) -> list[tuple]:
    """The segments holding the sorted `offsets`, decoded: (base offset, records, bytes, batch). A
    segment holds the offsets from its base to the next one's (a rewrite keeps its base), so each
    segment costs two index lookups, whatever the number of its offsets asked for."""
    where = "FROM segments WHERE stream = ? AND partition = ? AND base_offset"
    rows, i = [], 0
    with log._lock:
        while i < len(offsets):
            offset = offsets[i]
            row = log._conn.execute(f"SELECT base_offset, record_count, bytes, data {where} <= ?"
                                    " ORDER BY base_offset DESC LIMIT 1", (stream, partition, offset)).fetchone()
            following = log._conn.execute(f"SELECT MIN(base_offset) {where} > ?", (stream, partition, offset)
                                          ).fetchone()[0]
            if row is not None:
                rows.append(row)
            while i < len(offsets) and (following is None or offsets[i] < following):
                i += 1
    return [(base, count, size, decode_segment(data)) for base, count, size, data in rows]


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

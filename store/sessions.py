"""The open session windows of streams declaring `sessions: {key, gap}` (catalog/features.py,
aggregates/session_window.py is the rule, aggregates/session_batch.py runs it in the pane batch).

Per stream and key: the sessions not closed yet (first event, last event, events). Written in
the batch's own store transaction, with its panes and its batch id: a batch replayed after a
crash is either wholly recorded (skipped by its batch id) or not at all, so no session is
emitted twice or lost across a restart. A session leaves this state when the stream's watermark
passes its last event + gap (it is then emitted as a partial of `<stream>_sessions` in the same
transaction): the state holds the sessions of the last `allowed_lateness + gap` of event time.

Stored in buckets, not a row per session: a busy stream's batch touches most of its open
sessions (every active user's grows), and a row each cost SQLite ~5 us a session of B-tree work
in the table and its index on the last event. A key's bucket is the CRC-32 of its UTF-8 bytes
modulo the stream's bucket count, a power of two sized to hold ~BUCKET_SESSIONS sessions each;
the count is changed (every bucket of the stream rewritten) when the sessions outgrow it or
shrink far below it. Each bucket row says its oldest last event, so the sessions due to close
are found without reading the others. A bucket's own cost (decode, encode, a row: ~40 us) is
most of a batch's, so buckets are large: lookup + commit at 50 000 open sessions take ~80-120 ms
for a batch touching them all (rows: ~460 ms), ~30 ms for 5 000 keys (~44), but ~12-20 ms for
150 keys (~2) (docs/benchmarks.md, session 56).

Pure, apart from `lookup`, `apply`, `sizes` and `fold_old_rows`, which take a DB-API cursor and
the backend's placeholder.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sketches.crc32 import crc32_of_strings

SESSION_TABLES = """
CREATE TABLE IF NOT EXISTS session_buckets (
    stream TEXT NOT NULL,
    bucket INTEGER NOT NULL,         -- crc32 of the session key's UTF-8 bytes modulo `buckets`
    buckets INTEGER NOT NULL,        -- the stream's bucket count (as session_streams says)
    sessions INTEGER NOT NULL,       -- open sessions in the bucket (an emptied bucket's row is deleted)
    oldest_last_ms INTEGER NOT NULL, -- their smallest last event time: the bucket holds a due session iff <= due
    body BLOB NOT NULL,              -- the sessions, an Arrow IPC stream of BODY_SCHEMA (last: read only when asked)
    PRIMARY KEY (stream, bucket)
);
CREATE INDEX IF NOT EXISTS session_buckets_by_due ON session_buckets (stream, oldest_last_ms);
CREATE TABLE IF NOT EXISTS session_streams (
    stream TEXT PRIMARY KEY,
    buckets INTEGER NOT NULL,        -- how many buckets the stream's open sessions are spread over
    sessions INTEGER NOT NULL        -- its open sessions (a row with none is deleted)
);
"""
OLD_TABLE = "session_open"  # a row per session, before the buckets (folded into them at start)
BODY_SCHEMA = pa.schema([("session_key", pa.string()), ("first_ms", pa.int64()), ("last_ms", pa.int64()),
                         ("events", pa.int64())])
MIN_BUCKETS = 16
BUCKET_SESSIONS = 512  # sessions a bucket is sized to hold: a small batch rewrites ~this many per key it touches


@dataclass(frozen=True, order=True)
class Session:
    """A key's session: its first and last event times and how many events it holds; also a
    batch's run (its events of one key with no gap of `gap` or more between consecutive ones)."""

    key: str
    first_ms: int
    last_ms: int
    events: int


class SessionColumns(Sequence[Session]):
    """Sessions held as four columns: what the batch path reads, decides and writes without an
    object per key (tens of thousands of open sessions per batch: building, hashing and sorting
    a dataclass per key cost more than the store's own work). It reads as a sequence of Session
    in its given order, and equals any sequence of the same sessions in that order."""

    __slots__ = ("keys", "first_ms", "last_ms", "events")

    def __init__(self, keys: Sequence[str] = (), first_ms: Sequence[int] = (), last_ms: Sequence[int] = (),
                 events: Sequence[int] = ()):
        self.keys, self.first_ms, self.last_ms, self.events = list(keys), list(first_ms), list(last_ms), list(events)
        if not len(self.keys) == len(self.first_ms) == len(self.last_ms) == len(self.events):
            raise ValueError("session columns of different lengths")

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return SessionColumns(self.keys[i], self.first_ms[i], self.last_ms[i], self.events[i])
        return Session(self.keys[i], self.first_ms[i], self.last_ms[i], self.events[i])

    def __iter__(self):
        return (Session(*row) for row in self.rows())

    def __eq__(self, other) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None

    def __repr__(self) -> str:
        return f"SessionColumns({list(self)!r})"

    def rows(self):
        """(key, first_ms, last_ms, events) tuples, without a Session each."""
        return zip(self.keys, self.first_ms, self.last_ms, self.events, strict=True)


@dataclass(frozen=True)
class SessionCommit:
    """What a batch changes in one stream's open sessions, saved in its transaction."""

    stream: str
    removed: Sequence[Session] = ()  # stored open sessions that closed or merged into another
    kept: Sequence[Session] = ()  # open sessions to store: new or grown


def bucket_count(sessions: int) -> int:
    """The buckets for this many open sessions: a power of two, at least MIN_BUCKETS, about
    BUCKET_SESSIONS sessions each."""
    wanted = max(MIN_BUCKETS, -(-sessions // BUCKET_SESSIONS))
    return 1 << (wanted - 1).bit_length()


def outgrown(sessions: int, buckets: int) -> bool:
    """Whether the stream's sessions should be spread anew: more than twice the sessions its
    buckets are sized for, or (above the minimum) fewer than an eighth: one near an edge is not
    spread back and forth batch after batch."""
    return sessions > 2 * BUCKET_SESSIONS * buckets or (buckets > MIN_BUCKETS and 8 * sessions < BUCKET_SESSIONS * buckets)


def buckets_of(keys: pa.Array, buckets: int) -> np.ndarray:
    """Each key's bucket (int64), stable across processes and versions."""
    return (crc32_of_strings(keys) % buckets).astype(np.int64)


def as_table(sessions: Sequence[Session]) -> pa.Table:
    keys, first, last, events = ((sessions.keys, sessions.first_ms, sessions.last_ms, sessions.events)
                                 if isinstance(sessions, SessionColumns) else
                                 ([s.key for s in sessions], [s.first_ms for s in sessions],
                                  [s.last_ms for s in sessions], [s.events for s in sessions]))
    return pa.table([pa.array(keys, pa.string()), pa.array(first, pa.int64()), pa.array(last, pa.int64()),
                     pa.array(events, pa.int64())], schema=BODY_SCHEMA)


def _decoded(rows: Sequence[tuple[int, bytes]]) -> tuple[pa.Table, np.ndarray]:
    """The sessions of (bucket, body) rows in one table, and each session's bucket."""
    batches = [pa.ipc.read_record_batch(pa.py_buffer(body), BODY_SCHEMA) for _, body in rows]
    if not batches:
        return BODY_SCHEMA.empty_table(), np.zeros(0, np.int64)
    of = np.repeat(np.array([b for b, _ in rows], np.int64), [len(b) for b in batches])
    return pa.Table.from_batches(batches, BODY_SCHEMA).combine_chunks(), of


def _layout(cursor, stream: str, q: str) -> tuple[int, int] | None:
    """The stream's bucket count and open sessions, None when it has none."""
    cursor.execute(f"SELECT buckets, sessions FROM session_streams WHERE stream = {q}", (stream,))
    found = cursor.fetchone()
    return None if found is None else (int(found[0]), int(found[1]))


def _set_layout(cursor, stream: str, buckets: int, sessions: int, q: str) -> None:
    if not sessions:
        cursor.execute(f"DELETE FROM session_streams WHERE stream = {q}", (stream,))
        return
    cursor.execute(f"INSERT INTO session_streams (stream, buckets, sessions) VALUES ({q}, {q}, {q})"
                   f" ON CONFLICT (stream) DO UPDATE SET buckets = excluded.buckets, sessions = excluded.sessions",
                   (stream, buckets, sessions))


def _bodies(cursor, stream: str, q: str, buckets: Sequence[int] | None,
            due_ms: int | None = None) -> tuple[pa.Table, np.ndarray]:
    """The sessions of the stream's buckets among `buckets` (None: all), and of those holding a
    session whose last event is at or before `due_ms`, with each one's bucket. Two searches, by
    the primary key and by the due index: SQLite answers one WHERE with both in an OR by walking
    the stream's every bucket (1.6 ms against 0.2 for 150 of 1 024 buckets)."""
    def rows(sql: str, args: tuple) -> list[tuple[int, bytes]]:
        if q == "?":
            cursor.execute(sql, args)
        else:  # PostgreSQL's binary results: its text form of bytea is hex, twice the bytes to decode
            cursor.execute(sql, args, binary=True)
        return [(int(b), bytes(body)) for b, body in cursor.fetchall()]

    if buckets is None:
        return _decoded(rows(f"SELECT bucket, body FROM session_buckets WHERE stream = {q}", (stream,)))
    among, arg = (("bucket IN (SELECT value FROM json_each(?))", json.dumps(list(buckets))) if q == "?"
                  else ("bucket = ANY(%s)", list(buckets)))
    found = rows(f"SELECT bucket, body FROM session_buckets WHERE stream = {q} AND {among}", (stream, arg))
    if due_ms is not None:
        read = set(buckets)
        found += [(b, body) for b, body in rows(f"SELECT bucket, body FROM session_buckets WHERE stream = {q}"
                                                f" AND oldest_last_ms <= {q}", (stream, due_ms)) if b not in read]
    return _decoded(found)


def _in_order(table: pa.Table) -> SessionColumns:
    """(key, first) order: code point order of the keys, which is their UTF-8 bytes' order, as
    Python sorts them (the lookup's contract, whatever the database's collation)."""
    order = pc.sort_indices(table, sort_keys=[("session_key", "ascending"), ("first_ms", "ascending")])
    table = table.take(order)
    return SessionColumns(*(table[c].to_pylist() for c in BODY_SCHEMA.names))


def lookup(cursor, stream: str, keys: Sequence[str], due_through_ms: int | None, placeholder: str) -> SessionColumns:
    """The open sessions of `stream` with a key among `keys`, and every one whose last event is at
    or before `due_through_ms` (they close now, whatever their key); in (key, first) order. Reads
    only the buckets of those keys and the buckets holding a due session."""
    layout = _layout(cursor, stream, placeholder)
    if layout is None:
        return SessionColumns()
    wanted = pc.unique(pa.array(keys, pa.string())) if len(keys) else pa.array([], pa.string())
    table, _ = _bodies(cursor, stream, placeholder, np.unique(buckets_of(wanted, layout[0])).tolist(), due_through_ms)
    found = pc.is_in(table["session_key"], value_set=wanted)
    if due_through_ms is not None:
        found = pc.or_(found, pc.less_equal(table["last_ms"], due_through_ms))
    return _in_order(table.filter(found))


_ID = ["session_key", "first_ms"]  # a session's identity in the state: a grown session keeps its first event


def apply(cursor, commits: Sequence[SessionCommit], placeholder: str) -> None:
    """Save each stream's batch changes; the caller owns the transaction. Each bucket a removed or
    kept session's key is in is read, its removed and rewritten sessions (by key and first event)
    taken out, the kept ones put in, and written back whole; a bucket left empty is deleted.
    Spread anew over `bucket_count` buckets (every bucket rewritten) when the stream has none yet
    or has outgrown its count."""
    q = placeholder
    for c in commits:
        kept, removed = as_table(c.kept), as_table(c.removed)
        if not len(kept) and not len(removed):
            continue
        layout = _layout(cursor, c.stream, q)
        if layout is None:
            _write(cursor, c.stream, kept, None, bucket_count(len(kept)), None, q)
            _set_layout(cursor, c.stream, bucket_count(len(kept)), len(kept), q)
            continue
        buckets, stored = layout
        kept_in = buckets_of(kept["session_key"].combine_chunks(), buckets)
        touched = np.union1d(kept_in, buckets_of(removed["session_key"].combine_chunks(), buckets))
        old, old_in = _bodies(cursor, c.stream, q, touched.tolist())
        # The old sessions that stay: a join on their identity, not a set of strings made per row.
        old = old.append_column("_in", pa.array(old_in))
        changed = pa.concat_tables([kept.select(_ID), removed.select(_ID)])
        staying = old.join(changed, keys=_ID, join_type="left anti", use_threads=False)
        sessions = pa.concat_tables([staying.drop_columns(["_in"]), kept])
        of = np.concatenate([staying["_in"].to_numpy(), kept_in])
        total = stored - len(old) + len(sessions)
        if not outgrown(total, buckets):
            _write(cursor, c.stream, sessions, of, buckets, touched, q)
            _set_layout(cursor, c.stream, buckets, total, q)
            continue
        others, _ = _bodies(cursor, c.stream, q, np.setdiff1d(np.arange(buckets), touched).tolist())
        cursor.execute(f"DELETE FROM session_buckets WHERE stream = {q}", (c.stream,))
        _write(cursor, c.stream, pa.concat_tables([sessions, others]), None, bucket_count(total), None, q)
        _set_layout(cursor, c.stream, bucket_count(total), total, q)


def _write(cursor, stream: str, sessions: pa.Table, of: np.ndarray | None, buckets: int,
           touched: np.ndarray | None, q: str) -> None:
    """Write the buckets among `touched` (None: all `buckets`) as `sessions` (all of theirs and
    only theirs, `of` their buckets: computed when None) leave them."""
    if of is None:
        of = buckets_of(sessions["session_key"].combine_chunks(), buckets) if len(sessions) else np.zeros(0, np.int64)
    rewritten = touched is not None  # else every bucket, whose rows are gone: none to delete
    if touched is None:
        touched = np.arange(buckets)
    order = np.argsort(of, kind="stable")
    of = of[order]
    sessions = pa.RecordBatch.from_arrays([sessions[c].combine_chunks().take(pa.array(order)) for c in BODY_SCHEMA.names],
                                          schema=BODY_SCHEMA)
    los, his = np.searchsorted(of, touched, side="left"), np.searchsorted(of, touched, side="right")
    last = sessions["last_ms"].to_numpy()
    rows, empty = [], []
    for bucket, lo, hi in zip(touched.tolist(), los.tolist(), his.tolist(), strict=True):
        if lo == hi:
            if rewritten:
                empty.append((stream, bucket))
            continue
        rows.append((stream, bucket, buckets, hi - lo, int(last[lo:hi].min()),
                     # one Arrow IPC record batch message, its schema BODY_SCHEMA not written
                     sessions.slice(lo, hi - lo).serialize().to_pybytes()))
    if empty:
        cursor.executemany(f"DELETE FROM session_buckets WHERE stream = {q} AND bucket = {q}", empty)
    if rows:
        cursor.executemany(
            f"INSERT INTO session_buckets (stream, bucket, buckets, sessions, oldest_last_ms, body)"
            f" VALUES ({q}, {q}, {q}, {q}, {q}, {q}) ON CONFLICT (stream, bucket) DO UPDATE SET"
            f" buckets = excluded.buckets, sessions = excluded.sessions, oldest_last_ms = excluded.oldest_last_ms,"
            f" body = excluded.body", rows)


def sizes(cursor) -> dict[str, int]:
    """Open sessions per stream (for status and benchmarks)."""
    cursor.execute("SELECT stream, sessions FROM session_streams")
    return {stream: int(n) for stream, n in cursor.fetchall()}


def fold_old_rows(cursor, placeholder: str) -> None:
    """A store made before the buckets: its open sessions, a row each in `session_open`, written
    into buckets and the old table dropped (in the caller's transaction)."""
    if placeholder == "?":
        cursor.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (OLD_TABLE,))
        exists = cursor.fetchone() is not None
    else:
        cursor.execute("SELECT to_regclass(%s)", (OLD_TABLE,))
        exists = cursor.fetchone()[0] is not None
    if not exists:
        return
    cursor.execute(f"SELECT stream, session_key, first_ms, last_ms, events FROM {OLD_TABLE}")
    by_stream: dict[str, list[Session]] = {}
    for stream, *row in cursor.fetchall():
        by_stream.setdefault(stream, []).append(Session(*row))
    apply(cursor, [SessionCommit(stream, kept=sessions) for stream, sessions in by_stream.items()], placeholder)
    cursor.execute(f"DROP TABLE {OLD_TABLE}")

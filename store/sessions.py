"""The open session windows of streams declaring `sessions: {key, gap}` (catalog/features.py,
aggregates/session_window.py is the rule, aggregates/session_batch.py runs it in the pane batch).

Per stream and key: the sessions not closed yet (first event, last event, events). Written in
the batch's own store transaction, with its panes and its batch id: a batch replayed after a
crash is either wholly recorded (skipped by its batch id) or not at all, so no session is
emitted twice or lost across a restart. A session leaves this state when the stream's watermark
passes its last event + gap (it is then emitted as a partial of `<stream>_sessions` in the same
transaction): the state holds the sessions of the last `allowed_lateness + gap` of event time.

Two layouts, a stream's sessions in one of them at a time, chosen by how many keys its batches
touch against how many sessions it holds (docs/first-seen-membership-sessions.md, docs/benchmarks.md
session 56):

- **rows** (`session_open`, a row per session, indexed by last event): a batch costs ~10-40 us
  per key it touches (SQLite's B-tree work in the table and the index, growing slowly with the
  rows held). Right for live batches touching a few of many sessions.
- **buckets** (`session_buckets`, a stream's sessions spread by the CRC-32 of their key's UTF-8
  bytes over a power of two of buckets of ~BUCKET_SESSIONS each, each one Arrow IPC record batch
  with its oldest last event indexed; `session_streams` says the count): a batch rewrites every
  bucket one of its keys is in, and a bucket's own cost (decode, encode, a row: ~40 us) makes
  that ~0.6 us per session held once most buckets are touched. Right for batches touching a
  large share of the sessions (a backfill's, a busy stream of few users). Lookup + commit:
  50 000 sessions all touched ~125 ms in buckets, ~610 ms as rows; but 1 000 keys of 500 000
  sessions ~145-220 ms in buckets, ~45-58 ms as rows.

A stream moves to the other layout once what that layout would have saved its batches pays for
the move (store/session_layout.py: estimated costs, a ski rental per stream and process), not on
one batch's share of keys: micro-batches of a steady rate vary several-fold in size and moved a
stream back and forth. A batch of fewer than DENSE_FLOOR session changes of a stream held as rows
is written as rows without that reckoning. Each move is one rewrite of the stream's sessions in the
batch's transaction.

Pure, apart from `lookup`, `apply` and `sizes`, which take a DB-API cursor and the backend's
placeholder.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sketches.crc32 import crc32_of_strings
from store.session_layout import LayoutChooser

SESSION_TABLES = """
CREATE TABLE IF NOT EXISTS session_open (
    stream TEXT NOT NULL,
    session_key TEXT NOT NULL,
    first_ms INTEGER NOT NULL,      -- the session's first event time (corrected, as the panes use it)
    last_ms INTEGER NOT NULL,       -- its last event time: it closes when the watermark reaches last_ms + gap
    events INTEGER NOT NULL,
    PRIMARY KEY (stream, session_key, first_ms)
);
CREATE INDEX IF NOT EXISTS session_open_by_last ON session_open (stream, last_ms);
CREATE TABLE IF NOT EXISTS session_buckets (
    stream TEXT NOT NULL,
    bucket INTEGER NOT NULL,         -- crc32 of the session key's UTF-8 bytes modulo `buckets`
    buckets INTEGER NOT NULL,        -- the stream's bucket count (as session_streams says)
    sessions INTEGER NOT NULL,       -- open sessions in the bucket (an emptied bucket's row is deleted)
    oldest_last_ms INTEGER NOT NULL, -- their smallest last event time: the bucket holds a due session iff <= due
    body BLOB NOT NULL,              -- the sessions: one Arrow IPC record batch message of BODY_SCHEMA, no schema
                                     -- message (last column: its pages read only when asked for)
    PRIMARY KEY (stream, bucket)
);
CREATE INDEX IF NOT EXISTS session_buckets_by_due ON session_buckets (stream, oldest_last_ms);
CREATE TABLE IF NOT EXISTS session_streams (
    stream TEXT PRIMARY KEY,
    buckets INTEGER NOT NULL,        -- how many buckets the stream's open sessions are spread over
    sessions INTEGER NOT NULL        -- its open sessions (a row with none is deleted): a stream with a row
                                     -- holds its sessions in buckets, one without in session_open
);
"""
BODY_SCHEMA = pa.schema([("session_key", pa.string()), ("first_ms", pa.int64()), ("last_ms", pa.int64()),
                         ("events", pa.int64())])
MIN_BUCKETS = 16
BUCKET_SESSIONS = 512  # sessions a bucket is sized to hold: a batch rewrites ~this many per key it touches
DENSE_FLOOR = 2_000  # a batch of fewer session changes, of a stream held as rows: rows, with no reckoning
# Sessions held per key a batch touches past which rows cost less than buckets whatever the batch
# (session_layout's costs, both backends': 64 x 0.35 + 3 us > 20 us a key, 64 x 1 + 3 > 30): a
# stream's rows are counted no further.
ROWS_WIN_PAST = 64


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
    in its given order, and equals any sequence of the same sessions in that order.

    Held as Python lists, or as an Arrow table of BODY_SCHEMA (`of_table`): the batch path reads
    the runs and the stored sessions as Arrow, decides over arrays and writes Arrow, so a batch's
    ~50 000 sessions are never turned into lists and back (`table`); the lists are made on first
    read, for the code that reads sessions one by one. Read-only once made: the lists and the table
    are two views of the same sessions, and neither follows changes made to the other."""

    __slots__ = ("_lists", "_table")

    def __init__(self, keys: Sequence[str] = (), first_ms: Sequence[int] = (), last_ms: Sequence[int] = (),
                 events: Sequence[int] = ()):
        lists = (list(keys), list(first_ms), list(last_ms), list(events))
        if not len(lists[0]) == len(lists[1]) == len(lists[2]) == len(lists[3]):
            raise ValueError("session columns of different lengths")
        self._lists, self._table = lists, None

    @classmethod
    def of_table(cls, table: pa.Table) -> SessionColumns:
        """The sessions of a table whose four columns are BODY_SCHEMA's (key, first, last, events, in
        that order, whatever their names)."""
        out = cls.__new__(cls)
        out._lists, out._table = None, table.rename_columns(BODY_SCHEMA.names).cast(BODY_SCHEMA)
        return out

    @property
    def table(self) -> pa.Table:
        """The sessions as a table of BODY_SCHEMA, in their order."""
        if self._table is None:
            keys, first, last, events = self._lists
            self._table = pa.table([pa.array(keys, pa.string()), pa.array(first, pa.int64()),
                                    pa.array(last, pa.int64()), pa.array(events, pa.int64())], schema=BODY_SCHEMA)
        return self._table

    def _columns(self) -> tuple[list, list, list, list]:
        if self._lists is None:
            self._lists = tuple(column.to_pylist() for column in self._table.columns)
        return self._lists

    # The four columns as lists (made from the table on first read).
    keys = property(lambda self: self._columns()[0])
    first_ms = property(lambda self: self._columns()[1])
    last_ms = property(lambda self: self._columns()[2])
    events = property(lambda self: self._columns()[3])

    def __len__(self) -> int:
        return len(self._lists[0]) if self._lists is not None else self._table.num_rows

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
    if not isinstance(sessions, SessionColumns):
        sessions = SessionColumns([s.key for s in sessions], [s.first_ms for s in sessions],
                                  [s.last_ms for s in sessions], [s.events for s in sessions])
    return sessions.table


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
    return SessionColumns.of_table(table.take(order))


def lookup(cursor, stream: str, keys: Sequence[str] | pa.Array | pa.ChunkedArray, due_through_ms: int | None,
           placeholder: str) -> SessionColumns:
    """The open sessions of `stream` with a key among `keys` (a batch's: Arrow strings), and every
    one whose last event is at or before `due_through_ms` (they close now, whatever their key);
    in (key, first) order."""
    layout = _layout(cursor, stream, placeholder)
    if layout is None:
        return _row_lookup(cursor, stream, keys.to_pylist() if isinstance(keys, pa.ChunkedArray | pa.Array) else keys,
                           due_through_ms, placeholder)
    # Only the buckets of those keys and the buckets holding a due session.
    wanted = pc.unique(_strings(keys)) if len(keys) else pa.array([], pa.string())
    table, _ = _bodies(cursor, stream, placeholder, np.unique(buckets_of(wanted, layout[0])).tolist(), due_through_ms)
    found = pc.is_in(table["session_key"], value_set=wanted)
    if due_through_ms is not None:
        found = pc.or_(found, pc.less_equal(table["last_ms"], due_through_ms))
    return _in_order(table.filter(found))


def _strings(keys: Sequence[str] | pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(keys, pa.ChunkedArray):
        return keys.combine_chunks().cast(pa.string())
    return keys.cast(pa.string()) if isinstance(keys, pa.Array) else pa.array(keys, pa.string())


def _row_lookup(cursor, stream: str, keys: Sequence[str], due_through_ms: int | None, q: str) -> SessionColumns:
    keys = list(set(keys))
    if q == "?":
        in_keys, key_arg = "session_key IN (SELECT value FROM json_each(?))", json.dumps(keys)
    else:
        in_keys, key_arg = "session_key = ANY(%s)", keys
    due = -(2**62) if due_through_ms is None else due_through_ms
    # Two searches in a UNION, not one WHERE with OR: SQLite answers the OR by walking every open
    # session of the stream (its index on (stream, last_ms) for stream only), 65 ms a batch at 50 000
    # open sessions, against 28 ms for the key search plus the due search (rows are unique by the
    # primary key, so the UNION's dedup is the OR's).
    columns = "SELECT session_key, first_ms, last_ms, events FROM session_open"
    cursor.execute(f"{columns} WHERE stream = {q} AND {in_keys}"
                   f" UNION {columns} WHERE stream = {q} AND last_ms <= {q}", (stream, key_arg, stream, due))
    rows = cursor.fetchall()
    rows.sort()  # tuples of str and ints: (key, first) is the primary key, so this is (key, first) order
    return SessionColumns(*zip(*rows, strict=True)) if rows else SessionColumns()


_ID = ["session_key", "first_ms"]  # a session's identity in the state: a grown session keeps its first event


def _staying(old: pa.Table, kept: pa.Table, removed: pa.Table) -> pa.Table:
    """`old` (with any column of its own) without its removed and rewritten sessions: by key and
    first event, a join on their identity rather than a set of strings made per row."""
    changed = pa.concat_tables([kept.select(_ID), removed.select(_ID)])
    return old.join(changed, keys=_ID, join_type="left anti", use_threads=False)


def _merged(old: pa.Table, kept: pa.Table, removed: pa.Table) -> pa.Table:
    """`old` as the batch leaves it: its staying sessions and the kept ones."""
    return pa.concat_tables([_staying(old, kept, removed).select(BODY_SCHEMA.names), kept]).combine_chunks()


def apply(cursor, commits: Sequence[SessionCommit], placeholder: str, chooser: LayoutChooser) -> None:
    """Save each stream's batch changes in its layout, moving it to the other one when `chooser`
    says (store/session_layout.py: a store keeps one for its process, with its backend's costs).
    The caller owns the transaction."""
    q = placeholder
    for c in commits:
        if not len(c.kept) and not len(c.removed):
            continue
        layout = _layout(cursor, c.stream, q)
        if layout is None and len(c.kept) + len(c.removed) < DENSE_FLOOR:
            _row_apply(cursor, c, q)  # a live batch's few keys: rows, with no Arrow table made
            continue
        kept, removed = _unique(c.kept), as_table(c.removed)
        keys = pa.concat_arrays([kept["session_key"].combine_chunks(), removed["session_key"].combine_chunks()])
        touched = len(pc.unique(keys))
        if layout is None:
            held = _row_count(cursor, c.stream, q, touched * ROWS_WIN_PAST + 1)
            if not chooser.should_move(c.stream, in_buckets=False, touched=touched, held=held,
                                       buckets=bucket_count(held)):
                _row_apply(cursor, c, q)
                continue
            # The stream's rows move into buckets, with this batch's changes.
            sessions = _merged(_rows_of(cursor, c.stream, q), kept, removed)
            cursor.execute(f"DELETE FROM session_open WHERE stream = {q}", (c.stream,))
            _spread(cursor, c.stream, sessions, q)
            continue
        buckets, stored = layout
        if chooser.should_move(c.stream, in_buckets=True, touched=touched, held=stored, buckets=buckets):
            # The stream's buckets move back into rows, with this batch's changes.
            old, _ = _bodies(cursor, c.stream, q, None)
            _drop_buckets(cursor, c.stream, q)
            _insert_rows(cursor, c.stream, _merged(old, kept, removed), q)
            continue
        # Each bucket a removed or kept session's key is in is read, changed and written back whole.
        kept_in = buckets_of(kept["session_key"].combine_chunks(), buckets)
        touched_buckets = np.union1d(kept_in, buckets_of(removed["session_key"].combine_chunks(), buckets))
        old, old_in = _bodies(cursor, c.stream, q, touched_buckets.tolist())
        staying = _staying(old.append_column("_in", pa.array(old_in, pa.int64())), kept, removed)
        sessions = pa.concat_tables([staying.select(BODY_SCHEMA.names), kept])
        of = np.concatenate([staying["_in"].to_numpy(), kept_in])
        total = stored - len(old) + len(sessions)
        if not outgrown(total, buckets):
            _write(cursor, c.stream, sessions, of, buckets, touched_buckets, q)
            _set_layout(cursor, c.stream, buckets, total, q)
            continue
        # Outgrown (or shrunk below) its count: every bucket spread anew.
        others, _ = _bodies(cursor, c.stream, q, np.setdiff1d(np.arange(buckets), touched_buckets).tolist())
        _drop_buckets(cursor, c.stream, q)
        _spread(cursor, c.stream, pa.concat_tables([sessions, others]), q)


def _unique(kept: Sequence[Session]) -> pa.Table:
    """The kept sessions as a table, the last of each (key, first) where one is there twice (as an
    upsert leaves it)."""
    table = as_table(kept)
    if table.group_by(_ID, use_threads=False).aggregate([]).num_rows == len(table):
        return table
    return as_table([Session(*row) for row in _rows(kept)])


def _spread(cursor, stream: str, sessions: pa.Table, q: str) -> None:
    """A stream with no bucket yet: its sessions written into `bucket_count` buckets."""
    buckets = bucket_count(len(sessions))
    _write(cursor, stream, sessions, None, buckets, None, q)
    _set_layout(cursor, stream, buckets, len(sessions), q)


def _drop_buckets(cursor, stream: str, q: str) -> None:
    cursor.execute(f"DELETE FROM session_buckets WHERE stream = {q}", (stream,))
    cursor.execute(f"DELETE FROM session_streams WHERE stream = {q}", (stream,))


def _row_count(cursor, stream: str, q: str, at_most: int) -> int:
    """The stream's rows, counted no further than `at_most` (a full count of 500 000 rows: ~30 ms)."""
    cursor.execute(f"SELECT COUNT(*) FROM (SELECT 1 FROM session_open WHERE stream = {q} LIMIT {q}) AS held",
                   (stream, at_most))
    return int(cursor.fetchone()[0])


def _rows_of(cursor, stream: str, q: str) -> pa.Table:
    cursor.execute(f"SELECT session_key, first_ms, last_ms, events FROM session_open WHERE stream = {q}", (stream,))
    rows = cursor.fetchall()
    return as_table(SessionColumns(*zip(*rows, strict=True)) if rows else SessionColumns())


def _insert_rows(cursor, stream: str, sessions: pa.Table, q: str) -> None:
    """A stream with no row: its sessions written a row each, in primary key order (B-tree appends)."""
    if not len(sessions):
        return
    sessions = sessions.take(pc.sort_indices(sessions, sort_keys=[(c, "ascending") for c in _ID]))
    columns = [sessions[c].to_pylist() for c in BODY_SCHEMA.names]
    if q == "?":
        cursor.executemany("INSERT INTO session_open (stream, session_key, first_ms, last_ms, events)"
                           " VALUES (?, ?, ?, ?, ?)", [(stream, *row) for row in zip(*columns, strict=True)])
    else:
        cursor.execute("INSERT INTO session_open (stream, session_key, first_ms, last_ms, events)"
                       " SELECT %s, k, f, l, n FROM unnest(%s::text[], %s::bigint[], %s::bigint[], %s::bigint[])"
                       " AS r(k, f, l, n)", (stream, *columns))


def _row_apply(cursor, c: SessionCommit, q: str) -> None:
    """A batch's changes to a stream held as rows. A removed session whose (key, first) is written
    again (it grew) is not deleted first: the upsert replaces it."""
    kept = list(_rows(c.kept))
    rewritten = {(k, f) for k, f, _, _ in kept}
    gone = [(k, f) for k, f, _, _ in _rows(c.removed) if (k, f) not in rewritten]
    if q == "?":
        if gone:
            cursor.executemany("DELETE FROM session_open WHERE stream = ? AND session_key = ? AND first_ms = ?",
                               [(c.stream, k, f) for k, f in gone])
        if kept:
            cursor.executemany(
                "INSERT INTO session_open (stream, session_key, first_ms, last_ms, events) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (stream, session_key, first_ms) DO UPDATE SET last_ms = excluded.last_ms,"
                " events = excluded.events", [(c.stream, *row) for row in kept])
        return
    # PostgreSQL: one statement each, the rows bound as arrays (no round trip per row).
    if gone:
        keys, firsts = zip(*gone, strict=True)
        cursor.execute("DELETE FROM session_open o USING unnest(%s::text[], %s::bigint[]) AS g(k, f)"
                       " WHERE o.stream = %s AND o.session_key = g.k AND o.first_ms = g.f",
                       (list(keys), list(firsts), c.stream))
    if kept:
        keys, firsts, lasts, events = zip(*kept, strict=True)
        cursor.execute(
            "INSERT INTO session_open (stream, session_key, first_ms, last_ms, events)"
            " SELECT %s, k, f, l, n FROM unnest(%s::text[], %s::bigint[], %s::bigint[], %s::bigint[]) AS r(k, f, l, n)"
            " ON CONFLICT (stream, session_key, first_ms) DO UPDATE SET last_ms = excluded.last_ms,"
            " events = excluded.events", (c.stream, list(keys), list(firsts), list(lasts), list(events)))


def _rows(sessions: Sequence[Session]):
    """(key, first, last, events) tuples, the last of each (key, first) (as an upsert leaves them)."""
    rows = sessions.rows() if isinstance(sessions, SessionColumns) else (
        (s.key, s.first_ms, s.last_ms, s.events) for s in sessions)
    return {(k, f): (k, f, l, n) for k, f, l, n in rows}.values()


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
    """Open sessions per stream (for status and benchmarks), in rows or in buckets."""
    cursor.execute("SELECT stream, COUNT(*) FROM session_open GROUP BY stream")
    out = {stream: int(n) for stream, n in cursor.fetchall()}
    cursor.execute("SELECT stream, sessions FROM session_streams")
    out.update({stream: int(n) for stream, n in cursor.fetchall()})
    return out

"""The open session windows of streams declaring `sessions: {key, gap}` (catalog/features.py,
aggregates/session_window.py is the rule, aggregates/session_batch.py runs it in the pane batch).

Per stream and key: the sessions not closed yet (first event, last event, events). Written in
the batch's own store transaction, with its panes and its batch id: a batch replayed after a
crash is either wholly recorded (skipped by its batch id) or not at all, so no session is
emitted twice or lost across a restart. A session leaves this table when the stream's watermark
passes its last event + gap (it is then emitted as a partial of `<stream>_sessions` in the same
transaction): the table holds the sessions of the last `allowed_lateness + gap` of event time.

Pure, apart from `lookup`, `apply` and `sizes`, which take a DB-API cursor and the backend's placeholder.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

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
"""


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


def session_rows(sessions: Sequence[Session]):
    return sessions.rows() if isinstance(sessions, SessionColumns) else (
        (s.key, s.first_ms, s.last_ms, s.events) for s in sessions)


@dataclass(frozen=True)
class SessionCommit:
    """What a batch changes in one stream's open sessions, saved in its transaction."""

    stream: str
    removed: Sequence[Session] = ()  # stored open sessions that closed or merged into another
    kept: Sequence[Session] = ()  # open sessions to store: new or grown


def lookup(cursor, stream: str, keys: Sequence[str], due_through_ms: int | None, placeholder: str) -> SessionColumns:
    """The open sessions of `stream` with a key among `keys`, and every one whose last event is at
    or before `due_through_ms` (they close now, whatever their key), in one query; in (key, first)
    order (code point order of the keys on both backends: sorted here, not by a collation)."""
    q = placeholder
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


def apply(cursor, commits: Sequence[SessionCommit], placeholder: str) -> None:
    """Save each stream's batch changes; the caller owns the transaction. A removed session whose
    (key, first) is written again (it grew) is not deleted first: the upsert replaces it."""
    q = placeholder
    for c in commits:
        kept = list(session_rows(c.kept))
        rewritten = {(k, f) for k, f, _, _ in kept}
        gone = [(k, f) for k, f, _, _ in session_rows(c.removed) if (k, f) not in rewritten]
        if q == "?":
            if gone:
                cursor.executemany("DELETE FROM session_open WHERE stream = ? AND session_key = ? AND first_ms = ?",
                                   [(c.stream, k, f) for k, f in gone])
            if kept:
                cursor.executemany(
                    "INSERT INTO session_open (stream, session_key, first_ms, last_ms, events) VALUES (?, ?, ?, ?, ?)"
                    " ON CONFLICT (stream, session_key, first_ms) DO UPDATE SET last_ms = excluded.last_ms,"
                    " events = excluded.events", [(c.stream, *row) for row in kept])
            continue
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


def sizes(cursor) -> dict[str, int]:
    """Open sessions per stream (for status and benchmarks)."""
    cursor.execute("SELECT stream, COUNT(*) FROM session_open GROUP BY stream")
    return {stream: int(n) for stream, n in cursor.fetchall()}

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


@dataclass(frozen=True)
class SessionCommit:
    """What a batch changes in one stream's open sessions, saved in its transaction."""

    stream: str
    removed: Sequence[Session] = ()  # stored open sessions that closed or merged into another
    kept: Sequence[Session] = ()  # open sessions to store: new or grown


def lookup(cursor, stream: str, keys: Sequence[str], due_through_ms: int | None, placeholder: str) -> list[Session]:
    """The open sessions of `stream` with a key among `keys`, and every one whose last event is at
    or before `due_through_ms` (they close now, whatever their key), in one query."""
    q = placeholder
    keys = sorted(set(keys))
    if q == "?":
        in_keys, key_arg = "session_key IN (SELECT value FROM json_each(?))", json.dumps(keys)
    else:
        in_keys, key_arg = "session_key = ANY(%s)", keys
    due = -(2**62) if due_through_ms is None else due_through_ms
    cursor.execute(f"SELECT session_key, first_ms, last_ms, events FROM session_open"
                   f" WHERE stream = {q} AND ({in_keys} OR last_ms <= {q})", (stream, key_arg, due))
    return sorted(Session(k, f, last, n) for k, f, last, n in cursor.fetchall())


def apply(cursor, commits: Sequence[SessionCommit], placeholder: str) -> None:
    """Save each stream's batch changes; the caller owns the transaction."""
    q = placeholder
    for c in commits:
        if c.removed:
            cursor.executemany(f"DELETE FROM session_open WHERE stream = {q} AND session_key = {q} AND first_ms = {q}",
                               [(c.stream, s.key, s.first_ms) for s in c.removed])
        if c.kept:
            cursor.executemany(
                f"INSERT INTO session_open (stream, session_key, first_ms, last_ms, events) VALUES ({q}, {q}, {q}, {q}, {q})"
                " ON CONFLICT (stream, session_key, first_ms) DO UPDATE SET last_ms = excluded.last_ms,"
                " events = excluded.events",
                [(c.stream, s.key, s.first_ms, s.last_ms, s.events) for s in c.kept])


def sizes(cursor) -> dict[str, int]:
    """Open sessions per stream (for status and benchmarks)."""
    cursor.execute("SELECT stream, COUNT(*) FROM session_open GROUP BY stream")
    return {stream: int(n) for stream, n in cursor.fetchall()}

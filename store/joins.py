"""The state of stream-stream window joins (catalog/joins.py, aggregates/window_join.py).

Per join: the left events still inside their window (+ late horizon), the right events still
inside theirs (matched or still waiting for their left), the join's clock (the lower of its two
streams' watermarks as the join saw it) and counters. Written in the batch's own store transaction, with
its panes and its batch id: a batch replayed after a crash is either wholly recorded (skipped by
its batch id) or not at all, so no pair is counted twice or lost across a restart.

Rows leave the state when the join's clock passes their time + within + late_horizon: the state
is bounded by the window and the watermark. Pure, apart from `lookup`, `apply` and `sizes`,
which take a DB-API cursor and the backend's placeholder.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

JOIN_TABLES = """
CREATE TABLE IF NOT EXISTS join_left (
    join_name TEXT NOT NULL,
    join_key TEXT NOT NULL,
    time_ms INTEGER NOT NULL,
    log_partition INTEGER NOT NULL,
    log_offset INTEGER NOT NULL,
    dims TEXT NOT NULL,             -- JSON array of the left event's dimension values
    matched INTEGER NOT NULL,       -- 1 once a right event matched it (its `clicked` was counted)
    PRIMARY KEY (join_name, log_partition, log_offset)
);
CREATE INDEX IF NOT EXISTS join_left_by_key ON join_left (join_name, join_key);
CREATE INDEX IF NOT EXISTS join_left_by_time ON join_left (join_name, time_ms);
CREATE TABLE IF NOT EXISTS join_right (
    join_name TEXT NOT NULL,
    join_key TEXT NOT NULL,
    time_ms INTEGER NOT NULL,
    log_partition INTEGER NOT NULL,
    log_offset INTEGER NOT NULL,
    matched INTEGER NOT NULL,       -- 0: no left matched it yet (counted unmatched_right if it expires so)
    PRIMARY KEY (join_name, log_partition, log_offset)
);
CREATE INDEX IF NOT EXISTS join_right_by_key ON join_right (join_name, join_key);
CREATE INDEX IF NOT EXISTS join_right_by_time ON join_right (join_name, time_ms);
CREATE TABLE IF NOT EXISTS join_progress (
    join_name TEXT PRIMARY KEY,
    clock_ms INTEGER,               -- the lower of the two streams' watermarks as the join last saw it
    pairs INTEGER NOT NULL,         -- matched pairs counted so far
    unmatched_right INTEGER NOT NULL -- right events that expired without a left
);
"""


class JoinEvent(NamedTuple):
    """A left or right event of a join, in the order a batch takes them (time, partition, offset).
    A named tuple: a batch makes one per event of both sides (a frozen dataclass's __init__ cost
    ~3 times as much), and tuples order field by field as the dataclass did."""

    time_ms: int
    partition: int
    offset: int
    key: str
    dims: tuple[str | None, ...] = ()  # the left event's dimension values (right events: ())
    matched: bool = False


@dataclass(frozen=True)
class JoinState:
    """What a batch reads of a join's state: the clock and the stored events it can touch."""

    clock_ms: int | None = None
    lefts: Sequence[JoinEvent] = ()  # stored left events with a key of the batch
    rights: Sequence[JoinEvent] = ()  # stored right events with a key of the batch, and every one expiring


@dataclass(frozen=True)
class JoinCommit:
    """What a batch changes in one join's state, saved in its transaction."""

    join: str
    clock_ms: int | None
    expire_through_ms: int | None  # events with time <= this leave the state (None: nothing expires)
    lefts: Sequence[JoinEvent] = ()  # new or newly matched left events to keep
    rights: Sequence[JoinEvent] = ()  # new or newly matched right events to keep
    pairs: int = 0
    unmatched_right: int = 0


@dataclass(frozen=True)
class JoinSizes:
    """A join's state and counters, for /api/v1/pipeline and /metrics."""

    clock_ms: int | None = None
    left_rows: int = 0
    right_rows: int = 0
    pending_right: int = 0  # right events no left matched yet
    pairs: int = 0
    unmatched_right: int = 0


def lookup(cursor, join: str, keys: Sequence[str], expire_through_ms: int | None, placeholder: str) -> JoinState:
    """The stored state a batch with these keys touches, in three queries (keys by index)."""
    q = placeholder
    cursor.execute(f"SELECT clock_ms FROM join_progress WHERE join_name = {q}", (join,))
    row = cursor.fetchone()
    clock = None if row is None else row[0]
    keys = sorted(set(keys))
    if q == "?":
        in_keys, key_arg = "join_key IN (SELECT value FROM json_each(?))", json.dumps(keys)
    else:
        in_keys, key_arg = "join_key = ANY(%s)", keys
    lefts, rights = [], []
    if keys:
        cursor.execute(f"SELECT time_ms, log_partition, log_offset, join_key, dims, matched FROM join_left"
                       f" WHERE join_name = {q} AND {in_keys}", (join, key_arg))
        lefts = [JoinEvent(t, p, o, k, tuple(json.loads(d)), bool(m)) for t, p, o, k, d, m in cursor.fetchall()]
    # The right events of the keys, and those expiring: two indexed reads in one UNION (which
    # reads an event that is both once). As one `key IN (...) OR time_ms <= ?`, SQLite read every
    # right event of the join through the index on its name alone, even to read no key at all (the
    # join's clock): 31 ms with ~230 000 of them kept, 95 ms with ~690 000 (docs/benchmarks.md, session 94).
    parts, args = [], []
    select = "SELECT time_ms, log_partition, log_offset, join_key, matched FROM join_right"
    if keys:
        parts.append(f"{select} WHERE join_name = {q} AND {in_keys}")
        args += [join, key_arg]
    if expire_through_ms is not None:
        parts.append(f"{select} WHERE join_name = {q} AND time_ms <= {q}")
        args += [join, expire_through_ms]
    if parts:
        cursor.execute(" UNION ".join(parts), args)
        rights = [JoinEvent(t, p, o, k, (), bool(m)) for t, p, o, k, m in cursor.fetchall()]
    return JoinState(clock, sorted(lefts), sorted(rights))


# The kept events' columns, and what makes one event (a row again for it keeps the last `matched`).
LEFT_COLUMNS = ("join_name", "join_key", "time_ms", "log_partition", "log_offset", "dims", "matched")
RIGHT_COLUMNS = ("join_name", "join_key", "time_ms", "log_partition", "log_offset", "matched")
EVENT_KEY = ("join_name", "log_partition", "log_offset")

# Upserts rows (`columns` of `table`, keyed by EVENT_KEY, `matched` replaced on a conflict) in one
# go; the store gives its bulk path (PostgreSQL: COPY, store/postgres/rows.py `upsert`).
Upsert = Callable[[str, Sequence[str], Sequence[tuple]], None]


def apply(cursor, commits: Sequence[JoinCommit], placeholder: str, upsert: Upsert | None = None) -> None:
    """Save each join's batch changes, then drop what expired; the caller owns the transaction.
    `upsert`: how the events are written (None: an executemany on `cursor`)."""
    q = placeholder
    save = upsert or functools.partial(_upsert_each, cursor, q)
    for c in commits:
        if c.lefts:
            # Each distinct dims tuple encoded once (a batch's left events share a few).
            dims_json = {d: json.dumps(list(d)) for d in {e.dims for e in c.lefts}}
            save("join_left", LEFT_COLUMNS, [(c.join, e.key, e.time_ms, e.partition, e.offset, dims_json[e.dims],
                                              int(e.matched)) for e in c.lefts])
        if c.rights:
            save("join_right", RIGHT_COLUMNS,
                 [(c.join, e.key, e.time_ms, e.partition, e.offset, int(e.matched)) for e in c.rights])
        if c.expire_through_ms is not None:
            for table in ("join_left", "join_right"):
                cursor.execute(f"DELETE FROM {table} WHERE join_name = {q} AND time_ms <= {q}",
                               (c.join, c.expire_through_ms))
        cursor.execute(
            f"INSERT INTO join_progress (join_name, clock_ms, pairs, unmatched_right) VALUES ({q}, {q}, {q}, {q})"
            " ON CONFLICT (join_name) DO UPDATE SET clock_ms = excluded.clock_ms,"
            " pairs = join_progress.pairs + excluded.pairs,"
            " unmatched_right = join_progress.unmatched_right + excluded.unmatched_right",
            (c.join, c.clock_ms, c.pairs, c.unmatched_right))


def _upsert_each(cursor, q: str, table: str, columns: Sequence[str], rows: Sequence[tuple]) -> None:
    cursor.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join([q] * len(columns))})"
                       f" ON CONFLICT ({', '.join(EVENT_KEY)}) DO UPDATE SET matched = excluded.matched", rows)


def sizes(cursor) -> dict[str, JoinSizes]:
    """Every join's state size and counters."""
    out: dict[str, dict] = {}
    cursor.execute("SELECT join_name, clock_ms, pairs, unmatched_right FROM join_progress")
    for name, clock, pairs, unmatched in cursor.fetchall():
        out[name] = {"clock_ms": clock, "pairs": pairs, "unmatched_right": unmatched}
    cursor.execute("SELECT join_name, COUNT(*) FROM join_left GROUP BY join_name")
    for name, n in cursor.fetchall():
        out.setdefault(name, {})["left_rows"] = n
    cursor.execute("SELECT join_name, COUNT(*), COALESCE(SUM(1 - matched), 0) FROM join_right GROUP BY join_name")
    for name, n, pending in cursor.fetchall():
        out.setdefault(name, {}).update(right_rows=n, pending_right=int(pending))
    return {name: JoinSizes(**values) for name, values in out.items()}

"""The patterns' state and output in the store (catalog/patterns.py declares them, patterns/ is
the matcher, aggregates/pattern_batch.py runs it per batch).

Per pattern and key with partial matches: the matcher's state of the key (as JSON), with
`due_ms`, the lowest watermark at which the key has something to do (drop a partial match past
`within`, decide an absence). Per pattern and event still waiting for the watermark: one row of
`pattern_buffer` (so the matcher sees each key's events in event-time order), found by its time
when the watermark passes it. A batch appends the events it buffers without reading anything,
and reads only the buffered events the watermark releases, the states of their keys and the
keys that are due, never the whole state; it writes only the keys whose state changed. Per
pattern: the watermark it has advanced to and its counters. Matches and the events late for a
pattern are appended. Per key, `pattern_history` keeps the events fed (each marked when the key
held nothing that could still matter at its time: a replay may start there) for the kept horizon behind the watermark, so
a late event can be replayed with them (patterns/corrections.py); a retraction is a row of
`pattern_matches` naming the match it withdraws.

Everything is written in the batch's own store transaction, with its panes and its batch id: a
batch replayed after a crash is either wholly recorded (skipped by its batch id) or not at all,
so no match is emitted twice or lost across a restart. Pure, apart from the functions that take
a DB-API cursor and the backend's placeholder.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

PATTERN_TABLES = """
CREATE TABLE IF NOT EXISTS pattern_state (
    pattern TEXT NOT NULL,
    pattern_key TEXT NOT NULL,
    state TEXT NOT NULL,            -- JSON: the matcher's state of the key (last event, runs, waiting)
    buffered TEXT NOT NULL,         -- '[]' (stores written before pattern_buffer: the key's buffered events)
    due_ms INTEGER,                 -- the lowest watermark at which the key has work (NULL: none)
    partial_matches INTEGER NOT NULL,
    PRIMARY KEY (pattern, pattern_key)
);
CREATE INDEX IF NOT EXISTS pattern_state_by_due ON pattern_state (pattern, due_ms);
CREATE TABLE IF NOT EXISTS pattern_buffer (
    pattern TEXT NOT NULL,
    time_ms INTEGER NOT NULL,       -- event time: released when the pattern's watermark passes it
    stream TEXT NOT NULL,
    log_partition INTEGER NOT NULL,
    log_offset INTEGER NOT NULL,
    pattern_key TEXT NOT NULL,
    fields TEXT NOT NULL,           -- JSON object: the fields the pattern reads
    PRIMARY KEY (pattern, time_ms, stream, log_partition, log_offset)
);
CREATE TABLE IF NOT EXISTS pattern_progress (
    pattern TEXT PRIMARY KEY,
    watermark_ms INTEGER,           -- every event of the pattern's streams up to here was fed
    matches INTEGER NOT NULL,
    late_events INTEGER NOT NULL,
    dropped_runs INTEGER NOT NULL DEFAULT 0  -- partial matches dropped: a key held the most (patterns/matcher.py)
);
CREATE TABLE IF NOT EXISTS pattern_matches (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    pattern TEXT NOT NULL,
    pattern_key TEXT NOT NULL,
    decided_at_ms INTEGER NOT NULL, -- event time: the last event's, or the absence's deadline
    events TEXT NOT NULL,           -- JSON array of {step, stream, partition, offset, time}
    measures TEXT NOT NULL,         -- JSON object
    late INTEGER NOT NULL,          -- 1: a correction a late event brought (an added match, or a retraction)
    batch_id INTEGER NOT NULL,
    committed_at_ms INTEGER NOT NULL,
    retracts INTEGER,               -- set on a retraction: the id of the match it withdraws
    dims TEXT                       -- JSON object: the match's dimensions (a retraction: its match's; NULL: none kept)
);
CREATE INDEX IF NOT EXISTS pattern_matches_by_time ON pattern_matches (pattern, decided_at_ms);
CREATE INDEX IF NOT EXISTS pattern_matches_by_key ON pattern_matches (pattern, pattern_key, id);
CREATE TABLE IF NOT EXISTS pattern_late (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    pattern TEXT NOT NULL,
    stream TEXT NOT NULL,
    log_partition INTEGER NOT NULL,
    log_offset INTEGER NOT NULL,
    time_ms INTEGER NOT NULL,
    watermark_ms INTEGER NOT NULL,  -- the pattern's watermark it arrived behind
    batch_id INTEGER NOT NULL,
    at_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS pattern_late_by_pattern ON pattern_late (pattern, id);
-- The definition each pattern's state was built with (catalog/defined_patterns.py definition_id):
-- a batch that runs another definition of it drops the state first, in its own transaction.
CREATE TABLE IF NOT EXISTS pattern_applied (
    pattern TEXT PRIMARY KEY,
    definition_id TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS pattern_history (
    pattern TEXT NOT NULL,
    pattern_key TEXT NOT NULL,
    time_ms INTEGER NOT NULL,       -- event time: rows behind the watermark - the kept horizon are cut
    stream TEXT NOT NULL,
    log_partition INTEGER NOT NULL,
    log_offset INTEGER NOT NULL,
    fields TEXT NOT NULL,           -- JSON object: the fields the pattern reads
    restart INTEGER NOT NULL,       -- 1: the key held nothing when the event was fed (a replay may start here)
    PRIMARY KEY (pattern, pattern_key, time_ms, stream, log_partition, log_offset)
);
CREATE INDEX IF NOT EXISTS pattern_history_by_time ON pattern_history (pattern, time_ms);
"""


@dataclass(frozen=True)
class KeyState:
    """One key's stored state: the matcher's JSON of the key. `buffered`: events as JSON lists
    [stream, partition, offset, time, fields] that a store written before pattern_buffer kept
    with the key (read, released or moved to pattern_buffer; never written again)."""

    state: dict | None = None
    buffered: tuple[list, ...] = ()
    due_ms: int | None = None
    partial_matches: int = 0


class BufferedEvent(NamedTuple):
    """An event waiting in pattern_buffer for the pattern's watermark."""

    key: str
    stream: str
    partition: int
    offset: int
    time_ms: int
    fields: dict


class HistoryEvent(NamedTuple):
    """An event fed to the matcher, kept in pattern_history for replays. restart: the key held
    nothing that could still matter at its time when it was fed (PatternMatcher.holds_at: no run
    within `within` of it, no absence it does not pass), so a replay from an empty state may start
    at it."""

    key: str
    stream: str
    partition: int
    offset: int
    time_ms: int
    fields: dict
    restart: bool

    @property
    def order(self) -> tuple[int, str, int, int]:
        return (self.time_ms, self.stream, self.partition, self.offset)


@dataclass(frozen=True)
class StoredMatch:
    id: int
    pattern: str
    key: str
    decided_at_ms: int
    events: list[dict]
    measures: dict
    late: bool
    batch_id: int
    committed_at_ms: int
    retracts: int | None = None  # a retraction: the id of the match it withdraws
    dims: dict = field(default_factory=dict)  # its dimensions (a retraction: those of the match it withdraws)


@dataclass(frozen=True)
class NewMatch:
    key: str
    decided_at_ms: int
    events: list[dict]
    measures: dict
    late: bool = False
    # A retraction of the stored match with this key, decided_at and events (its id is found in
    # the commit's transaction: the newest such match that is not itself a retraction).
    retraction: bool = False
    dims: dict = field(default_factory=dict)  # the match's dimensions (a retraction: its match's)


class PublishedMatch(NamedTuple):
    """A stored match (not a retraction) of a key with late events: what a retraction of it takes
    back from (its dimensions and its late flag)."""

    decided_at_ms: int
    events: list[dict]
    dims: dict
    late: bool


@dataclass(frozen=True)
class LateEvent:
    stream: str
    partition: int
    offset: int
    time_ms: int
    watermark_ms: int


@dataclass(frozen=True)
class PatternCommit:
    """What a batch changes for one pattern, saved in its transaction: keys written (a KeyState
    with nothing in it deletes the key; keys not named are left as they are), the events it
    buffers, the matches decided, the late events. The buffered events at or before
    `watermark_ms` were released by the batch (PatternLoad.released) and are deleted."""

    pattern: str
    watermark_ms: int | None
    keys: dict[str, KeyState] = field(default_factory=dict)
    matches: Sequence[NewMatch] = ()
    late: Sequence[LateEvent] = ()
    buffer: Sequence[BufferedEvent] = ()
    dropped_runs: int = 0  # partial matches not started or dropped: their key held the most it may
    # pattern_history: the keys whose rows are replaced (a replay rewrote them), the rows written,
    # and the time before which every row is cut (the watermark less the kept horizon).
    history_rewritten: Sequence[str] = ()
    history: Sequence[HistoryEvent] = ()
    history_cut_ms: int | None = None
    # The definition the state is built with (recorded); `reset`: drop the state another one built
    # (buffer, keys, watermark, counters; the matches stay) before the rest; `drop`: only that,
    # for a pattern deleted through the API (docs/patterns.md, "Patterns defined through the API").
    definition_id: str | None = None
    reset: bool = False
    drop: bool = False


@dataclass(frozen=True)
class PatternLoad:
    """What a batch reads of a pattern: its watermark, the buffered events due (time at or before
    the watermark asked for), and the stored keys it names, those of the released events and
    those that are due."""

    watermark_ms: int | None = None
    keys: dict[str, KeyState] = field(default_factory=dict)
    released: Sequence[BufferedEvent] = ()
    history: dict[str, list[HistoryEvent]] = field(default_factory=dict)  # the keys asked for, in order
    # The stored matches of the same keys decided since their oldest kept event, in id order.
    published: dict[str, list[PublishedMatch]] = field(default_factory=dict)
    definition_id: str | None = None  # the definition the stored state was built with (None: not recorded)


@dataclass(frozen=True)
class PatternSizes:
    """A pattern's state size and counters, for /api/v1/pipeline and /metrics."""

    watermark_ms: int | None = None
    keys_held: int = 0
    partial_matches: int = 0
    buffered_events: int = 0
    matches: int = 0
    late_events: int = 0
    definition_id: str | None = None
    dropped_runs: int = 0  # partial matches dropped because their key held the most it may
    history_rows: int = 0  # pattern_history: the events kept for replays


def _empty(k: KeyState) -> bool:
    return not k.buffered and (not k.state or not (k.state.get("runs") or k.state.get("waiting")))


def _in_keys(placeholder: str, keys: list[str]) -> tuple[str, object]:
    if placeholder == "?":
        return "pattern_key IN (SELECT value FROM json_each(?))", json.dumps(keys)
    return "pattern_key = ANY(%s)", keys


def lookup(cursor, pattern: str, keys: Sequence[str], due_through_ms: int | None, placeholder: str,
           history_keys: Sequence[str] = ()) -> PatternLoad:
    """The pattern's watermark, the buffered events at or before `due_through_ms`, the stored
    keys among `keys`, those of the released events, and those due at `due_through_ms`, and the
    kept history of `history_keys` (the keys with late events)."""
    q = placeholder
    cursor.execute(f"SELECT watermark_ms FROM pattern_progress WHERE pattern = {q}", (pattern,))
    row = cursor.fetchone()
    cursor.execute(f"SELECT definition_id FROM pattern_applied WHERE pattern = {q}", (pattern,))
    applied = cursor.fetchone()
    released: list[BufferedEvent] = []
    if due_through_ms is not None:
        cursor.execute(f"SELECT pattern_key, stream, log_partition, log_offset, time_ms, fields FROM pattern_buffer"
                       f" WHERE pattern = {q} AND time_ms <= {q}", (pattern, due_through_ms))
        loads = json.loads
        released = [BufferedEvent(k, s, p, o, t, loads(f)) for k, s, p, o, t, f in cursor.fetchall()]
    in_keys, key_arg = _in_keys(q, sorted(set(keys) | {e.key for e in released}))
    due = -(2**62) if due_through_ms is None else due_through_ms
    columns = "pattern_key, state, buffered, due_ms, partial_matches"
    # Two index lookups (by key, by due time) rather than one OR, which would scan the pattern's keys.
    cursor.execute(f"SELECT {columns} FROM pattern_state WHERE pattern = {q} AND {in_keys}"
                   f" UNION SELECT {columns} FROM pattern_state WHERE pattern = {q} AND due_ms <= {q}",
                   (pattern, key_arg, pattern, due))
    found = {k: KeyState(json.loads(s), tuple(json.loads(b)), d, p) for k, s, b, d, p in cursor.fetchall()}
    history: dict[str, list[HistoryEvent]] = {}
    if history_keys:
        in_keys, key_arg = _in_keys(q, sorted(set(history_keys)))
        cursor.execute(f"SELECT pattern_key, stream, log_partition, log_offset, time_ms, fields, restart"
                       f" FROM pattern_history WHERE pattern = {q} AND {in_keys}", (pattern, key_arg))
        for k, s, p, o, t, f, r in cursor.fetchall():
            history.setdefault(k, []).append(HistoryEvent(k, s, p, o, t, json.loads(f), bool(r)))
        for events in history.values():
            events.sort(key=lambda e: e.order)
    published: dict[str, list[PublishedMatch]] = {}
    if history:
        # A retraction goes to its match's dimensions and late value, as stored (a replay cannot
        # tell whether the match was published late). Only matches the replay can decide: none
        # before the keys' oldest kept event.
        in_keys, key_arg = _in_keys(q, sorted(history))
        oldest = min(events[0].time_ms for events in history.values())
        cursor.execute(f"SELECT pattern_key, decided_at_ms, events, dims, late FROM pattern_matches"
                       f" WHERE pattern = {q} AND {in_keys} AND retracts IS NULL AND decided_at_ms >= {q} ORDER BY id",
                       (pattern, key_arg, oldest))
        for k, d, e, dims, late in cursor.fetchall():
            published.setdefault(k, []).append(PublishedMatch(d, json.loads(e), json.loads(dims or "{}"), bool(late)))
    return PatternLoad(None if row is None else row[0], found, released,
                       definition_id=None if applied is None else applied[0], history=history, published=published)


def apply(cursor, commits: Sequence[PatternCommit], batch_id: int, now_ms: int, placeholder: str) -> None:
    """Save each pattern's batch changes; the caller owns the transaction."""
    q = placeholder
    for c in commits:
        if c.reset or c.drop:
            for table in ("pattern_state", "pattern_buffer", "pattern_progress", "pattern_applied", "pattern_history"):
                cursor.execute(f"DELETE FROM {table} WHERE pattern = {q}", (c.pattern,))
            if c.drop:
                continue
        if c.definition_id is not None:
            cursor.execute(f"INSERT INTO pattern_applied (pattern, definition_id) VALUES ({q}, {q})"
                           " ON CONFLICT (pattern) DO UPDATE SET definition_id = excluded.definition_id",
                           (c.pattern, c.definition_id))
        gone = [k for k, s in c.keys.items() if _empty(s)]
        kept = [(c.pattern, k, json.dumps(s.state or {}), json.dumps(list(s.buffered)), s.due_ms, s.partial_matches)
                for k, s in sorted(c.keys.items()) if not _empty(s)]
        if gone:
            in_keys, key_arg = _in_keys(q, sorted(gone))
            cursor.execute(f"DELETE FROM pattern_state WHERE pattern = {q} AND {in_keys}", (c.pattern, key_arg))
        if kept:
            cursor.executemany(
                f"INSERT INTO pattern_state (pattern, pattern_key, state, buffered, due_ms, partial_matches)"
                f" VALUES ({q}, {q}, {q}, {q}, {q}, {q}) ON CONFLICT (pattern, pattern_key) DO UPDATE SET"
                " state = excluded.state, buffered = excluded.buffered, due_ms = excluded.due_ms,"
                " partial_matches = excluded.partial_matches", kept)
        if c.watermark_ms is not None:  # the events the batch released (lookup read them up to its watermark)
            cursor.execute(f"DELETE FROM pattern_buffer WHERE pattern = {q} AND time_ms <= {q}",
                           (c.pattern, c.watermark_ms))
        if c.buffer:
            dumps = json.dumps
            # An event buffered twice (the same log record) is kept once, as a key's buffer always did.
            cursor.executemany(
                f"INSERT INTO pattern_buffer (pattern, time_ms, stream, log_partition, log_offset, pattern_key, fields)"
                f" VALUES ({q}, {q}, {q}, {q}, {q}, {q}, {q})"
                " ON CONFLICT (pattern, time_ms, stream, log_partition, log_offset) DO NOTHING",
                [(c.pattern, e.time_ms, e.stream, e.partition, e.offset, e.key, dumps(e.fields)) for e in c.buffer])
        _apply_history(cursor, c, q)
        for m in c.matches:  # one by one: a retraction finds the id of a match written before it
            events = json.dumps(m.events)
            retracts = None
            if m.retraction:
                cursor.execute(f"SELECT MAX(id) FROM pattern_matches WHERE pattern = {q} AND pattern_key = {q}"
                               f" AND decided_at_ms = {q} AND events = {q} AND retracts IS NULL",
                               (c.pattern, m.key, m.decided_at_ms, events))
                found = cursor.fetchone()
                # 0: no such match stored (not expected: the replay's matches were all published). Not
                # an error that would stop every later batch: the retraction is kept, naming none.
                retracts = 0 if found is None or found[0] is None else int(found[0])
            cursor.execute(
                f"INSERT INTO pattern_matches (pattern, pattern_key, decided_at_ms, events, measures, late, batch_id,"
                f" committed_at_ms, retracts, dims) VALUES ({q}, {q}, {q}, {q}, {q}, {q}, {q}, {q}, {q}, {q})",
                (c.pattern, m.key, m.decided_at_ms, events, json.dumps(m.measures), int(m.late), batch_id, now_ms,
                 retracts, json.dumps(m.dims, sort_keys=True)))
        if c.late:
            cursor.executemany(
                f"INSERT INTO pattern_late (pattern, stream, log_partition, log_offset, time_ms, watermark_ms,"
                f" batch_id, at_ms) VALUES ({q}, {q}, {q}, {q}, {q}, {q}, {q}, {q})",
                [(c.pattern, e.stream, e.partition, e.offset, e.time_ms, e.watermark_ms, batch_id, now_ms)
                 for e in c.late])
        cursor.execute(
            f"INSERT INTO pattern_progress (pattern, watermark_ms, matches, late_events, dropped_runs)"
            f" VALUES ({q}, {q}, {q}, {q}, {q})"
            " ON CONFLICT (pattern) DO UPDATE SET watermark_ms = excluded.watermark_ms,"
            " matches = pattern_progress.matches + excluded.matches,"
            " late_events = pattern_progress.late_events + excluded.late_events,"
            " dropped_runs = pattern_progress.dropped_runs + excluded.dropped_runs",
            (c.pattern, c.watermark_ms, sum(-1 if m.retraction else 1 for m in c.matches), len(c.late),
             c.dropped_runs))


def _apply_history(cursor, c: PatternCommit, q: str) -> None:
    """A pattern's history rows: the rewritten keys' rows replaced, the new ones written, the
    rows behind the cut deleted."""
    if c.history_rewritten:
        in_keys, key_arg = _in_keys(q, sorted(set(c.history_rewritten)))
        cursor.execute(f"DELETE FROM pattern_history WHERE pattern = {q} AND {in_keys}", (c.pattern, key_arg))
    if c.history:
        dumps = json.dumps
        cursor.executemany(
            f"INSERT INTO pattern_history (pattern, pattern_key, time_ms, stream, log_partition, log_offset, fields,"
            f" restart) VALUES ({q}, {q}, {q}, {q}, {q}, {q}, {q}, {q})"
            " ON CONFLICT (pattern, pattern_key, time_ms, stream, log_partition, log_offset)"
            " DO UPDATE SET restart = excluded.restart",
            [(c.pattern, e.key, e.time_ms, e.stream, e.partition, e.offset, dumps(e.fields), int(e.restart))
             for e in c.history])
    if c.history_cut_ms is not None:
        cursor.execute(f"DELETE FROM pattern_history WHERE pattern = {q} AND time_ms < {q}",
                       (c.pattern, c.history_cut_ms))


def sizes(cursor) -> dict[str, PatternSizes]:
    """Every pattern's state size and counters."""
    out: dict[str, dict] = {}
    cursor.execute("SELECT pattern, watermark_ms, matches, late_events, dropped_runs FROM pattern_progress")
    for name, watermark, matches, late, dropped in cursor.fetchall():
        out[name] = {"watermark_ms": watermark, "matches": matches, "late_events": late, "dropped_runs": dropped}
    cursor.execute("SELECT pattern, COALESCE(SUM(partial_matches), 0) FROM pattern_state GROUP BY pattern")
    for name, partial in cursor.fetchall():
        out.setdefault(name, {}).update(partial_matches=int(partial))
    # Keys held: those with partial matches or buffered events.
    cursor.execute("SELECT pattern, COUNT(*) FROM (SELECT pattern, pattern_key FROM pattern_state"
                   " UNION SELECT pattern, pattern_key FROM pattern_buffer) held GROUP BY pattern")
    for name, keys in cursor.fetchall():
        out.setdefault(name, {}).update(keys_held=keys)
    cursor.execute("SELECT pattern, COUNT(*) FROM pattern_buffer GROUP BY pattern")
    for name, buffered in cursor.fetchall():
        out.setdefault(name, {}).update(buffered_events=buffered)
    cursor.execute("SELECT pattern, COUNT(*) FROM pattern_history GROUP BY pattern")
    for name, rows in cursor.fetchall():
        out.setdefault(name, {}).update(history_rows=rows)
    # Events a store written before pattern_buffer kept with their key: each key's JSON array length.
    cursor.execute("SELECT pattern, definition_id FROM pattern_applied")
    for name, applied in cursor.fetchall():
        out.setdefault(name, {}).update(definition_id=applied)
    cursor.execute("SELECT pattern, buffered FROM pattern_state WHERE buffered <> '[]'")
    for name, buffered in cursor.fetchall():
        entry = out.setdefault(name, {})
        entry["buffered_events"] = entry.get("buffered_events", 0) + len(json.loads(buffered))
    return {name: PatternSizes(**values) for name, values in out.items()}


def matches_page(cursor, pattern: str, placeholder: str, *, key: str | None = None, start_ms: int | None = None,
                 end_ms: int | None = None, after_id: int = 0, limit: int = 100) -> list[StoredMatch]:
    """A pattern's matches in the order they were decided (by id), after `after_id`; filtered by
    key and by decided_at in [start_ms, end_ms)."""
    q = placeholder
    clauses, args = [f"pattern = {q}", f"id > {q}"], [pattern, after_id]
    if key is not None:
        clauses.append(f"pattern_key = {q}")
        args.append(key)
    if start_ms is not None:
        clauses.append(f"decided_at_ms >= {q}")
        args.append(start_ms)
    if end_ms is not None:
        clauses.append(f"decided_at_ms < {q}")
        args.append(end_ms)
    cursor.execute(f"SELECT id, pattern, pattern_key, decided_at_ms, events, measures, late, batch_id, committed_at_ms,"
                   f" retracts, dims FROM pattern_matches WHERE {' AND '.join(clauses)} ORDER BY id LIMIT {q}",
                   (*args, limit))
    return [StoredMatch(i, p, k, d, json.loads(e), json.loads(m), bool(late), b, at, r, json.loads(dims or "{}"))
            for i, p, k, d, e, m, late, b, at, r, dims in cursor.fetchall()]


def newest_match_id(cursor, pattern: str, placeholder: str) -> int | None:
    """The id of the pattern's newest match (None: none yet): where a new reader of the matches starts."""
    cursor.execute(f"SELECT MAX(id) FROM pattern_matches WHERE pattern = {placeholder}", (pattern,))
    row = cursor.fetchone()
    return None if row is None or row[0] is None else int(row[0])


def late_events(cursor, pattern: str, placeholder: str, limit: int = 100) -> list[tuple]:
    """A pattern's late events, newest first: (stream, partition, offset, time_ms, watermark_ms, batch_id)."""
    q = placeholder
    cursor.execute(f"SELECT stream, log_partition, log_offset, time_ms, watermark_ms, batch_id FROM pattern_late"
                   f" WHERE pattern = {q} ORDER BY id DESC LIMIT {q}", (pattern, limit))
    return [tuple(r) for r in cursor.fetchall()]

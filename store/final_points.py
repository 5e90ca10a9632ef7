"""Final points of sketch stats kept in the store, beside the panes (SQLite file or PostgreSQL),
so that a restarted API process, another replica or a new client's first query reads them
instead of computing them again: a cold day of 1-minute percentiles is 1 440 KLL sorted views
(~20 us each) when computed, one indexed read when kept.

The in-memory point cache (store/point_cache.py) is the first level and decides what is
kept: only final points, each with the fingerprint of its window's rows; a point is reused
only while that fingerprint is unchanged, so a correction that revises the rows makes it
computed again, wherever it was kept. Writes go through one background thread: a query
never waits for the store's write lock (a pipeline commit holds it for seconds on SQLite),
and a point that could not be written is only computed again later.

Chunks of final windows (store/series.py `_reusing_chunks`) are kept here too, one row each with
their points and texts: a new process's first query of a day of 1-minute windows reads 24 rows.
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path

from store.connection import Db, SideStore
from store.kept_point import Form
from store.point_text import point_text
from store.rollup import Point

log = logging.getLogger(__name__)

# Keyed by digests of the shape's and the group's texts: those can be longer than a PostgreSQL
# B-tree entry holds (~2 700 bytes: a filter value or a group's labels of up to 2 048 bytes each,
# JSON-escaped), and a point that could not be kept was computed again at every query. The table
# of before (keyed by the texts) is dropped: it is a cache, whatever it held is computed again.
_SCHEMA = """
DROP TABLE IF EXISTS final_points;
CREATE TABLE IF NOT EXISTS kept_points (
    shape_key TEXT NOT NULL,    -- SHA-256 (hex) of the query's shape as JSON: stream, stat, quantile, fields, step,
                                -- window, group-by, filters
    grp_key TEXT NOT NULL,      -- SHA-256 (hex) of grp
    grp TEXT NOT NULL,          -- the group-by values as JSON
    t_ms INTEGER NOT NULL,      -- the window's start
    events INTEGER NOT NULL,    -- the fingerprint of the window's rows (store/point_cache.py): events,
    rows_in INTEGER NOT NULL,   -- rows,
    last_batch INTEGER NOT NULL,  -- newest batch that changed one,
    revision INTEGER NOT NULL,  -- highest revision
    point TEXT NOT NULL,        -- value, count, revision, error bound as JSON (NaN and infinities kept)
    PRIMARY KEY (shape_key, grp_key, t_ms)
);
CREATE TABLE IF NOT EXISTS kept_chunks (
    shape_key TEXT NOT NULL,    -- as kept_points'
    t_ms INTEGER NOT NULL,      -- the chunk's first window start (store/series.py CHUNK windows)
    validity TEXT NOT NULL,     -- the summary of the rows under its windows when they were computed
    points TEXT NOT NULL,       -- [[window start, value, count, revision, error bound], ...] as JSON
    texts TEXT NOT NULL,        -- each point as GET /api/v1/query writes it, one a line
    expires_ms BIGINT,          -- as kept_points'
    PRIMARY KEY (shape_key, t_ms)
);
"""
# Added by FinalPoints (store.connection.SideStore.add_column), never the table replaced: replicas of
# the version before go on writing without them during a rolling upgrade.
# - expires_ms: when retention has dropped every row that could answer the window
#   (store.planner.answerable_ms); NULL: kept for the retention.
# - text: the point as GET /api/v1/query writes it (store/point_text.py), so that a new API
#   process's first query of a day of percentiles reads 1 440 texts instead of writing them
#   (~13 ms); NULL: written when asked.
# - text_of: the `point` that text was written for. A replica of the version before updates a
#   row's point (a straggler recomputed it) and leaves text as it was: the text is served only
#   while the row's point is still the one it was written for.

_PRUNE_EVERY_MS = 3_600_000
# (shape, group, t_ms, fingerprint, point[, keep_ms[, text]]): keep_ms, how long after its window's end
# rows that answer it are kept (store.planner.answerable_ms), without it the retention's; text, the
# point's (store/point_text.py) where written already.
Entry = tuple


class FinalPoints(SideStore):
    def __init__(self, target: str | Path | Db, *, writer: Db | None = None, retention_ms: int | None = None,
                 clock: Callable[[], float] = time.time, synchronous: str = "NORMAL", busy_timeout_s: float = 30.0):
        """`writer`: a second connection for the writes, so a load never waits behind a write that
        waits for the store's write lock (SQLite: a pipeline commit holds it for seconds)."""
        super().__init__(target, _SCHEMA, synchronous=synchronous, busy_timeout_s=busy_timeout_s)
        with self._lock:
            self.add_column("kept_points", "expires_ms", "BIGINT")  # epoch ms: PostgreSQL's INTEGER is 32 bits
            self.add_column("kept_points", "text", "TEXT")
            self.add_column("kept_points", "text_of", "TEXT")
        self._writer_conn = writer or self._conn
        self._write_lock = threading.Lock() if writer is not None else self._lock
        # Points of windows older than this (or than their own keep_ms) are deleted as new ones are
        # saved; None: none is (the service sets it: sketchboard/wiring.py).
        self.retention_ms = retention_ms
        self._pruned_ms = -_PRUNE_EVERY_MS  # when they last were
        self._clock = clock
        self._queue: queue.Queue[tuple[Callable, list, str] | None] = queue.Queue()
        self._writer: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def load(self, shape: Hashable, lo_ms: int, hi_ms: int) -> list[tuple[tuple, int, tuple, Form, str | None]]:
        """(group, t_ms, fingerprint, point, text) of the saved points of `shape` with t_ms in
        [lo_ms, hi_ms), each point as the point cache keeps it (store/kept_point.py); text: the point
        as the API writes it (store/point_text.py), None where a version before kept or last changed
        the point."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT grp, t_ms, events, rows_in, last_batch, revision, point, text, text_of FROM kept_points"
                " WHERE shape_key = ? AND t_ms >= ? AND t_ms < ?", (_shape_key(shape), lo_ms, hi_ms)).fetchall()
        if not rows:
            return []
        groups = {text: tuple(json.loads(text)) for text in {row[0] for row in rows}}
        decoded = json.loads("[" + ",".join(row[6] for row in rows) + "]")  # one parse, not one per point
        return [(groups[grp], t, (events, rows_in, batch, revision), _form(t, fields),
                 text if text_of == point else None)
                for (grp, t, events, rows_in, batch, revision, point, text, text_of), fields in zip(rows, decoded)]

    def save(self, entries: Sequence[Entry]) -> None:
        """Write these points now (a newer fingerprint replaces an older one)."""
        shapes: dict[Hashable, str] = {}
        rows = []
        for shape, group, t, fp, p, *rest in entries:
            if shape not in shapes:
                shapes[shape] = _shape_key(shape)
            grp = _text(group)
            expires = self._expires(t, rest[0] if rest else None)
            fields = _fields_text(p)
            text = rest[1] if len(rest) > 1 else point_text(p)
            rows.append((shapes[shape], _digest(grp), grp, t, *fp, fields, text, fields, expires))
        if not rows:
            return
        with self._write_lock, self._writer_conn.transaction():
            self._writer_conn.executemany(
                "INSERT INTO kept_points (shape_key, grp_key, grp, t_ms, events, rows_in, last_batch, revision, point,"
                " text, text_of, expires_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (shape_key, grp_key, t_ms) DO UPDATE SET events = excluded.events,"
                " rows_in = excluded.rows_in, last_batch = excluded.last_batch, revision = excluded.revision,"
                " point = excluded.point, text = excluded.text, text_of = excluded.text_of,"
                " expires_ms = excluded.expires_ms", rows)
            self._prune_when_due()

    def _prune_when_due(self) -> None:
        """Within a write's transaction: what retention and the granules' keep let go, from both
        tables. Not at every write: expires_ms leads no index, so this reads the whole table. A
        1-minute point is kept as long as the 1-minute rows (8 days shipped), not as long as the
        hours (90): a day of the standard views' minutes is ~40 000 points."""
        now_ms = int(self._clock() * 1000)
        if self.retention_ms is None or now_ms - self._pruned_ms < _PRUNE_EVERY_MS:
            return
        for table in ("kept_points", "kept_chunks"):
            self._writer_conn.execute(f"DELETE FROM {table} WHERE expires_ms < ? OR t_ms < ?",
                                      (now_ms, now_ms - self.retention_ms))
        self._pruned_ms = now_ms

    def _expires(self, t_ms: int, keep_ms: int | None) -> int | None:
        keep_ms = self.retention_ms if keep_ms is None else keep_ms
        if self.retention_ms is not None and keep_ms is not None:
            keep_ms = min(keep_ms, self.retention_ms)
        return None if keep_ms is None else t_ms + keep_ms

    def load_chunks(self, shape: Hashable, validities: Mapping[int, str]) -> list[tuple[int, tuple]]:
        """(chunk start, its groups) of the saved chunks of `shape` starting where `validities` says,
        with the validity it gives (store/point_cache.py keep_chunks); a group: (group, its points as
        the point cache keeps them (store/kept_point.py) in their windows' order, their texts)."""
        if not validities:
            return []
        with self._lock:
            rows = self._conn.execute(
                "SELECT t_ms, validity, points, texts FROM kept_chunks WHERE shape_key = ? AND t_ms >= ? AND t_ms <= ?",
                (_shape_key(shape), min(validities), max(validities))).fetchall()
        rows = [row for row in rows if validities.get(row[0]) == row[1]]
        decoded = json.loads("[" + ",".join(row[2] for row in rows) + "]")  # one parse, not one per chunk
        return [(c, _chunk_groups(points, texts)) for (c, _, _, texts), points in zip(rows, decoded)]

    def save_chunks(self, chunks: Sequence[tuple]) -> None:
        """Write these chunks now: (shape, chunk start, validity, its groups as the point cache keeps
        them (store/point_cache.py ChunkGroups), keep_ms). A point of a group-by's chunk has its
        group last; an ungrouped chunk's points are as the version before wrote them."""
        rows = []
        for shape, c, validity, groups, keep_ms in chunks:
            expires = self._expires(c, keep_ms)
            # One document: json's encoder called per point was most of the writer's time for a day by endpoint
            fields = _text([[p[0], *_fields(p), *([list(group)] if group else ())] for group, points, _ in groups
                            for p in points])
            texts = "\n".join(text for _, _, group_texts in groups for text in group_texts)
            rows.append((_shape_key(shape), c, validity, fields, texts, expires))
        if not rows:
            return
        with self._write_lock, self._writer_conn.transaction():
            self._writer_conn.executemany(
                "INSERT INTO kept_chunks (shape_key, t_ms, validity, points, texts, expires_ms) VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (shape_key, t_ms) DO UPDATE SET validity = excluded.validity, points = excluded.points,"
                " texts = excluded.texts, expires_ms = excluded.expires_ms", rows)
            self._prune_when_due()  # a process may keep only chunks (exact views): they expire too

    def save_chunks_soon(self, chunks: Sequence[tuple]) -> None:
        """save_chunks() on the writer thread."""
        self._hand(self.save_chunks, chunks, "chunks of final points")

    def save_soon(self, entries: Sequence[Entry]) -> None:
        """save() on the writer thread: the caller (a query) goes on at once."""
        self._hand(self.save, entries, "final points")

    def _hand(self, write: Callable[[Sequence], None], entries: Sequence, what: str) -> None:
        if not entries:
            return
        with self._start_lock:
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, name="final-points-writer", daemon=True)
                self._writer.start()
        self._queue.put((write, list(entries), what))

    def flush(self) -> None:
        """Wait until everything handed to save_soon() is written (or given up)."""
        if self._writer is not None:
            self._queue.join()

    def clear(self) -> None:
        """Forget every saved point (a switch replaced a stream's rows: store/switch.py)."""
        self.flush()
        with self._write_lock, self._writer_conn.transaction():
            self._writer_conn.execute("DELETE FROM kept_points")
            self._writer_conn.execute("DELETE FROM kept_chunks")

    def close(self) -> None:
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join(timeout=30)
        if self._writer_conn is not self._conn:
            with self._write_lock:
                self._writer_conn.close()
        super().close()

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                write, entries, what = item
                write(entries)
            except Exception as exc:  # noqa: BLE001 - a point not kept is computed again; the query already answered
                # One line: on a full disk this comes at every query (the reason says enough).
                log.warning("could not keep %d %s in the store: %s: %s", len(entries), what, type(exc).__name__, exc)
            finally:
                self._queue.task_done()


def _text(obj) -> str:
    return json.dumps(obj, separators=(",", ":"))


# Part of every shape's key: raised when the way a kept point is computed changes, so that points
# computed before are never served again (they age out with the retention). 2: KLL's p0 and p100
# are the exact min and max, and a range reaching an end holds it (sketches/kll.py). 3: a KLL's
# -0.0 is answered 0.0, whichever order its sketches were merged in.
POINTS_VERSION = 3


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _shape_key(shape) -> str:
    return _digest(f"{POINTS_VERSION}:{_text(shape)}")


def _fields(p: Point | Form) -> list:
    """A point's value, count, revision and error bound as stored (a Point, or its form: the same order)."""
    e = p[5]
    return [p[1], p[2], p[4], None if e is None else list(e)]


def _fields_text(p: Point | Form) -> str:
    return _text(_fields(p))  # json writes floats exactly (repr), NaN and inf too


def _chunk_groups(points: list[list], texts: str) -> tuple:
    """A stored chunk's points ([window start, value, count, revision, error bound(, group)], in
    groups' then windows' order) and texts, as the point cache keeps a chunk's groups."""
    lines = texts.split("\n") if points else []
    out: dict[tuple, tuple[list, list]] = {}
    for fields, text in zip(points, lines):
        forms, group_texts = out.setdefault(tuple(fields[5]) if len(fields) > 5 else (), ([], []))
        forms.append(_form(fields[0], fields[1:5]))
        group_texts.append(text)
    return tuple((group, tuple(forms), tuple(group_texts)) for group, (forms, group_texts) in out.items())


def _form(t_ms: int, decoded: list) -> Form:
    """A kept point (final) as the point cache keeps it (store/kept_point.py)."""
    value, count, revision, error = decoded
    return (t_ms, value, count, True, revision, None if error is None else tuple(error))

"""Spark's view of the pipeline query (StreamingQueryListener events), stored so that the API
process can serve it while the pipeline runs in another process.

In the pane store's SQLite file, with its own connection: `query_health` holds one row per
pipeline (the latest state), `query_progress` the per-batch StreamingQueryProgress JSON,
pruned past the retention on every write. `query_health` renders the state as the API shows it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from store.connection import Db, SideStore

_SCHEMA = """
CREATE TABLE IF NOT EXISTS query_health (
    pipeline TEXT PRIMARY KEY,
    query_id TEXT,
    run_id TEXT,
    name TEXT,
    running INTEGER NOT NULL,
    started_at_ms INTEGER,
    updated_at_ms INTEGER NOT NULL,  -- the newest listener event of any kind (a liveness beat)
    last_progress_ms INTEGER,
    last_progress TEXT,              -- StreamingQueryProgress.json of the newest batch
    last_idle_ms INTEGER,
    terminated_at_ms INTEGER,
    last_error TEXT
);
CREATE TABLE IF NOT EXISTS query_progress (
    pipeline TEXT NOT NULL,
    at_ms INTEGER NOT NULL,
    batch_id INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    progress TEXT NOT NULL,
    PRIMARY KEY (pipeline, at_ms, batch_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS query_progress_by_time ON query_progress (at_ms);
CREATE TABLE IF NOT EXISTS store_errors (
    pipeline TEXT PRIMARY KEY,
    failing INTEGER NOT NULL DEFAULT 0,  -- the pipeline's commits fail now (it retries)
    message TEXT,                        -- the newest error (kept after recovery)
    since_ms INTEGER,                    -- when the current (or last) run of failures began
    last_ms INTEGER,
    retries INTEGER NOT NULL DEFAULT 0,  -- failed tries of the current run of failures
    total INTEGER NOT NULL DEFAULT 0     -- failed tries ever
);
"""

# A disk-full store cannot take a new row; an update in place usually still fits in the page the
# row was reserved in (reserve_store_errors writes it at start with a message this long).
_MESSAGE_CHARS = 400


@dataclass(frozen=True)
class QueryHealth:
    pipeline: str
    query_id: str | None
    run_id: str | None
    name: str | None
    running: bool
    started_at_ms: int | None
    updated_at_ms: int
    last_progress_ms: int | None
    last_progress: dict | None
    last_idle_ms: int | None
    terminated_at_ms: int | None
    last_error: str | None


class HealthStore(SideStore):
    def __init__(self, path: str | Path | Db, *, retention_ms: int = 86_400_000, synchronous: str = "NORMAL",
                 busy_timeout_s: float = 30.0):
        if retention_ms <= 0:
            raise ValueError(f"progress retention must be positive, got {retention_ms} ms")
        super().__init__(path, _SCHEMA, synchronous=synchronous, busy_timeout_s=busy_timeout_s)
        self.retention_ms = retention_ms

    # -- writing (the pipeline process's listener) ----------------------------------------

    def started(self, pipeline: str, query_id: str, run_id: str, name: str | None, at_ms: int) -> None:
        with self._lock:
            self._conn.execute(
                "INSERT INTO query_health (pipeline, query_id, run_id, name, running, started_at_ms, updated_at_ms,"
                " terminated_at_ms, last_error) VALUES (?, ?, ?, ?, 1, ?, ?, NULL, NULL)"
                " ON CONFLICT (pipeline) DO UPDATE SET query_id = excluded.query_id, run_id = excluded.run_id,"
                " name = excluded.name, running = 1, started_at_ms = excluded.started_at_ms,"
                " updated_at_ms = excluded.updated_at_ms, terminated_at_ms = NULL, last_error = NULL",
                (pipeline, query_id, run_id, name, at_ms, at_ms),
            )

    def reserve_store_errors(self, pipeline: str) -> None:
        """Make the pipeline's store-error row now, at full size, while the store can still grow."""
        with self._lock, self._conn.transaction() as conn:
            conn.execute("INSERT INTO store_errors (pipeline, message) VALUES (?, ?) ON CONFLICT (pipeline) DO NOTHING",
                         (pipeline, " " * _MESSAGE_CHARS))
            conn.execute("UPDATE store_errors SET message = NULL WHERE pipeline = ? AND message = ?",
                         (pipeline, " " * _MESSAGE_CHARS))

    def store_failing(self, pipeline: str, message: str, at_ms: int) -> None:
        """A commit failed (the pipeline retries it)."""
        with self._lock:
            self._conn.execute(
                "UPDATE store_errors SET since_ms = CASE WHEN failing = 1 THEN since_ms ELSE ? END, failing = 1,"
                " message = ?, last_ms = ?, retries = retries + 1, total = total + 1 WHERE pipeline = ?",
                (at_ms, message[:_MESSAGE_CHARS], at_ms, pipeline))

    def store_recovered(self, pipeline: str, at_ms: int) -> None:
        with self._lock:
            self._conn.execute("UPDATE store_errors SET failing = 0, retries = 0, last_ms = ? WHERE pipeline = ?"
                               " AND failing = 1", (at_ms, pipeline))

    def store_errors(self, pipeline: str) -> dict | None:
        with self._lock:
            row = self._conn.execute("SELECT failing, message, since_ms, last_ms, retries, total FROM store_errors"
                                     " WHERE pipeline = ?", (pipeline,)).fetchone()
        if row is None:
            return None
        return {"failing": bool(row[0]), "message": row[1], "since_ms": row[2], "last_ms": row[3],
                "retries": row[4], "total": row[5]}

    def progress(self, pipeline: str, run_id: str, batch_id: int, progress: dict, at_ms: int) -> None:
        text = json.dumps(progress, separators=(",", ":"))
        with self._lock, self._conn.transaction() as conn:
            conn.execute(
                "INSERT INTO query_progress (pipeline, at_ms, batch_id, run_id, progress) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (pipeline, at_ms, batch_id) DO UPDATE SET run_id = excluded.run_id,"
                " progress = excluded.progress",
                (pipeline, at_ms, batch_id, run_id, text),
            )
            conn.execute("DELETE FROM query_progress WHERE at_ms < ?", (at_ms - self.retention_ms,))
            self._upsert_beat(pipeline, run_id, at_ms, "last_progress_ms = ?, last_progress = ?", (at_ms, text))

    def idle(self, pipeline: str, run_id: str, at_ms: int) -> None:
        with self._lock:
            self._upsert_beat(pipeline, run_id, at_ms, "last_idle_ms = ?", (at_ms,))

    def terminated(self, pipeline: str, run_id: str | None, error: str | None, at_ms: int) -> None:
        """The query stopped (error None) or failed. A run_id other than the stored one is an
        older run: ignored, so a late event cannot mark a newer run as stopped."""
        with self._lock:
            self._conn.execute(
                "UPDATE query_health SET running = 0, terminated_at_ms = ?, updated_at_ms = ?,"
                " last_error = COALESCE(CAST(? AS TEXT), last_error) WHERE pipeline = ? AND (CAST(? AS TEXT) IS NULL OR run_id = ?) AND running = 1",
                (at_ms, at_ms, error, pipeline, run_id, run_id),
            )

    def _upsert_beat(self, pipeline: str, run_id: str, at_ms: int, sets: str, args: tuple) -> None:
        # A progress or idle event of the current run; if the started event was missed
        # (listener registered late), the row is created from this one.
        self._conn.execute(
            "INSERT INTO query_health (pipeline, run_id, running, updated_at_ms) VALUES (?, ?, 1, ?)"
            " ON CONFLICT (pipeline) DO NOTHING",
            (pipeline, run_id, at_ms),
        )
        self._conn.execute(
            f"UPDATE query_health SET {sets}, updated_at_ms = {self._conn.greatest}(updated_at_ms, ?)"
            " WHERE pipeline = ? AND run_id = ?",
            (*args, at_ms, pipeline, run_id),
        )

    # -- reading (the API process) -----------------------------------------------------

    def state(self, pipeline: str) -> QueryHealth | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT pipeline, query_id, run_id, name, running, started_at_ms, updated_at_ms, last_progress_ms,"
                " last_progress, last_idle_ms, terminated_at_ms, last_error FROM query_health WHERE pipeline = ?",
                (pipeline,),
            ).fetchone()
        if row is None:
            return None
        values = list(row)
        values[4] = bool(values[4])
        values[8] = json.loads(values[8]) if values[8] else None
        return QueryHealth(*values)

    def history(self, pipeline: str, from_ms: int, to_ms: int, limit: int = 1000) -> list[dict]:
        """Stored StreamingQueryProgress objects with from_ms <= at < to_ms (the newest `limit`)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT progress FROM (SELECT at_ms, batch_id, progress FROM query_progress"
                " WHERE pipeline = ? AND at_ms >= ? AND at_ms < ? ORDER BY at_ms DESC LIMIT ?) AS newest ORDER BY at_ms, batch_id",
                (pipeline, from_ms, to_ms, limit),
            ).fetchall()
        return [json.loads(r[0]) for r in rows]



SqliteHealthStore = HealthStore  # the name from before PostgreSQL; the same class on a file path


# A query whose listener has said nothing for this long is reported as not running: a
# killed pipeline process (SIGKILL, OOM) never sends onQueryTerminated. Spark sends an idle
# event every spark.sql.streaming.noDataProgressEventInterval (10 s) while waiting for data.
STALE_AFTER_MS = 30_000


def query_health(health_store: HealthStore | None, pipeline: str, now_ms: int, *, stale_after_ms: int = STALE_AFTER_MS) -> dict | None:
    """The `query` object of the `pipeline` message (and of GET /api/v1/pipeline's health):
    None before the pipeline's query ever started."""
    state = health_store.state(pipeline) if health_store is not None else None
    if state is None:
        return None
    p = state.last_progress or {}
    event_time = p.get("eventTime") or {}
    durations = p.get("durationMs") or {}
    silent_ms = now_ms - state.updated_at_ms
    stale = state.running and silent_ms > stale_after_ms
    dropped = sum(op.get("numRowsDroppedByWatermark", 0) or 0 for op in p.get("stateOperators") or [])
    return {
        "running": state.running and not stale,
        "stale": stale,
        "query_id": state.query_id,
        "run_id": state.run_id,
        "name": state.name,
        "started_at_ms": state.started_at_ms,
        "terminated_at_ms": state.terminated_at_ms,
        "last_event_ms": state.updated_at_ms,
        "seconds_since_last_event": round(silent_ms / 1000, 3),
        "last_progress_ms": state.last_progress_ms,
        "last_idle_ms": state.last_idle_ms,
        "batch_id": p.get("batchId"),
        "num_input_rows": p.get("numInputRows"),
        "input_rows_per_second": _number(p.get("inputRowsPerSecond")),
        "processed_rows_per_second": _number(p.get("processedRowsPerSecond")),
        "batch_duration_ms": p.get("batchDuration", durations.get("triggerExecution")),
        "duration_ms": durations,
        "watermark": event_time.get("watermark"),
        "rows_dropped_by_watermark": dropped,
        "last_error": state.last_error,  # of the newest run (cleared when a run starts)
    }


def _number(value) -> float | None:
    try:
        return None if value is None else round(float(value), 3)
    except (TypeError, ValueError):  # Spark writes NaN/Infinity as strings in some versions
        return None

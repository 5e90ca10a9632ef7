"""Websocket feeds (coordination.md): `LagFeed` (topic "lag") and the `query` part of the
`pipeline` message from the Spark progress stored by aggregates/progress.py."""

from __future__ import annotations

from lag.report import LagMonitor

# A query whose listener has said nothing for this long is reported as not running: a
# killed pipeline process (SIGKILL, OOM) never sends onQueryTerminated. Spark sends an idle
# event every spark.sql.streaming.noDataProgressEventInterval (10 s) while waiting for data.
STALE_AFTER_MS = 30_000


class LagFeed:
    """One `lag` message per new sampling round (nothing when no new samples were stored)."""

    topic = "lag"

    def __init__(self, monitor: LagMonitor):
        self.monitor = monitor
        self._last_at_ms: int | None = None

    def poll(self) -> list[dict]:
        newest = self.monitor.store.newest_at_ms(self.monitor.pipeline)
        if newest is None or newest == self._last_at_ms:
            return []
        self._last_at_ms = newest
        message = self.monitor.report().to_message()
        if self.monitor.registry is not None:  # fan-out: every consumer of the log, for the lag panel's table
            message["consumers"] = self.monitor.consumers()
        return [message]


def query_health(health_store, pipeline: str, now_ms: int, *, stale_after_ms: int = STALE_AFTER_MS) -> dict | None:
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

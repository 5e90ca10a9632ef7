"""GET /api/v1/corrections and /api/v1/dead-letters, and the websocket's `corrections` feed.

A correction is a change to a pane that was already final (the stream's watermark had
passed its end before the batch that changed it). Each one carries the pane, its
revision before and after, the batch, how many events it added, and the pane's stats
before and after, so a client that showed the old value can retract it exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fastapi import APIRouter, HTTPException, Query

from api.context import ApiContext
from api.errors import MAX_ID, bad_request, errors, optional_range
from api.responses import CorrectionsOut, DeadLettersOut
from catalog import Catalog, MetricDef
from store import DEAD_LETTER_REASONS, Correction, PaneStore
from store.definitions import DefinitionStore

MAX_LIMIT = 10_000


def _narrow(stats: dict, metric: MetricDef | None) -> dict:
    """A metric's view of pane stats: the count, its value field, its distinct field."""
    if metric is None:
        return stats
    values = stats.get("values", {})
    distinct = stats.get("distinct", {})
    return {
        "count": stats.get("count", 0),
        "values": {metric.value: values[metric.value]} if metric.value and metric.value in values else {},
        "distinct": {metric.distinct: distinct[metric.distinct]} if metric.distinct and metric.distinct in distinct else {},
    }


def correction_message(c: Correction, metric: MetricDef | None = None) -> dict:
    """A correction in the websocket's message format, also used by the REST list."""
    return {
        "type": "correction",
        "id": c.id,
        "stream": c.stream,
        "pane_start_ms": c.pane_start_ms,
        "pane_end_ms": c.pane_end_ms,
        "dims": dict(c.dims),
        "revision_from": c.revision_from,
        "revision_to": c.revision_to,
        "batch_id": c.batch_id,
        "events_added": c.events_added,
        "at_ms": c.at_ms,
        "old": _narrow(dict(c.old), metric),
        "new": _narrow(dict(c.new), metric),
    }


class CorrectionsFeed:
    """Feed for the websocket hub (topic "corrections"): poll() returns the correction
    messages recorded since the previous call. It starts at the newest correction already
    stored, so a freshly started API process does not replay history (that is what
    GET /api/v1/corrections is for); nor after a switch, by whichever process: the copies of the
    run's corrections it moved into the root under new ids are history, and `switched` (the root's
    DefinitionStore.switched_corrections) names their ids. Thread-safe enough for one tailer thread."""

    topic = "corrections"

    def __init__(self, store: PaneStore, *, max_per_poll: int = 1000,
                 switched: Callable[[int], Sequence[tuple[int, int]]] | None = None):
        self.store = store
        self.max_per_poll = max_per_poll
        self.switched = switched
        self.cursor = store.max_correction_id()

    def poll(self) -> list[dict]:
        rows = self.store.corrections(after_id=self.cursor, limit=self.max_per_poll)
        if not rows:
            return []
        # Read after the rows: a switch records its copies' ids in the transaction that made them,
        # so every copy among the rows is in a range read now.
        copied = self._switched(self.cursor)
        self.cursor = rows[-1].id
        return [correction_message(c) for c in rows if not any(first <= c.id <= last for first, last in copied)]

    def _switched(self, after_id: int) -> Sequence[tuple[int, int]]:
        if self.switched is None:  # opened once there is something to check: an idle feed holds no connection
            self.switched = DefinitionStore(self.store.side_db()).switched_corrections
        return self.switched(after_id)


def _stream_and_metric(catalog: Catalog, stream: str | None, metric: str | None) -> tuple[str | None, MetricDef | None]:
    definition = None
    if metric is not None:
        try:
            definition = catalog.metric(metric)
        except KeyError as exc:
            raise HTTPException(404, str(exc.args[0])) from None
        if stream is not None and stream != definition.stream:
            raise bad_request("stream", f"metric {metric!r} belongs to stream {definition.stream!r}, not {stream!r}")
        stream = definition.stream
    elif stream is not None and stream not in catalog.streams:
        raise HTTPException(404, f"unknown stream {stream!r}; defined: {', '.join(sorted(catalog.streams))}")
    return stream, definition


def router(ctx: ApiContext) -> APIRouter:
    r = APIRouter(prefix="/api/v1", tags=["corrections"])

    @r.get(
        "/corrections",
        summary="Correction history: changes to panes after they became final",
        response_model=None,
        responses={200: {"model": CorrectionsOut, "description": "the corrections"},
                   **errors(400, 404, e404="unknown stream or metric")},
    )
    def corrections(
        stream: str | None = Query(None, description="only this stream"),
        metric: str | None = Query(None, description="only this metric's stream, and only its fields in old/new"),
        start: str | None = Query(None, alias="from", description="panes starting at or after this instant"
                                  " ('now-1h', RFC 3339, epoch ms or s)"),
        end: str | None = Query(None, alias="to", description="panes starting before this instant"),
        after_id: int | None = Query(None, ge=0, le=MAX_ID, description="only ids above this one, oldest first (for tailing);"
                                     " without it the newest come first"),
        limit: int = Query(100, ge=1, le=MAX_LIMIT),
    ) -> dict:
        stream, definition = _stream_and_metric(ctx.catalog, stream, metric)
        now = ctx.now_ms()
        start_ms, end_ms = optional_range(start, end, now)
        rows = ctx.store.corrections(stream=stream, start_ms=start_ms, end_ms=end_ms, after_id=after_id or 0,
                                     limit=limit, newest_first=after_id is None)
        return {"corrections": [correction_message(c, definition) for c in rows], "count": len(rows)}

    @r.get(
        "/dead-letters",
        summary="Records that were not aggregated, and why (newest first), with counts per reason",
        response_model=None,
        responses={200: {"model": DeadLettersOut, "description": "the dead letters"},
                   **errors(400, 404, e404="unknown stream")},
    )
    def dead_letters(
        stream: str | None = Query(None, description="only this stream"),
        reason: str | None = Query(None, description=f"only this reason: {', '.join(DEAD_LETTER_REASONS)}"),
        limit: int = Query(100, ge=1, le=MAX_LIMIT),
    ) -> dict:
        stream, _ = _stream_and_metric(ctx.catalog, stream, None)
        if reason is not None and reason not in DEAD_LETTER_REASONS:
            raise bad_request("reason", f"unknown reason {reason!r}; reasons: {', '.join(DEAD_LETTER_REASONS)}")
        rows = ctx.store.dead_letters(stream=stream, reason=reason, limit=limit)
        progress = ctx.store.progress(ctx.pipeline_name, row_counts=False).streams
        counts = {name: dict(s.dead_lettered_by_reason) for name, s in progress.items()
                  if stream is None or name == stream}
        return {
            "dead_letters": [
                {"id": d.id, "stream": d.letter.stream, "partition": d.letter.partition, "offset": d.letter.offset,
                 "reason": d.letter.reason, "error": d.letter.error, "event_time_ms": d.letter.event_time_ms,
                 "ingest_time_ms": d.letter.ingest_time_ms, "dims": d.letter.dims, "batch_id": d.batch_id,
                 "at_ms": d.at_ms, "clock_correction_ms": d.letter.clock_correction_ms}
                for d in rows
            ],
            "count": len(rows),
            "totals_by_reason": counts,
        }

    return r

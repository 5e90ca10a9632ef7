"""GET /api/v1/lag: the consumer lag status now and its stored time series."""

from __future__ import annotations

from collections import defaultdict

from fastapi import APIRouter, HTTPException, Query
from starlette.concurrency import run_in_threadpool

from api.context import ApiContext
from api.errors import errors, param_error
from api.responses import LagOut
from catalog.times import BadParam, parse_range_ms
from store.lag import LagSample

MAX_SAMPLES = 100_000


def series_json(samples: list[LagSample]) -> dict:
    """Per partition, per stream and for the pipeline: one point per sampling round.
    Totals add events; their lag in seconds is the largest (the oldest unprocessed record)."""
    partitions: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    rounds: dict[int, dict[str, list[LagSample]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        partitions[s.stream][str(s.partition)].append(
            {"t": s.at_ms, "log_end": s.log_end, "committed": s.committed, "lag_events": s.lag_events,
             "lag_seconds": s.lag_seconds})
        rounds[s.at_ms][s.stream].append(s)
    streams: dict[str, list] = defaultdict(list)
    pipeline = []
    for at_ms in sorted(rounds):
        everything = []
        for stream, group in rounds[at_ms].items():
            streams[stream].append(_total(at_ms, group))
            everything += group
        pipeline.append(_total(at_ms, everything))
    return {"pipeline": pipeline, "streams": dict(streams),
            "partitions": {k: dict(v) for k, v in partitions.items()}}


def _total(at_ms: int, group: list[LagSample]) -> dict:
    seconds = [s.lag_seconds for s in group if s.lag_seconds is not None]
    return {"t": at_ms, "lag_events": sum(s.lag_events for s in group), "lag_seconds": max(seconds) if seconds else None}


def router(ctx: ApiContext) -> APIRouter:
    r = APIRouter(prefix="/api/v1", tags=["status"])

    @r.get(
        "/lag",
        summary="Consumer lag: status (Burrow-style, no thresholds) and its time series",
        response_model=None,
        responses={200: {"model": LagOut, "description": "the lag status now and its series"},
                   **errors(400, 404, 503, e404="unknown stream", e503="lag monitoring is not configured in this process")},
    )
    async def lag(
        stream: str | None = Query(None, description="only this stream (default: all)"),
        start: str = Query("now-15m", alias="from", description="series start: 'now-15m', RFC 3339, epoch ms or s"),
        end: str = Query("now", alias="to", description="series end (exclusive)"),
    ) -> dict:
        monitor = ctx.lag
        if monitor is None:
            raise HTTPException(503, "lag monitoring is not configured in this API process")
        if stream is not None and stream not in ctx.catalog.streams:
            raise HTTPException(404, f"unknown stream {stream!r}; streams: {', '.join(sorted(ctx.catalog.streams))}")
        now = ctx.now_ms()
        try:
            start_ms, end_ms = parse_range_ms(start, end, now)
        except BadParam as exc:
            raise param_error(exc) from None

        def compute() -> dict:
            # 'to' = now must include a sample taken at this very millisecond.
            samples = monitor.store.series(monitor.pipeline, start_ms, end_ms + (1 if end_ms == now else 0),
                                           stream=stream, limit=MAX_SAMPLES)
            body = monitor.message(stream)  # the websocket `lag` message's body (lag/feed.py)
            del body["type"]
            body["consumers"] = monitor.consumers(stream)
            body["series"] = {"from_ms": start_ms, "to_ms": end_ms, "truncated": len(samples) >= MAX_SAMPLES,
                              **series_json(samples)}
            return body

        return await run_in_threadpool(compute)

    return r

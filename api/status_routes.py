"""Pipeline progress, health, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from api.context import ApiContext


def pipeline_status(ctx: ApiContext) -> dict:
    progress = ctx.store.progress(ctx.pipeline_name)
    now = ctx.now_ms()
    streams = {}
    for name in ctx.catalog.streams:
        offsets = ctx.log.offsets(name)
        committed = progress.end_offsets.get(name, {})
        partitions = {
            p: {"log_start": o.start, "log_end": o.end, "committed": committed.get(p, o.start),
                "lag_events": max(0, o.end - max(committed.get(p, o.start), o.start))}
            for p, o in offsets.items()
        }
        s = progress.streams.get(name)
        streams[name] = {
            "watermark_ms": s.watermark_ms if s else None,
            "max_event_ms": s.max_event_ms if s else None,
            "events_in_log": sum(o.end - o.start for o in offsets.values()),
            "events_aggregated": s.events_aggregated if s else 0,
            # read = aggregated + dead-lettered, always (checked in every batch's commit)
            "events_read": s.events_read if s else 0,
            "events_dead_lettered": s.events_dead_lettered if s else 0,
            "dead_lettered_by_reason": dict(s.dead_lettered_by_reason) if s else {},
            "corrections": s.corrections if s else 0,
            "panes": s.panes if s else 0,
            "lag_events": sum(p["lag_events"] for p in partitions.values()),
            "partitions": partitions,
        }
    return {
        "pipeline": ctx.pipeline_name,
        "last_batch_id": progress.last_batch_id,
        "last_commit_ms": progress.last_commit_ms,
        "seconds_since_last_commit": None if progress.last_commit_ms is None
        else round((now - progress.last_commit_ms) / 1000, 3),
        "batches": progress.batches,
        "events_read": progress.events_read,
        "lag_events": sum(s["lag_events"] for s in streams.values()),
        "streams": streams,
    }


def router(ctx: ApiContext) -> APIRouter:
    r = APIRouter()

    @r.get("/api/v1/pipeline", tags=["status"], summary="Pipeline progress: batches, watermarks, offsets, lag")
    def pipeline() -> dict:
        return pipeline_status(ctx)

    @r.get("/healthz", tags=["status"], summary="The API process is alive")
    def healthz() -> dict:
        return {"status": "ok"}

    @r.get("/readyz", tags=["status"], summary="The log and the store answer")
    def readyz(response: Response) -> dict:
        checks = {}
        for name, probe in (("log", lambda: ctx.log.offsets(next(iter(ctx.catalog.streams)))),
                            ("store", lambda: ctx.store.last_batch_id(ctx.pipeline_name))):
            try:
                probe()
                checks[name] = "ok"
            except Exception as exc:  # readiness reports any failure rather than raising it
                checks[name] = f"error: {exc}"
        ready = all(v == "ok" for v in checks.values())
        response.status_code = 200 if ready else 503
        return {"status": "ready" if ready else "not ready", "checks": checks}

    @r.get("/metrics", tags=["status"], summary="Prometheus text format")
    def metrics() -> Response:
        # A fresh registry per scrape: the values are read from the store and log, not kept here.
        registry = CollectorRegistry()
        status = pipeline_status(ctx)
        in_log = Gauge("sketchboard_log_events", "Events retained in the log", ["stream"], registry=registry)
        aggregated = Gauge("sketchboard_events_aggregated", "Events merged into panes", ["stream"], registry=registry)
        lag = Gauge("sketchboard_lag_events", "Events in the log not yet aggregated", ["stream", "partition"],
                    registry=registry)
        watermark = Gauge("sketchboard_watermark_seconds", "Event-time watermark", ["stream"], registry=registry)
        batches = Gauge("sketchboard_batches_committed", "Micro-batches committed", registry=registry)
        batches.set(status["batches"])
        for name, s in status["streams"].items():
            in_log.labels(name).set(s["events_in_log"])
            aggregated.labels(name).set(s["events_aggregated"])
            if s["watermark_ms"] is not None:
                watermark.labels(name).set(s["watermark_ms"] / 1000)
            for p, part in s["partitions"].items():
                lag.labels(name, str(p)).set(part["lag_events"])
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return r

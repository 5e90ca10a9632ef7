"""Pipeline progress, health, readiness and Prometheus metrics."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Response
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, Field
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, StateSetMetricFamily

from api import clock_routes, http_metrics, reprocess_routes
from api.join_status import join_metrics, join_status
from api.pattern_status import pattern_metrics, pattern_status
from api.alert_routes import alert_metrics
from api.cdc_routes import cdc_metrics
from api.ingest_metrics import ingest_worker_metrics
from api.context import ApiContext
from api.responses import HealthOut, PipelineOut
from store.health import query_health
from store.lag import LagStatus
from store.lease_rules import replica_of

log = logging.getLogger("sketchboard.metrics")


class ReadyOut(BaseModel):
    status: str = Field(description="'ready' or 'not ready'")
    checks: dict[str, str] = Field(description="per component (log, store): 'ok' or 'error: ...'")


def health_status(ctx: ApiContext) -> dict:
    """The `health` section of GET /api/v1/pipeline: Spark's view of the query, and the lag status."""
    now = ctx.now_ms()
    lag = None
    if ctx.lag is not None:
        report = ctx.lag.report()
        lag = {"status": report.verdict.status.value, "reason": report.verdict.reason,
               "lag_events": report.lag_events, "lag_seconds": report.lag_seconds}
    store = ctx.health.store_errors(ctx.pipeline_name) if ctx.health is not None else None
    return {"query": query_health(ctx.health, ctx.pipeline_name, now), "lag": lag, "store": store}


def leader_status(ctx: ApiContext) -> dict | None:
    """The `leader` section of GET /api/v1/pipeline: which API replica holds the lease and so runs
    the alert evaluator, notifier and lag sampler (store/lease.py), and whether it is this one."""
    leadership = ctx.leadership
    if leadership is None:
        return None
    row = leadership.holder()
    # `holder` is the replica id, as `this_replica`; `holder_process` adds the holding process's nonce.
    return {"lease": row.name, "holder": replica_of(row.record.holder), "holder_process": row.record.holder,
            "epoch": row.record.epoch,
            "acquired_at_ms": row.acquired_at_ms, "renewed_at_ms": row.renewed_at_ms, "ttl_ms": row.ttl_ms,
            "this_replica": leadership.me, "leading": leadership.leading(), "error": leadership.last_error}


def pipeline_status(ctx: ApiContext, *, row_counts: bool = True) -> dict:
    """GET /api/v1/pipeline's answer; `row_counts`: with each stream's panes and corrections counted
    (a scan of every pane: PaneStore.progress), else those two are null."""
    progress = ctx.store.progress(ctx.pipeline_name, row_counts=row_counts)
    # Before its first commit of a partition, the pipeline is where its first run started (pinned,
    # recorded in the consumer registry), not at the log's start: as the lag sampler sees it.
    registry = ctx.lag.registry if ctx.lag is not None else None
    started = registry.starts(ctx.pipeline_name) if registry is not None else {}
    now = ctx.now_ms()
    streams = {}
    sessioned = [n for n, s in ctx.catalog.streams.items() if s.sessions is not None and not s.derived_from]
    open_sessions = ctx.store.session_sizes() if sessioned else {}
    for name in ctx.catalog.streams:
        offsets = ctx.log.offsets(name)
        committed = {**started.get(name, {}), **progress.end_offsets.get(name, {})}
        s = progress.streams.get(name)
        lateness = ctx.catalog.streams[name].allowed_lateness
        marks = s.partitions if s else {}
        partitions = {
            p: {"log_start": o.start, "log_end": o.end, "committed": committed.get(p, o.start),
                "lag_events": max(0, o.end - max(committed.get(p, o.start), o.start)),
                "max_event_ms": marks[p].mark.max_event_ms if p in marks else None,
                "watermark_ms": marks[p].mark.watermark_ms(lateness) if p in marks else None,
                "watermark_state": marks[p].state if p in marks else None}
            for p, o in offsets.items()
        }
        streams[name] = {
            "watermark_ms": s.watermark_ms if s else None,
            "watermark_held_by_partition": s.held_by_partition if s else None,
            "max_event_ms": s.max_event_ms if s else None,
            "events_in_log": sum(o.end - o.start for o in offsets.values()),
            "events_aggregated": s.events_aggregated if s else 0,
            # read = aggregated + dead-lettered + duplicates dropped, always (checked in every batch's commit)
            "events_read": s.events_read if s else 0,
            "events_dead_lettered": s.events_dead_lettered if s else 0,
            "dead_lettered_by_reason": dict(s.dead_lettered_by_reason) if s else {},
            # null: the stream declares no event_id_field (aggregates/event_ids.py)
            "duplicates_dropped": (s.duplicates_dropped if s else 0) if ctx.catalog.streams[name].event_id_field
            else None,
            # null: the stream declares no enrich (catalog/enrichment.py); else events enriched with "" per table
            "enrich_misses": ({d.table: (s.enrich_misses.get(d.table, 0) if s else 0)
                               for d in ctx.catalog.streams[name].enrich} or None),
            # null: the stream declares no sessions (aggregates/session_batch.py)
            "open_sessions": open_sessions.get(name, 0) if name in sessioned else None,
            "corrections": (s.corrections if s else 0) if row_counts else None,
            "panes": (s.panes if s else 0) if row_counts else None,
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
        "joins": join_status(ctx),  # window joins: state sizes and counters (api/join_status.py)
        "patterns": pattern_status(ctx),  # patterns: state sizes and counters (api/pattern_status.py)
    }


def router(ctx: ApiContext) -> APIRouter:
    r = APIRouter()

    @r.get("/api/v1/pipeline", tags=["status"],
           summary="Pipeline progress: batches, watermarks, offsets, lag, and health (Spark's query progress)",
           response_model=None, responses={200: {"model": PipelineOut, "description": "progress and health"}})
    def pipeline() -> dict:
        return {**pipeline_status(ctx), "health": health_status(ctx), "leader": leader_status(ctx),
                "definitions": None if ctx.reprocess is None else reprocess_routes.definitions_status(ctx.reprocess)}

    @r.get("/healthz", tags=["status"], summary="The API process is alive", response_model=HealthOut)
    def healthz() -> dict:
        return {"status": "ok"}

    @r.get("/readyz", tags=["status"], summary="The log and the store answer",
           responses={503: {"model": ReadyOut, "description": "the log or the store does not answer;"
                            " `checks` says which"}})
    def readyz(response: Response) -> ReadyOut:
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
        return ReadyOut(status="ready" if ready else "not ready", checks=checks)

    @r.get("/metrics", tags=["status"], summary="Prometheus text format", response_class=PlainTextResponse,
           responses={200: {"description": "Prometheus text exposition format",
                            "content": {"text/plain": {"schema": {"type": "string"}}}}})
    def metrics() -> Response:
        # A fresh registry per scrape: the values are read from the store and log, not kept here.
        # Each source is read on its own: one that fails (the brokers away) is left out and says
        # so in sketchboard_scrape_source_up, and the others are still exported.
        registry = CollectorRegistry()
        registry.register(_Families(scrape_sources(ctx)))
        registry.register(_ProcessRegistry(http_metrics.REGISTRY))
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return r


def _pipeline_families(ctx: ApiContext) -> list:
    """Counters, log and lag in events, watermarks, joins and patterns: the log's offsets and the
    store's progress (pipeline_status)."""
    status = pipeline_status(ctx, row_counts=False)  # each scrape: the counts are not exported
    registry = CollectorRegistry()
    in_log = Gauge("sketchboard_log_events", "Events retained in the log", ["stream"], registry=registry)
    lag = Gauge("sketchboard_lag_events", "Events in the log not yet aggregated", ["stream", "partition"],
                registry=registry)
    watermark = Gauge("sketchboard_watermark_seconds", "Event-time watermark", ["stream"], registry=registry)
    batches = Gauge("sketchboard_batches_committed", "Micro-batches committed", registry=registry)
    batches.set(status["batches"])
    for name, s in status["streams"].items():
        in_log.labels(name).set(s["events_in_log"])
        if s["watermark_ms"] is not None:
            watermark.labels(name).set(s["watermark_ms"] / 1000)
        for p, part in s["partitions"].items():
            lag.labels(name, str(p)).set(part["lag_events"])
    return [*_StoredMetrics(ctx).pipeline(status), *registry.collect()]


def _clock_families(ctx: ApiContext) -> list:
    registry = CollectorRegistry()
    clock_routes.prometheus_gauges(ctx, registry)  # device clock offsets (streams with a sent_time_field)
    return list(registry.collect())


def scrape_sources(ctx: ApiContext) -> list:
    """Every source's metric families, each read on its own, and `sketchboard_scrape_source_up`
    (1: read, 0: failed and left out of this scrape)."""
    stored = _StoredMetrics(ctx)
    sources = [("pipeline", lambda: _pipeline_families(ctx)), ("query", stored._query)]
    if ctx.lag is not None:
        sources.append(("lag", stored._lag))
    if ctx.alerts is not None:
        sources.append(("alerts", lambda: alert_metrics(ctx.alerts)))
    if ctx.leadership is not None:
        sources.append(("leader", stored._leader))
    if ctx.reprocess is not None:
        sources.append(("reprocess", lambda: reprocess_routes.reprocess_metrics(ctx.reprocess)))
    if ctx.cdc:
        sources.append(("cdc", lambda: cdc_metrics(ctx.cdc)))
    if ctx.ingest_workers is not None:
        sources.append(("ingest_workers", lambda: ingest_worker_metrics(ctx.ingest_workers)))
    sources.append(("device_clocks", lambda: _clock_families(ctx)))
    families = []
    up = GaugeMetricFamily("sketchboard_scrape_source_up", "1 when this scrape read the source (pipeline: the log"
                           " and the store's progress; lag, query, alerts, leader, reprocess, cdc, ingest_workers,"
                           " device_clocks), 0 when it failed and its metrics are left out", labels=["source"])
    for name, collect in sources:
        try:
            got = list(collect())
        except Exception as exc:  # one source away must not take every series with it
            log.warning("/metrics: %s left out of this scrape: %s: %s", name, type(exc).__name__, exc)
            up.add_metric([name], 0)
        else:
            families.extend(got)
            up.add_metric([name], 1)
    return [*families, up]


class _Families:
    """Metric families read before the registry collects them."""

    def __init__(self, families: list):
        self.families = families

    def collect(self):
        return iter(self.families)


class _ProcessRegistry:
    """Exposes a process-level registry (HTTP request metrics) in the per-scrape one."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry

    def collect(self):
        return self.registry.collect()


class _StoredMetrics:
    """Counters and gauges read from the store on each scrape: events in (appended to the
    log: the sum of its end offsets, which are never reused), aggregated and dead-lettered;
    lag per partition (events, seconds, status) from the lag monitor; Spark's last batch."""

    def __init__(self, ctx: ApiContext):
        self.ctx = ctx

    def pipeline(self, status: dict):
        """The counters of pipeline_status(ctx)'s `status`."""
        events_in = CounterMetricFamily("sketchboard_events_in", "Events accepted into the log", labels=["stream"])
        aggregated = CounterMetricFamily("sketchboard_events_aggregated", "Events merged into panes",
                                         labels=["stream"])
        dead = CounterMetricFamily("sketchboard_events_dead_lettered", "Events sent to the dead-letter table",
                                   labels=["stream"])
        by_reason = CounterMetricFamily("sketchboard_events_dead_lettered_by_reason",
                                        "Events sent to the dead-letter table, per reason", labels=["stream", "reason"])
        duplicates = CounterMetricFamily("sketchboard_duplicate_events_dropped",
                                         "Events dropped as copies of an event id counted within the stream's"
                                         " dedup_window (streams with an event_id_field)", labels=["stream"])
        misses = CounterMetricFamily("sketchboard_enrich_misses",
                                     "Events enriched with \"\" because their key had no row of the table at their"
                                     " time (streams with enrich)", labels=["stream", "table"])
        sessions = GaugeMetricFamily("sketchboard_open_sessions",
                                     "Sessions held open: their last event + gap not yet behind the watermark"
                                     " (streams with sessions)", labels=["stream"])
        for name, s in status["streams"].items():
            for table, n in sorted((s.get("enrich_misses") or {}).items()):
                misses.add_metric([name, table], n)
            if s["duplicates_dropped"] is not None:
                duplicates.add_metric([name], s["duplicates_dropped"])
            if s["open_sessions"] is not None:
                sessions.add_metric([name], s["open_sessions"])
            events_in.add_metric([name], sum(p["log_end"] for p in s["partitions"].values()))
            aggregated.add_metric([name], s["events_aggregated"])
            dead.add_metric([name], s["events_dead_lettered"])
            for reason, n in sorted(s["dead_lettered_by_reason"].items()):
                by_reason.add_metric([name, reason], n)
        yield from (events_in, aggregated, dead, by_reason, duplicates, misses, sessions)
        yield from join_metrics(status["joins"])
        yield from pattern_metrics(status["patterns"])

    def _leader(self):
        leadership = self.ctx.leadership
        leading = GaugeMetricFamily("sketchboard_leader", "1 while this API replica holds the leader lease (runs"
                                    " the alert evaluator, notifier and lag sampler)", labels=["replica"])
        leading.add_metric([leadership.me], 1 if leadership.leading() else 0)
        epoch = GaugeMetricFamily("sketchboard_leader_epoch", "The leader lease's epoch: +1 at every change of holder")
        epoch.add_metric([], leadership.tracker.record.epoch if leadership.tracker.record else 0)
        yield from (leading, epoch)

    def _lag(self):
        report = self.ctx.lag.report()
        seconds = GaugeMetricFamily("sketchboard_lag_seconds", "Age of the oldest record not yet aggregated",
                                    labels=["stream", "partition"])
        sampled = GaugeMetricFamily("sketchboard_lag_sampled_events",
                                    "Lag in events at the newest lag sample", labels=["stream", "partition"])
        states = [s.value for s in LagStatus]
        part_status = StateSetMetricFamily("sketchboard_lag_status", "Lag status of a partition (Burrow's rules)",
                                           labels=["stream", "partition"])
        stream_status = StateSetMetricFamily("sketchboard_stream_lag_status", "Worst lag status of a stream",
                                             labels=["stream"])
        pipe_status = StateSetMetricFamily("sketchboard_pipeline_lag_status", "Worst lag status of the pipeline",
                                           labels=["pipeline"])
        code = GaugeMetricFamily("sketchboard_pipeline_lag_status_code",
                                 "Pipeline lag status as a number: 0 OK, 1 WARN, 2 STALL, 3 STOP, 4 REWIND, 5 ERR",
                                 labels=["pipeline"])
        for name, stream in report.streams.items():
            stream_status.add_metric([name], {v: stream.verdict.status.value == v for v in states})
            for p, part in stream.partitions.items():
                labels = [name, str(p)]
                if part.lag_seconds is not None:
                    seconds.add_metric(labels, part.lag_seconds)
                sampled.add_metric(labels, part.lag_events)
                part_status.add_metric(labels, {v: part.verdict.status.value == v for v in states})
        # Fan-out: every consumer of the log by pipeline label, the serving one included.
        consumer_events = GaugeMetricFamily("sketchboard_consumer_lag_events", "Lag in events at the newest lag"
                                            " sample, per consumer (pipeline)", labels=["pipeline", "stream", "partition"])
        consumer_seconds = GaugeMetricFamily("sketchboard_consumer_lag_seconds", "Age of the oldest record a consumer"
                                             " (pipeline) has not processed", labels=["pipeline", "stream", "partition"])
        others = [c.pipeline for c in self.ctx.lag.registry.consumers()] if self.ctx.lag.registry is not None else []
        for consumer in [report, *(self.ctx.lag.report(pipeline=n) for n in others if n != report.pipeline)]:
            if consumer is not report:
                pipe_status.add_metric([consumer.pipeline], {v: consumer.verdict.status.value == v for v in states})
                code.add_metric([consumer.pipeline], consumer.verdict.status.severity)
            for name, stream in consumer.streams.items():
                for p, part in stream.partitions.items():
                    labels = [consumer.pipeline, name, str(p)]
                    consumer_events.add_metric(labels, part.lag_events)
                    if part.lag_seconds is not None:
                        consumer_seconds.add_metric(labels, part.lag_seconds)
        pipe_status.add_metric([report.pipeline], {v: report.verdict.status.value == v for v in states})
        code.add_metric([report.pipeline], report.verdict.status.severity)
        yield from (seconds, sampled, part_status, stream_status, pipe_status, code, consumer_events, consumer_seconds)

    def _query(self):
        q = query_health(self.ctx.health, self.ctx.pipeline_name, self.ctx.now_ms()) if self.ctx.health else None
        running = GaugeMetricFamily("sketchboard_query_running", "1 while Spark reports the pipeline query running")
        running.add_metric([], 1 if q and q["running"] else 0)
        yield running
        store = self.ctx.health.store_errors(self.ctx.pipeline_name) if self.ctx.health else None
        if store is not None:
            failing = GaugeMetricFamily("sketchboard_pipeline_store_failing",
                                        "1 while the pipeline's store commits fail (it retries with back-off)")
            failing.add_metric([], 1 if store["failing"] else 0)
            errors = CounterMetricFamily("sketchboard_pipeline_store_errors",
                                         "Store commits of the pipeline that failed and were retried")
            errors.add_metric([], store["total"])
            yield from (failing, errors)
        if not q or q["batch_id"] is None:
            return
        duration = GaugeMetricFamily("sketchboard_batch_duration_seconds", "Duration of the newest micro-batch")
        duration.add_metric([], (q["batch_duration_ms"] or 0) / 1000)
        parts = GaugeMetricFamily("sketchboard_batch_duration_part_seconds",
                                  "Parts of the newest micro-batch's duration (Spark's durationMs)", labels=["part"])
        for part, ms in sorted((q["duration_ms"] or {}).items()):
            parts.add_metric([part], ms / 1000)
        rates = GaugeMetricFamily("sketchboard_query_rows_per_second", "Spark's input and processed rows per second",
                                  labels=["kind"])
        for kind in ("input", "processed"):
            value = q[f"{kind}_rows_per_second"]
            if value is not None:
                rates.add_metric([kind], value)
        batch = GaugeMetricFamily("sketchboard_query_last_batch_id", "Id of the newest micro-batch Spark reported")
        batch.add_metric([], q["batch_id"])
        yield from (duration, parts, rates, batch)

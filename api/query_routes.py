"""GET /api/v1/streams, /api/v1/metrics and /api/v1/query: what is defined, and series of it."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from api.context import ApiContext
from api.errors import ParamHTTPError, bad_request, errors, param_error
from api.responses import MetricsOut, StreamsOut
from catalog import format_duration_ms
from catalog.times import BadParam
from query import QueryError, answer_text, compute, parse_filters, resolve
from store.retention_clock import retention_now_ms
from store.rollup import RollupError


class ErrorBoundOut(BaseModel):
    kind: str = Field(description="'hll' (distinct), 'kll' (percentile) or 'bloom' (first_seen: true value in [lower, upper])")
    lower: float
    upper: float
    relative_error: float | None = Field(None, description="hll: relative standard error (1 sigma)")
    rank_error: float | None = Field(None, description="kll: normalized rank error (99 % confidence)")
    expected_undercount: float | None = Field(None, description="bloom: expected new keys hidden by false positives")


class PointOut(BaseModel):
    t: int = Field(description="window start, epoch ms; the window is [t, t + window)")
    value: float | None = Field(description="null where the stat is undefined for an empty window")
    count: int = Field(description="events in the window")
    final: bool = Field(description="the watermark has passed the window's end (else: provisional)")
    revision: int = Field(description="highest revision of the panes in the window (0: none;"
                          " >1: corrected after it was final, see /api/v1/corrections)")
    error: ErrorBoundOut | None = Field(None, description="bounds of a sketch estimate; null when exact")


class SeriesOut(BaseModel):
    stat: str = Field(description="the stat of these points (a websocket subscription may ask several)")
    group: dict[str, str]
    points: list[PointOut]


class QueryAnswer(BaseModel):
    metric: str
    stream: str
    stat: str = Field(description="the (first) stat asked")
    stats: list[str] = Field(description="every stat asked; each series names its own")
    unit: str
    start: int
    end: int
    step_ms: int
    window_ms: int
    watermark_ms: int | None
    series: list[SeriesOut]


def router(ctx: ApiContext) -> APIRouter:
    r = APIRouter(prefix="/api/v1", tags=["query"])

    # Both list what is served (api/served_catalog.py), as queries, alert rules and dashboards read
    # it: a configuration change waits for its switch (docs/reprocessing.md), so listing it would
    # offer a pane, dimension or metric the answers do not have yet. What waits is named beside.
    def served_and_pending() -> tuple:
        from api.served_catalog import pending_definitions

        served, pinned = ctx.served_with_pending()
        return served, pending_definitions(ctx.catalog, served, pinned)

    @r.get("/streams", summary="Streams as served (the configuration's, until a switch the stored definition of a"
           " changed one), with their log offsets and any definition waiting for a switch",
           response_model=None, responses={200: {"model": StreamsOut, "description": "the streams"}})
    def streams() -> dict:
        served, pending = served_and_pending()
        out = []
        for stream in served.streams.values():
            offsets = ctx.log.offsets(stream.name)
            out.append({
                **stream.model_dump(mode="json"),
                "dimensions": list(stream.dimensions),  # with the enriched ones (a dump leaves them out)
                "distinct": list(stream.distinct_fields),
                "partitions_offsets": {p: {"start": o.start, "end": o.end} for p, o in offsets.items()},
                "events_in_log": sum(o.end - o.start for o in offsets.values()),
                "definition_pending": pending.get(stream.name),
            })
        waiting = [{"name": name, "definition_pending": pending.get(stream.derived_from or name)}
                   for name, stream in ctx.catalog.streams.items() if name not in served.streams]
        return {"streams": out, "pending_streams": waiting}

    @r.get("/metrics", summary="Metrics as served and the stats each answers (a changed stream's as its served"
           " output is built, until a switch), with any definition waiting for a switch",
           response_model=None, responses={200: {"model": MetricsOut, "description": "the metrics"}})
    def metrics() -> dict:
        served, pending = served_and_pending()
        out = []
        for metric in served.metrics.values():
            stream = served.streams[metric.stream]
            out.append({
                **metric.model_dump(mode="json"),
                "stats": list(metric.stats()),
                "dimensions": list(stream.dimensions),
                "pane": format_duration_ms(stream.pane),
                "definition_pending": pending.get(metric.stream),
            })
        waiting = [{"name": name, "stream": metric.stream, "definition_pending": pending.get(metric.stream)}
                   for name, metric in ctx.catalog.metrics.items() if name not in served.metrics]
        return {"metrics": out, "pending_metrics": waiting}

    @r.get(
        "/query",
        response_model=QueryAnswer,
        responses=errors(400, 404, e404="unknown metric"),
        summary="A metric's series over a time range",
    )
    async def query(
        metric: str = Query(..., description="metric name (see /api/v1/metrics)"),
        stat: str = Query("count", description="count, rate, sum, avg, min, max, pNN (e.g. p99, p99.9), distinct,"
                          " first_seen"),
        start: str = Query("now-1h", alias="from", description="'now-1h', RFC 3339, epoch ms or s"),
        end: str = Query("now", alias="to"),
        step: str | None = Query(None, description="point spacing, a multiple of the pane (default: ~300 points);"
                                 " a duration such as '1m', at most 36500d"),
        window: str | None = Query(None, description="window length >= step (hopping/sliding); default: step;"
                                   " at most 36500d"),
        group_by: list[str] = Query([], description="dimensions to group by (repeat or comma-separate)"),
        filter: list[str] = Query([], description="dimension=value equality filters (repeatable)"),
        version: str | None = Query(None, description="answer from the stream's output built with this definition"
                                    " version (the whole sha256 or its first 8+ characters: GET /api/v1/reprocess"
                                    " lists them); default: the served output", max_length=64),
    ) -> Response:
        now = ctx.now_ms()
        # The served output is read by the definitions it was built with (api/served_catalog.py).
        # Retention is measured at the later of this clock and the newest batch's (store/retention_clock.py),
        # read in the same trip to a worker thread (one per request: this is the query path's every call).
        store, cache = ctx.store, ctx.point_cache
        if version is None:
            catalog, kept_at = await run_in_threadpool(_served_and_kept, ctx, now)
        else:
            store, catalog = await run_in_threadpool(versioned_output, ctx, metric, version)
            cache = None  # its points are keyed without the namespace
            kept_at = await run_in_threadpool(retention_now_ms, store, now)
        try:
            q = resolve(catalog, metric=metric, stats=[stat], start=start, end=end, step=step, window=window,
                        group_by=group_by, filters=parse_filters(filter), now_ms=now,
                        max_points=ctx.query_max_points, kept_at_ms=kept_at)
            lo, hi = q.range_at(now)
        except QueryError as exc:
            raise (HTTPException(404, str(exc)) if exc.not_found else bad_request(exc.param, str(exc))) from None
        except BadParam as exc:
            raise param_error(exc) from None
        watermark = store.watermarks().get(q.stream)
        try:
            series = await run_in_threadpool(compute, store, q, lo, hi, watermark_ms=watermark,
                                              max_points=ctx.query_max_points, cache=cache, now_ms=kept_at)
        except RollupError as exc:
            raise bad_request(None, str(exc)) from None
        # Built as plain JSON: validating a day of points through the response model cost more than
        # computing them; the model still documents the shape (tests check the two agree).
        return Response(answer_text(q, lo, hi, watermark, series), media_type="application/json")

    return r


def _served_and_kept(ctx: ApiContext, now_ms: int):
    """The served catalog and the retention clock of a query asked at now_ms."""
    return ctx.served_catalog(), retention_now_ms(ctx.store, now_ms)


def versioned_output(ctx: ApiContext, metric: str, version: str):
    """The store and catalog answering `?version=` (docs/reprocessing.md): the namespace whose
    stored definitions hold that version of the metric's stream (the root, a run's or a previous
    output's), and the catalog with that version's declaration of the stream. An unknown metric
    is left to resolve() to refuse; an unknown version is a 404 naming the versions there are."""
    from catalog.versions import pinned_catalog
    from store.namespace import ROOT

    found = ctx.catalog.metrics.get(metric)
    if found is None:
        return ctx.store, ctx.catalog
    if ctx.reprocess is None:
        raise ParamHTTPError(404, "version", "this API serves no versioned outputs (reprocessing is not wired)")
    stream = ctx.catalog.streams[found.stream]
    name = stream.derived_from or stream.name
    try:
        namespace, definition = ctx.reprocess.output(name, version)
    except KeyError as exc:
        raise ParamHTTPError(404, "version", exc.args[0]) from None
    store = ctx.store if namespace == ROOT else ctx.reprocess.output_store(namespace)
    return store, pinned_catalog(ctx.catalog, {name: definition})

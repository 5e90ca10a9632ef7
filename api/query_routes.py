"""GET /api/v1/streams, /api/v1/metrics and /api/v1/query: what is defined, and series of it."""

from __future__ import annotations

import math

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from api.context import ApiContext
from api.errors import bad_request, errors, param_error
from api.responses import MetricsOut, StreamsOut
from catalog.times import BadParam, default_step_ms, parse_duration_param, parse_range_ms
from catalog import format_duration_ms
from store.bloom import overlay_first_seen
from store.rollup import Point, RollupError, align_range
from store.series import query_series


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
    group: dict[str, str]
    points: list[PointOut]


class QueryAnswer(BaseModel):
    metric: str
    stream: str
    stat: str
    unit: str
    start: int
    end: int
    step_ms: int
    window_ms: int
    watermark_ms: int | None
    series: list[SeriesOut]


def _finite(x: float | None) -> float | None:
    return x if x is None or math.isfinite(x) else None  # JSON has no inf or NaN: null, as pydantic writes them


def point_out(p: Point) -> dict:
    """A PointOut as JSON."""
    error = None
    if p.error is not None:
        e = p.error
        error = {"kind": e.kind, "lower": _finite(e.lower), "upper": _finite(e.upper),
                 "relative_error": e.relative_error, "rank_error": e.rank_error,
                 "expected_undercount": e.expected_undercount}
    return {"t": p.t_ms, "value": _finite(p.value), "count": p.count, "final": p.final, "revision": p.revision,
            "error": error}


def _bad(message: str, param: str | None = None) -> HTTPException:
    return bad_request(param, message)


def _parse_filters(filters: list[str], dimensions: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for item in filters:
        name, sep, value = item.partition("=")
        if not sep:
            raise _bad(f"filter {item!r} must look like dimension=value", "filter")
        if name not in dimensions:
            raise _bad(f"unknown dimension {name!r} in filter; dimensions: {', '.join(dimensions) or 'none'}", "filter")
        out[name] = value
    return out


def router(ctx: ApiContext) -> APIRouter:
    r = APIRouter(prefix="/api/v1", tags=["query"])

    @r.get("/streams", summary="Streams defined in the configuration, with their log offsets",
           response_model=None, responses={200: {"model": StreamsOut, "description": "the streams"}})
    def streams() -> dict:
        out = []
        for stream in ctx.catalog.streams.values():
            offsets = ctx.log.offsets(stream.name)
            out.append({
                **stream.model_dump(mode="json"),
                "distinct": list(stream.distinct_fields),
                "partitions_offsets": {p: {"start": o.start, "end": o.end} for p, o in offsets.items()},
                "events_in_log": sum(o.end - o.start for o in offsets.values()),
            })
        return {"streams": out}

    @r.get("/metrics", summary="Metrics defined in the configuration and the stats each answers",
           response_model=None, responses={200: {"model": MetricsOut, "description": "the metrics"}})
    def metrics() -> dict:
        out = []
        for metric in ctx.catalog.metrics.values():
            stream = ctx.catalog.streams[metric.stream]
            out.append({
                **metric.model_dump(mode="json"),
                "stats": list(metric.stats()),
                "dimensions": list(stream.dimensions),
                "pane": format_duration_ms(stream.pane),
            })
        return {"metrics": out}

    @r.get(
        "/query",
        response_model=QueryAnswer,
        responses=errors(400, 404, e404="unknown metric"),
        summary="A metric's series over a time range",
    )
    async def query(
        metric: str = Query(..., description="metric name (see /api/v1/metrics)"),
        stat: str = Query("count", description="count, rate, sum, avg, min, max, pNN (e.g. p99, p99.9), distinct"),
        start: str = Query("now-1h", alias="from", description="'now-1h', RFC 3339, epoch ms or s"),
        end: str = Query("now", alias="to"),
        step: str | None = Query(None, description="point spacing, a multiple of the pane (default: ~300 points);"
                                 " a duration such as '1m', at most 36500d"),
        window: str | None = Query(None, description="window length >= step (hopping/sliding); default: step;"
                                   " at most 36500d"),
        group_by: list[str] = Query([], description="dimensions to group by (repeat or comma-separate)"),
        filter: list[str] = Query([], description="dimension=value equality filters (repeatable)"),
    ) -> JSONResponse:
        try:
            definition = ctx.catalog.metric(metric)
        except KeyError as exc:
            raise HTTPException(404, str(exc.args[0])) from None
        stream = ctx.catalog.streams[definition.stream]
        try:
            quantile = definition.check_stat(stat)
        except ValueError as exc:
            raise _bad(str(exc), "stat") from None
        now = ctx.now_ms()
        try:
            start_ms, end_ms = parse_range_ms(start, end, now)
            step_ms = parse_duration_param(step, "step") if step else default_step_ms(max(end_ms - start_ms, 1),
                                                                                       stream.pane)
            window_ms = parse_duration_param(window, "window") if window else step_ms
        except BadParam as exc:
            raise param_error(exc) from None
        groups = [g.strip() for item in group_by for g in item.split(",") if g.strip()]
        for g in groups:
            if g not in stream.dimensions:
                raise _bad(f"unknown dimension {g!r} in group_by; dimensions: {', '.join(stream.dimensions) or 'none'}",
                           "group_by")
        filters = _parse_filters(filter, stream.dimensions)
        first_seen = stat in ("first_seen", "first-seen")
        if first_seen and (groups or filters):
            raise _bad("first_seen is counted per stream, not per dimension: group_by and filter do not apply", "stat")
        watermark = ctx.store.watermarks().get(stream.name)

        try:
            lo, hi = align_range(start_ms, end_ms, step_ms)
        except RollupError as exc:
            raise _bad(str(exc)) from None
        if (hi - lo) // step_ms > ctx.query_max_points:
            raise _bad(f"{(hi - lo) // step_ms} points per series exceed the limit of {ctx.query_max_points};"
                       " use a larger step or a shorter range", "step")

        def compute():
            series = query_series(
                ctx.store, stream.name, stream.pane, stat="count" if first_seen else stat, quantile=quantile,
                value_field=definition.value, distinct_field=definition.distinct, start_ms=lo, end_ms=hi,
                step_ms=step_ms, window_ms=window_ms, group_by=groups, filters=filters, watermark_ms=watermark,
                max_points=ctx.query_max_points, cache=ctx.point_cache,
            )
            if first_seen:  # the window's panes give count/final/revision; the first_seen table the value
                rows = ctx.store.bloom_reader().first_seen_rows(stream.name, lo, hi + max(window_ms - step_ms, 0))
                series[0] = type(series[0])(group={}, points=overlay_first_seen(series[0].points, rows, window_ms))
            return series

        try:
            series = await run_in_threadpool(compute)
        except RollupError as exc:
            raise _bad(str(exc)) from None
        # Built as plain JSON: validating a day of points through the response model cost more than
        # computing them; the model still documents the shape (tests check the two agree).
        return JSONResponse({
            "metric": metric, "stream": stream.name, "stat": stat, "unit": definition.unit, "start": lo, "end": hi,
            "step_ms": step_ms, "window_ms": window_ms, "watermark_ms": watermark,
            "series": [{"group": s.group, "points": [point_out(p) for p in s.points]} for s in series],
        })

    return r

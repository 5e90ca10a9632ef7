"""A resolved query computed against the store, and its answer as JSON: the one function
and the one point schema that GET /api/v1/query, the websocket hub and the alert rules use.

The store read and the roll-up are store/series.py's (through the tier planner); first_seen
takes the count, final flag and revision of its windows from the panes and its value from
the first_seen table (store/bloom.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from catalog.model import FIRST_SEEN_STATS, RATIO_STATS
from query.model import Query
from store import PaneStore
from store.bloom import overlay_first_seen
from store.point_cache import PointCache
from store.point_text import json_text, point_text
from store.rollup import Point, Series, rollup
from store.series import query_series


@dataclass(frozen=True)
class StatSeries:
    """The points of one stat for one group, one per window start in the computed range."""

    stat: str
    group: dict[str, str]
    points: list[Point]


def compute(store: PaneStore, q: Query, lo: int, hi: int, *, watermark_ms: int | None, max_points: int,
            cache: PointCache | None = None, now_ms: int | None = None) -> list[StatSeries]:
    """One series per (stat, group) for the windows starting in [lo, hi) (multiples of the step);
    with now_ms, only rows retention still keeps at now_ms are read (store.planner)."""
    out = []
    for stat, quantile in zip(q.stats, q.quantiles):
        if stat in RATIO_STATS:
            out += [StatSeries(stat, s.group, s.points)
                    for s in ratio_series(store, q, lo, hi, watermark_ms=watermark_ms, max_points=max_points,
                                          now_ms=now_ms)]
            continue
        first_seen = stat in FIRST_SEEN_STATS
        series = query_series(
            store, q.stream, q.pane_ms, stat="count" if first_seen else stat, quantile=quantile,
            value_field=q.value_field, distinct_field=q.distinct_field, start_ms=lo, end_ms=hi, step_ms=q.step_ms,
            window_ms=q.window_ms, group_by=q.group_by, filters=dict(q.filters), watermark_ms=watermark_ms,
            max_points=max_points, cache=cache, now_ms=now_ms,
        )
        for s in series:
            points = s.points
            if first_seen:  # no group_by (resolve refuses it): one series, the stream's
                rows = store.bloom_reader().first_seen_rows(q.stream, lo, hi + max(q.window_ms - q.step_ms, 0))
                points = overlay_first_seen(points, rows, q.window_ms)
            out.append(StatSeries(stat, s.group, points))
    return out


def empty_points(q: Query, i: int, lo: int, hi: int, *, watermark_ms: int | None) -> list[Point]:
    """What compute() answers for stat q.stats[i] of a group with no rows in the windows starting in
    [lo, hi) (the group has rows elsewhere in the query's range): its points there, without a read."""
    stat, quantile = q.stats[i], q.quantiles[i]
    ratio = stat in RATIO_STATS
    points = rollup([], stat="sum" if ratio else "count" if stat in FIRST_SEEN_STATS else stat,
                    quantile=None if ratio else quantile, value_field=q.ratio_of if ratio else q.value_field,
                    distinct_field=q.distinct_field, start_ms=lo, end_ms=hi, step_ms=q.step_ms,
                    window_ms=q.window_ms, pane_ms=q.pane_ms, watermark_ms=watermark_ms,
                    max_points=(hi - lo) // q.step_ms + 1)[0].points
    if ratio:  # as ratio_series: no denominator, no value
        return [Point(d.t_ms, None, d.count, d.final, d.revision, None) for d in points]
    return points


def ratio_series(store: PaneStore, q: Query, lo: int, hi: int, *, watermark_ms: int | None,
                 max_points: int, now_ms: int | None = None) -> list[Series]:
    """Stat ratio: per window and group, sum(value) / sum(ratio_of) over the same panes (e.g. a
    click-through rate: clicked / searches); null where the denominator is 0. Final when both
    sums are; the revision is the higher of the two."""
    def sums(field: str) -> list[Series]:
        return query_series(store, q.stream, q.pane_ms, stat="sum", quantile=None, value_field=field,
                            distinct_field=None, start_ms=lo, end_ms=hi, step_ms=q.step_ms, window_ms=q.window_ms,
                            group_by=q.group_by, filters=dict(q.filters), watermark_ms=watermark_ms,
                            max_points=max_points, now_ms=now_ms)

    def key(s: Series) -> tuple:
        return tuple(sorted(s.group.items()))

    numerators = {key(s): {p.t_ms: p for p in s.points} for s in sums(q.value_field)}
    out = []
    for den in sums(q.ratio_of):
        num = numerators.get(key(den), {})
        points = []
        for d in den.points:
            n = num.get(d.t_ms)
            top = (n.value if n is not None else None) or 0.0
            value = top / d.value if d.value else None
            points.append(Point(d.t_ms, value, d.count, d.final and (n is None or n.final),
                                max(d.revision, n.revision if n is not None else 0), None))
        out.append(Series(den.group, points))
    return out


def _finite(x: float | None) -> float | None:
    return x if x is None or math.isfinite(x) else None  # JSON has no inf or NaN: null, as pydantic writes them


def point_json(p: Point) -> dict[str, Any]:
    """A point as the API shows it (api.query_routes.PointOut documents it)."""
    error = None
    if p.error is not None:
        e = p.error
        error = {"kind": e.kind, "lower": _finite(e.lower), "upper": _finite(e.upper),
                 "relative_error": e.relative_error, "rank_error": e.rank_error,
                 "expected_undercount": e.expected_undercount}
    return {"t": p.t_ms, "value": _finite(p.value), "count": p.count, "final": p.final, "revision": p.revision,
            "error": error}


def series_json(s: StatSeries) -> dict[str, Any]:
    return {"stat": s.stat, "group": s.group, "points": [point_json(p) for p in s.points]}


def answer_text(q: Query, lo: int, hi: int, watermark_ms: int | None, series: list[StatSeries]) -> str:
    """answer_json() as JSON text, the very bytes a JSONResponse renders of it (ensure_ascii off,
    no spaces), written point by point (store/point_text.py)."""
    head = json_text(answer_json(q, lo, hi, watermark_ms, []))  # ends with its last key, '"series":[]}'
    body = ",".join('{"stat":' + json_text(s.stat) + ',"group":' + json_text(s.group) + ',"points":['
                    + ",".join(map(point_text, s.points)) + "]}" for s in series)
    return head[:-2] + body + "]}"


def answer_json(q: Query, lo: int, hi: int, watermark_ms: int | None, series: list[StatSeries]) -> dict[str, Any]:
    """The body of GET /api/v1/query and of a websocket snapshot (api.query_routes.QueryAnswer)."""
    return {
        "metric": q.metric, "stream": q.stream, "stat": q.stats[0], "stats": list(q.stats), "unit": q.unit,
        "start": lo, "end": hi, "step_ms": q.step_ms, "window_ms": q.window_ms, "watermark_ms": watermark_ms,
        "series": [series_json(s) for s in series],
    }

"""The queries a dashboard's panels send when it opens on its own range: the views the service
computes ahead of their first query (query/warm.py), so that a cold 24 h view, a 1 h sliding
percentile included, reads kept final points instead of merging thousands of sketches.

Pure: a dashboard definition and the catalog in, resolved queries out (no store, no clock)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from catalog import Catalog
from catalog.durations import format_duration_ms
from dashboard.model import BAND, BAND_STATS, Dashboard, parse_dashboard
from query import Query, QueryError, resolve

# dashboard/static/util.js's NICE_STEPS and autoStep: the step a panel without one asks.
NICE_STEPS_MS = (10_000, 30_000, 60_000, 120_000, 300_000, 600_000, 900_000, 1_800_000, 3_600_000, 7_200_000,
                 21_600_000, 43_200_000, 86_400_000)
AUTO_POINTS = 120
# dashboard/static/heatmap.js's HEATMAP_STATS: what a heatmap panel asks (over all groups).
HEATMAP_STATS = ("p1", "p10", "p25", "p50", "p75", "p90", "p99", "count")


def auto_step_ms(span_ms: int, pane_ms: int, points: int = AUTO_POINTS) -> int:
    """The page's autoStep: about `points` points over the span, a whole number of panes."""
    want = max(span_ms / points, pane_ms or 1)
    for step in NICE_STEPS_MS:
        if step >= want and (not pane_ms or step % pane_ms == 0):
            return step
    unit = pane_ms or 1000
    return -(-int(want) // unit) * unit


def panel_queries(dashboard: Dashboard, catalog: Catalog, *, now_ms: int, max_points: int) -> list[Query]:
    """Each panel's query over the last `dashboard.range` as the page asks it (a band: its three
    percentiles; a heatmap: its quantiles and count, over all groups); a panel the catalog no
    longer answers (a metric dropped since it was saved) is left out."""
    out = []
    for panel in dashboard.panels:
        metric = catalog.metrics.get(panel.metric)
        if metric is None:
            continue
        pane_ms = catalog.streams[metric.stream].pane
        step_ms = panel.step or auto_step_ms(dashboard.range, pane_ms)
        # As the page's panelQuery (dashboard/static/panels.js) asks it.
        heatmap = panel.kind == "heatmap"
        stats = list(HEATMAP_STATS) if heatmap else list(BAND_STATS) if panel.stat == BAND else [panel.stat]
        try:
            out.append(resolve(catalog, metric=panel.metric, stats=stats, start=f"now-{format_duration_ms(dashboard.range)}",
                               end="now", step=format_duration_ms(step_ms),
                               window=None if panel.window is None else format_duration_ms(panel.window),
                               group_by=() if heatmap else panel.group_by, filters=panel.filters, now_ms=now_ms, max_points=max_points))
        except QueryError:  # e.g. too many points for this service's limit: its first query is refused too
            continue
    return out


def declared_queries(definitions: Iterable[Mapping[str, Any]], catalog: Catalog, *, now_ms: int,
                     max_points: int, checked_against: Catalog | None = None) -> list[Query]:
    """The panels' queries of these stored dashboard definitions, each distinct shape once, resolved
    against `catalog`. `checked_against`: the catalog the dashboards are checked against (None:
    `catalog`); the API's is the configured one while queries read the served one
    (api/served_catalog.py), so that one panel only the configured definition answers leaves that
    panel out until the switch, not its whole dashboard."""
    seen: dict[tuple, Query] = {}
    for data in definitions:
        try:
            dashboard = parse_dashboard(data, checked_against or catalog)
        except ValueError:  # saved against an older catalog: its panels are checked when it is opened
            continue
        for q in panel_queries(dashboard, catalog, now_ms=now_ms, max_points=max_points):
            seen.setdefault(q.shape_key(), q)
    return list(seen.values())

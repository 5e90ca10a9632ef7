"""One query path: the series of a stat over windows, read from the coarsest stored rows
that can answer it (store/planner.py) and rolled up (store/rollup.py). REST queries, the
websocket hub and alert rules all come through here, so they read the same numbers."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from store.base import PaneStore
from store.panes import Pane
from store.planner import plan_read
from store.rollup import DEFAULT_MAX_POINTS, Series, rollup, window_points


_EXACT_STATS = ("count", "rate", "sum", "avg", "min", "max")


def read_rows(store: PaneStore, stream: str, pane_ms: int, *, start_ms: int, end_ms: int, step_ms: int,
              window_ms: int, needed: Sequence[str] = (), value_field: str | None = None,
              distinct_field: str | None = None, sketches: bool = False,
              max_points: int = DEFAULT_MAX_POINTS) -> list[Pane]:
    """The stored rows (panes or tier rows) that windows starting in [start_ms, end_ms) every
    step_ms need, grouped or filtered by the dimensions `needed`."""
    rows: list[Pane] = []
    for seg, proj, _ in _plan(store, stream, pane_ms, start_ms, end_ms, step_ms, window_ms, needed, max_points):
        rows += store.read_tier(stream, seg.granule_ms, proj, seg.start_ms, seg.end_ms, value_field=value_field,
                                distinct_field=distinct_field, with_sketches=sketches, pane_ms=pane_ms)
    return rows


def _plan(store, stream, pane_ms, start_ms, end_ms, step_ms, window_ms, needed, max_points):
    """(segment, projection, bucket) for each segment to read; nothing for a query rollup refuses."""
    if step_ms <= 0 or window_ms <= 0 or end_ms <= start_ms:
        return []
    n_points = len(window_points(start_ms, end_ms, step_ms))
    if n_points > max_points:  # rollup refuses the query, with its reason
        return []
    span_end = start_ms + (n_points - 1) * step_ms + window_ms
    plan = plan_read(store.tier_layout(stream), pane_ms, start_ms, span_end, step_ms, window_ms, n_points, needed)
    # One window: every row lands in it, whatever bucket; else rollup's buckets of gcd(step, window).
    bucket = span_end - start_ms if n_points == 1 else math.gcd(step_ms, window_ms)
    return [(seg, plan.proj, bucket) for seg in plan.segments]


def query_series(
    store: PaneStore,
    stream: str,
    pane_ms: int,
    *,
    stat: str,
    quantile: float | None,
    value_field: str | None,
    distinct_field: str | None,
    start_ms: int,
    end_ms: int,
    step_ms: int,
    window_ms: int | None = None,
    group_by: Sequence[str] = (),
    filters: Mapping[str, str] | None = None,
    watermark_ms: int | None = None,
    max_points: int = DEFAULT_MAX_POINTS,
) -> list[Series]:
    """rollup()'s series of `stat` for windows starting in [start_ms, end_ms) every step_ms."""
    window_ms = step_ms if window_ms is None else window_ms
    filters = dict(filters or {})
    needed = (*group_by, *filters)
    if stat in _EXACT_STATS:
        # Exact stats are summed by the store per bucket and group: few rows reach Python.
        rows: list[Pane] = []
        for seg, proj, bucket in _plan(store, stream, pane_ms, start_ms, end_ms, step_ms, window_ms, needed,
                                       max_points):
            rows += store.aggregate_tier(stream, seg.granule_ms, proj, seg.start_ms, seg.end_ms, origin_ms=start_ms,
                                         bucket_ms=bucket, group_by=group_by, filters=filters,
                                         value_field=value_field if stat not in ("count", "rate") else None,
                                         pane_ms=pane_ms)
    else:
        rows = []
        for seg, proj, _ in _plan(store, stream, pane_ms, start_ms, end_ms, step_ms, window_ms, needed, max_points):
            rows += store.read_tier(stream, seg.granule_ms, proj, seg.start_ms, seg.end_ms, value_field=value_field,
                                    distinct_field=distinct_field, with_sketches=True, pane_ms=pane_ms,
                                    with_stats=False)
    return rollup(rows, stat=stat, quantile=quantile, value_field=value_field, distinct_field=distinct_field,
                  start_ms=start_ms, end_ms=end_ms, step_ms=step_ms, window_ms=window_ms, pane_ms=pane_ms,
                  group_by=group_by, filters=filters, watermark_ms=watermark_ms, max_points=max_points)


__all__ = ["query_series", "read_rows"]

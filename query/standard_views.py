"""The standard views: the shapes most long-range queries of a metric take, computed ahead of
their first query like the dashboards' panels (query/warm.py, api/point_warmer.py).

A query no process has computed merges every sketch of its range: a day of 1-minute p99s was
100-115 ms on its first run (1 441 KLL sorted views and the faults of their memory), a 1 h
sliding window 160-180 ms (issue 27's bar is 50). Its final points are then kept in the store
and every later query, of any process, only loads them; but the first one of a shape nobody
declared paid it. These are the shapes such a first query most likely has: for every metric
with a sketch, each coarser tier's granule as the step and window (tumbling: a 1-minute step
over a day reads one 1-minute row per window), and a 1 h window sliding by the finest of those
granules, over the last day of 1-minute windows (WARM_POINTS of each granule, within what the
tier keeps); percentiles p50, p95 and p99, distinct counts and the count (its chunks of final
windows: store/series.py); the total only (a
group-by's first query reads one row per group and window too, but group-bys multiply the
views). A step that is not a granule (a dashboard's automatic 15 minutes over 24 h) is not one
of them: a dashboard that shows it declares it (dashboard/views.py).

Warming is incremental: the first run (and one every `full_every_ms`, which also catches
windows a straggler revised long after) covers each view's whole range; the runs between only
the windows that became final since the run before (from the stream's watermark then, less a
window and a granule), so a run over a day of unchanged points does not sum their fingerprints
again every few seconds. Each view ends with its stream's last final window (only final points
are kept), and a stream without a watermark has none. Pure but for its own record of the last
run: the catalog and the instants come in, resolved queries go out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from catalog import Catalog
from catalog.durations import format_duration_ms
from query.model import Query, QueryError, resolve
from store.tiers import layout_for

# The dashboard's band (dashboard/model.py BAND_STATS): each quantile more is a day of 1-minute
# points more per metric kept (with every shipped stream live the table held ~825 000 points
# with p90 too).
STANDARD_QUANTILES = ("p50", "p95", "p99")
SLIDING_WINDOW_MS = 3_600_000
WARM_POINTS = 1_440  # a day of 1-minute windows; 60 days of 1-hour ones
FULL_EVERY_MS = 3_600_000


def standard_queries(catalog: Catalog, *, now_ms: int, max_points: int, since_ms: Mapping[str, int] | None = None,
                     watermarks: Mapping[str, int] | None = None) -> list[Query]:
    """The standard views of every metric of `catalog` at `now_ms`. since_ms: per stream, the
    watermark a run before warmed up to (its views then start a window and a granule before it);
    a stream not in it gets its views' whole ranges. watermarks: the streams' now; a view then
    ends with its last final window (a provisional point is not kept: computing the windows past
    the watermark was most of a live stream's run), and a stream without one has no view (no
    window of it is final). None: every view to now_ms."""
    since_ms = since_ms or {}
    out = []
    for name, metric in sorted(catalog.metrics.items()):
        stats = [*(STANDARD_QUANTILES if metric.value else ()), *(("distinct",) if metric.distinct else ())]
        if not stats:
            continue
        # Its count too: exact, but a new process's first count of a day sums 1 440 buckets (~40 ms
        # on a slow spell) where the chunks kept of it are 24 rows.
        stats.append("count")
        if watermarks is not None and metric.stream not in watermarks:
            continue
        layout = layout_for(catalog.streams[metric.stream])
        coarser = [(every, keep) for every, keep in layout.granules if every > layout.pane_ms]
        for i, (every, keep) in enumerate(coarser):
            windows = [every]
            if i == 0 and SLIDING_WINDOW_MS > every and SLIDING_WINDOW_MS % every == 0:
                windows.append(SLIDING_WINDOW_MS)
            for window in windows:
                # Two granules inside the keep: its horizon moves on while the run goes.
                span = min(WARM_POINTS * every, keep - window - 2 * every)
                if span < every:
                    continue
                first = now_ms - span
                end = now_ms
                if watermarks is not None:  # past the last final window's start, by less than a granule
                    end = min(end, watermarks[metric.stream] - window + every)
                if end - first < 2 * every:
                    continue  # nothing final in the range (a stream far behind: its hours' run covers it)
                start = first
                if metric.stream in since_ms:
                    # At least two windows: a lone one may be read from coarser rows than the same window
                    # in a longer query (store/series.py _plan), and kept under another fingerprint. A
                    # watermark ahead of now_ms (a producer's clock ahead) leaves the last two.
                    start = max(first, min(since_ms[metric.stream] - window - every, end - 2 * every))
                try:
                    out.append(resolve(catalog, metric=name, stats=stats, start=start, end=end, step=format_duration_ms(every),
                                       window=format_duration_ms(window), now_ms=now_ms, max_points=max_points))
                except QueryError:  # e.g. the tier keeps less than a window: its queries are refused too
                    continue
    return out


@dataclass
class StandardRun:
    """One run's views, and what a successful run records for the next (`done`)."""

    queries: list[Query]
    now_ms: int
    watermarks: Mapping[str, int]
    full: bool


class StandardViews:
    """The standard views of the served catalog, run after run: whole ranges at the first run and
    every `full_every_ms`, the newly final windows between (module docstring)."""

    def __init__(self, catalog: Callable[[], Catalog], *, max_points: int, full_every_ms: int = FULL_EVERY_MS):
        self.catalog = catalog
        self.max_points = max_points
        self.full_every_ms = full_every_ms
        self._since: dict[str, int] = {}
        self._full_at_ms: int | None = None

    def plan(self, now_ms: int, watermarks: Mapping[str, int]) -> StandardRun:
        full = self._full_at_ms is None or not 0 <= now_ms - self._full_at_ms < self.full_every_ms
        queries = standard_queries(self.catalog(), now_ms=now_ms, max_points=self.max_points,
                                   since_ms=None if full else self._since, watermarks=watermarks)
        return StandardRun(queries, now_ms, dict(watermarks), full)

    def done(self, run: StandardRun) -> None:
        """`run` was warmed: the next run starts from its watermarks."""
        if run.full:
            self._full_at_ms = run.now_ms
            self._since = {}
        for stream, watermark in run.watermarks.items():
            # A watermark that went back (a reprocessed stream switched in) restarts from there.
            self._since[stream] = watermark

    def reset(self) -> None:
        """Whole ranges at the next run (the kept points were cleared: store/switch.py)."""
        self._full_at_ms = None
        self._since = {}

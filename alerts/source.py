"""`AlertData` over the real parts: a metric's window computed by query.compute (as
/api/v1/query computes its points), the lag monitor's report, the dead-letter table. The
only I/O the evaluator reaches."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from alerts.outcome import PatternMatch, StreamLagView, WindowValue
from catalog import Catalog, format_duration_ms
from query import Query, compute, over, resolve_target
from query.model import format_time_ms
from store import PaneStore
from store.planner import finest_kept_granule, kept_from_ms, plan_read
from store.retention_clock import retention_now_ms
from store.rollup import DEFAULT_MAX_POINTS
from store.tiers import TierLayout, layout_for


class StoreAlertData:
    def __init__(self, catalog: Catalog, store: PaneStore, lag_monitor=None, *,
                 served: Callable[[Catalog], Catalog] | None = None):
        self.catalog = catalog
        # The catalog the store's output was built with, from the configured one (api/served_catalog.py):
        # a window is read as the panes there were computed; None: `catalog`.
        self.served = served
        self.store = store
        self.lag_monitor = lag_monitor  # lag.report.LagMonitor, or None where lag is not sampled

    def watermark(self, stream: str) -> int | None:
        return self.store.watermarks().get(stream)

    def window_values(self, metric: str, stat: str, start_ms: int, end_ms: int,
                      group_by: Sequence[str], filters: Mapping[str, str], *, now_ms: int) -> list[WindowValue]:
        catalog = self.catalog if self.served is None else self.served(self.catalog)
        target = resolve_target(catalog, metric, [stat], group_by, filters)
        # One point whose window is [start, end): step one pane (the start is pane-aligned), window the
        # span. The caller chose the window by the watermark already: no final flags needed.
        q = over(target, step_ms=target.pane_ms, window_ms=end_ms - start_ms)
        # Only rows retention keeps are read, as REST reads them (the same plan at the same clock:
        # the later of now_ms and the newest batch's, store/retention_clock.py).
        kept_at = retention_now_ms(self.store, now_ms)
        check_window_kept(layout_for(catalog.streams[target.stream]), q, start_ms, end_ms, kept_at)
        series = compute(self.store, q, start_ms, start_ms + target.pane_ms, watermark_ms=None,
                         max_points=DEFAULT_MAX_POINTS, now_ms=kept_at)
        return [WindowValue(s.group, s.points[0].value, s.points[0].revision)
                for s in series if not group_by or s.points[0].count > 0]

    def last_seen(self, stream: str, start_ms: int, end_ms: int, group_by: Sequence[str],
                  filters: Mapping[str, str]) -> dict[tuple[str, ...], int]:
        newest: dict[tuple[str, ...], int] = {}
        for dims, end in self.store.newest_pane_ends(stream, start_ms, end_ms):  # one row per dims combination
            if any(dims.get(k, "") != v for k, v in filters.items()):
                continue
            group = tuple(dims.get(k, "") for k in group_by)
            newest[group] = max(newest.get(group, end), end)
        return newest

    def lag(self) -> dict[str, StreamLagView] | None:
        if self.lag_monitor is None:
            return None
        report = self.lag_monitor.report()
        return {name: StreamLagView(s.verdict.status.value, s.verdict.reason, s.lag_seconds)
                for name, s in report.streams.items()}

    def dead_letter_counts(self, start_ms: int, end_ms: int) -> dict[str, int]:
        return self.store.dead_letter_counts(start_ms, end_ms)

    def pattern_matches(self, pattern: str, after_id: int, limit: int) -> list[PatternMatch]:
        return [PatternMatch(m.id, m.key, m.decided_at_ms, m.events, m.measures, m.late, m.retracts, m.dims)
                for m in self.store.pattern_matches(pattern, after_id=after_id, limit=limit)]

    def newest_match_id(self, pattern: str) -> int | None:
        return self.store.pattern_newest_match_id(pattern)

    def corrections_after(self, stream: str, start_ms: int, end_ms: int, after_ms: int,
                          dims: Mapping[str, str] | None = None) -> int:
        return self.store.count_corrections(stream, start_ms, end_ms, after_ms, dims or {})


class WindowNotKept(ValueError):
    """A rule's window needs rows retention has dropped: the rule shows Error with this reason."""


def check_window_kept(layout: TierLayout, q: Query, start_ms: int, end_ms: int, now_ms: int) -> None:
    """WindowNotKept unless the rows retention keeps at now_ms answer the window [start_ms, end_ms)
    exactly: past a finer tier's keep only coarser rows are left, and a window they do not fit
    would sum what is left (0, or part of the events) as its value; older than every tier's keep
    nothing is left at all (docs/event-time.md, "Tiers and retention"). A REST query refuses
    such windows (query.model.check_kept) or answers them empty: a rule must not read either as
    a value."""
    needed = (*q.group_by, *(name for name, _ in q.filters))
    gone = min(kept_from_ms(layout, g, now_ms) for g in layout.granules_ms())
    span = f"{format_time_ms(start_ms)} to {format_time_ms(end_ms)}"
    if start_ms < gone:
        raise WindowNotKept(f"the window {span} starts before {format_time_ms(gone)}, older than the stream keeps"
                            " any rows (retention has dropped them)")
    missing = plan_read(layout, q.pane_ms, start_ms, end_ms, q.step_ms, q.window_ms, 1, needed, now_ms).missing
    if missing:
        kept = finest_kept_granule(layout, q.pane_ms, start_ms, needed, now_ms)
        raise WindowNotKept(f"the window {span} needs rows retention has dropped: before"
                            f" {format_time_ms(max(hi for _, hi in missing))} the stream keeps only"
                            f" {format_duration_ms(kept)} rows, and the window is not made of whole ones")

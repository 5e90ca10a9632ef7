"""A query resolved against the catalog: which metric, stats, groups and filters, over which
windows. Built once from the parameters of GET /api/v1/query, of a websocket subscription or
of an alert rule, with the same checks and the same reasons for all of them. Pure: no I/O;
`now_ms` is passed in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from catalog import Catalog, MetricDef
from catalog.model import FIRST_SEEN_STATS
from catalog.times import BadParam, default_step_ms, is_relative, parse_duration_param, parse_instant_ms, parse_range_ms
from ingest.events import unstorable
from catalog.durations import format_duration_ms
from store.planner import finest_kept_granule, plan_read
from store.rollup import align_range
from store.tiers import TierLayout, layout_for

MAX_STATS = 8


class QueryError(ValueError):
    """A query that cannot be answered as asked: `param` names the parameter at fault, the
    message says why. `not_found`: the metric does not exist (REST answers 404)."""

    def __init__(self, param: str | None, reason: str, *, not_found: bool = False):
        super().__init__(reason)
        self.param = param
        self.reason = reason
        self.not_found = not_found


@dataclass(frozen=True)
class Target:
    """What a query reads, without the time: the metric's stats, groups and filters, checked."""

    metric: str
    stream: str
    stats: tuple[str, ...]
    quantiles: tuple[float | None, ...]
    unit: str
    value_field: str | None
    distinct_field: str | None
    pane_ms: int
    group_by: tuple[str, ...]
    filters: tuple[tuple[str, str], ...]  # sorted (dimension, value) pairs
    ratio_of: str | None = None  # stat ratio: the value field summed as the denominator


@dataclass(frozen=True)
class Query(Target):
    """A resolved query: its target, and windows of window_ms every step_ms over the range
    from_text..to_text (re-read at every instant where relative: the range slides with time)."""

    from_text: str = "now-1h"
    to_text: str = "now"
    relative: bool = True
    step_ms: int = 0
    window_ms: int = 0

    @property
    def needs_sketches(self) -> bool:
        return any(q is not None for q in self.quantiles) or "distinct" in self.stats

    def range_at(self, now_ms: int) -> tuple[int, int]:
        """The aligned [start, end) of the query's window starts at this instant."""
        start = parse_instant_ms(self.from_text, now_ms, "from")
        end = parse_instant_ms(self.to_text, now_ms, "to")
        return align_range(start, end, self.step_ms)

    def shape_key(self) -> tuple:
        """Two queries with the same key answer the same points: computed once."""
        return (self.metric, self.stats, self.from_text, self.to_text, self.step_ms, self.window_ms,
                self.group_by, self.filters)


def split_list(value: Iterable[str] | str) -> list[str]:
    """Repeated or comma-separated parameter values: ['a,b', 'c'] -> ['a', 'b', 'c']."""
    items = [value] if isinstance(value, str) else value
    return [part.strip() for item in items for part in item.split(",") if part.strip()]


# Where a comma-separated filter list starts its next item: a dimension's name and `=`. A comma
# followed by anything else belongs to the value (`region=eu,west` is one filter).
_NEXT_FILTER = re.compile(r",(?=\s*[A-Za-z_][A-Za-z0-9_]{0,62}=)")


def parse_filters(items: Iterable[str] | str, given: Mapping[str, str] | None = None) -> dict[str, str]:
    """'dimension=value' items (repeated, or comma-separated) -> {dimension: value}, added to
    `given` (a websocket query's `filters` object). The value is everything after the first '='
    as written, commas and spaces included (labels may hold them); a dimension named twice with
    two values is refused (filters are ANDed equalities: the answer would be empty, or one of
    them silently dropped)."""
    out: dict[str, str] = dict(given or {})
    for raw in [items] if isinstance(items, str) else items:
        for item in _NEXT_FILTER.split(raw):
            if not item.strip():
                continue
            name, sep, value = item.partition("=")
            name = name.strip()
            if not sep or not name:
                raise QueryError("filter", f"filter {item!r} must look like dimension=value")
            if name in out and out[name] != value:
                raise QueryError("filter", f"filter names {name!r} twice ({out[name]!r} and {value!r}); one value"
                                 " per dimension (filters must all hold)")
            out[name] = value
    return out


def check_stat(metric: MetricDef, stat: str) -> float | None:
    """The quantile of a pNN stat (else None), or QueryError: the one check of a stat's name."""
    try:
        return metric.check_stat(stat)
    except ValueError as exc:
        raise QueryError("stat", str(exc)) from None


def resolve_target(catalog: Catalog, metric: str, stats: Sequence[str], group_by: Iterable[str] | str = (),
                   filters: Mapping[str, str] | None = None) -> Target:
    """Check the metric, its stats, the group-by dimensions and the filters; QueryError otherwise."""
    try:
        definition = catalog.metric(metric)
    except KeyError as exc:
        raise QueryError("metric", str(exc.args[0]), not_found=True) from None
    stream = catalog.streams[definition.stream]
    stats = list(dict.fromkeys(stats)) or ["count"]
    if len(stats) > MAX_STATS:
        raise QueryError("stats", f"{len(stats)} stats exceed the limit of {MAX_STATS}")
    quantiles = tuple(check_stat(definition, stat) for stat in stats)
    groups = split_list(group_by)
    filters = dict(filters or {})
    dimensions = ", ".join(stream.dimensions) or "none"
    for g in groups:
        if g not in stream.dimensions:
            raise QueryError("group_by", f"unknown dimension {g!r} in group_by; dimensions: {dimensions}")
    for name, value in filters.items():
        if name not in stream.dimensions:
            raise QueryError("filter", f"unknown dimension {name!r} in filter; dimensions: {dimensions}")
        # Refused at ingest, so it matches nothing; the stores could not even bind it.
        if problem := unstorable(value):
            raise QueryError("filter", f"filter {name}={value!r}: {problem}")
    if any(s in FIRST_SEEN_STATS for s in stats) and (groups or filters):
        raise QueryError("stat", "first_seen is counted per stream, not per dimension: group_by and filter do not apply")
    return Target(
        metric=metric, stream=stream.name, stats=tuple(stats), quantiles=quantiles, unit=definition.unit,
        value_field=definition.value, distinct_field=definition.distinct, pane_ms=stream.pane,
        group_by=tuple(groups), filters=tuple(sorted(filters.items())), ratio_of=definition.ratio_of,
    )


def over(target: Target, *, step_ms: int, window_ms: int, from_text: str = "", to_text: str = "",
         relative: bool = False, step_given: bool = True) -> Query:
    """The target over windows of window_ms every step_ms; QueryError unless both fit the pane.
    step_given: False where step_ms is the default step (messages say so: the user gave none)."""
    pane = target.pane_ms
    if step_ms <= 0 or step_ms % pane:
        raise QueryError("step", f"step must be a positive multiple of the pane ({pane} ms), got {step_ms} ms")
    if window_ms % pane:
        raise QueryError("window", f"window must be a multiple of the pane ({pane} ms), got {window_ms} ms")
    if window_ms < step_ms:
        step_text = (f"the step ({step_ms} ms)" if step_given else
                     f"the default step for this range ({format_duration_ms(step_ms)}, {step_ms} ms; pass a step)")
        raise QueryError("window", f"window must be at least {step_text}, got {window_ms} ms")
    return Query(**vars(target), from_text=from_text, to_text=to_text, relative=relative, step_ms=step_ms,
                 window_ms=window_ms)


def resolve(catalog: Catalog, *, metric: str, stats: Sequence[str], start: str | int = "now-1h",
            end: str | int = "now", step: str | None = None, window: str | None = None,
            group_by: Iterable[str] | str = (), filters: Mapping[str, str] | None = None, now_ms: int,
            max_points: int, kept_at_ms: int | None = None) -> Query:
    """The query that GET /api/v1/query's parameters (or a subscription's) ask; QueryError otherwise.
    kept_at_ms: the clock retention is measured against (store.retention_clock; default now_ms), the
    one its rows are then read at."""
    kept_at = now_ms if kept_at_ms is None else kept_at_ms
    target = resolve_target(catalog, metric, stats, group_by, filters)
    from_text, to_text = str(start), str(end)
    layout = layout_for(catalog.streams[target.stream])
    needed = (*target.group_by, *(name for name, _ in target.filters))
    try:
        start_ms, end_ms = parse_range_ms(from_text, to_text, now_ms)
        step_ms = parse_duration_param(step, "step") if step else kept_default_step(
            layout, target.pane_ms, start_ms, end_ms, needed, kept_at)
        window_ms = parse_duration_param(window, "window") if window else step_ms
    except BadParam as exc:
        raise QueryError(exc.param, str(exc)) from None
    q = over(target, step_ms=step_ms, window_ms=window_ms, from_text=from_text, to_text=to_text,
             relative=is_relative(from_text) or is_relative(to_text), step_given=bool(step))
    lo, hi = align_range(start_ms, end_ms, step_ms)
    if (hi - lo) // step_ms > max_points:
        raise QueryError("step", f"{(hi - lo) // step_ms} points per series exceed the limit of {max_points};"
                         " use a larger step or a shorter range")
    check_kept(layout, q, lo, hi, needed, kept_at)
    return q


def kept_default_step(layout: TierLayout, pane_ms: int, start_ms: int, end_ms: int, needed: Sequence[str],
                      now_ms: int) -> int:
    """The default step for [start_ms, end_ms): a nice step giving about TARGET_POINTS points, never
    finer than the finest granule retention keeps over the whole range (from the aligned start:
    flooring the start to a coarser step may reach back past a granule's horizon)."""
    floor_ms = finest_kept_granule(layout, pane_ms, start_ms, needed, now_ms)
    while True:
        step_ms = default_step_ms(max(end_ms - start_ms, 1), pane_ms, floor_ms)
        lo, _ = align_range(start_ms, end_ms, step_ms)
        coarser = finest_kept_granule(layout, pane_ms, lo, needed, now_ms)
        if coarser <= floor_ms:
            return step_ms
        floor_ms = coarser


def check_kept(layout: TierLayout, q: Query, lo: int, hi: int, needed: Sequence[str], now_ms: int) -> None:
    """QueryError unless the granules retention still keeps over the windows can answer each of
    their buckets exactly (store.planner.plan_read's `missing`): past a finer tier's keep its rows
    are gone, and summing what is left would answer 0, marked final (docs/event-time.md, "Tiers
    and retention"). Names the smallest step that can answer the range."""
    n_points = len(range(lo, hi, q.step_ms))
    span_end = lo + (n_points - 1) * q.step_ms + q.window_ms
    missing = plan_read(layout, q.pane_ms, lo, span_end, q.step_ms, q.window_ms, n_points, needed, now_ms).missing
    # A range that starts at the finer rows' horizon ("last 8 days" on a stream kept 8 days) has its
    # start floored to the step, a little before it: that sliver of the first bucket is the edge of
    # retention, answered from what is kept there as at any retention edge, not a reason to refuse.
    missing = [(a, b) for a, b in missing if not (a <= lo and b - lo < q.step_ms)]
    if not missing:
        return
    smallest = finest_kept_granule(layout, q.pane_ms, lo, needed, now_ms)
    gone_until = format_time_ms(max(end for _, end in missing))
    raise QueryError("step", f"windows of step {format_duration_ms(q.step_ms)} and window"
                     f" {format_duration_ms(q.window_ms)} need rows that retention has dropped (the data before"
                     f" {gone_until} is kept only at {format_duration_ms(smallest)} granularity); the smallest step"
                     f" that can answer this range is {format_duration_ms(smallest)} (with a window that is a"
                     " multiple of it)")


def format_time_ms(ms: int) -> str:
    """An instant for a message: RFC 3339, UTC."""
    from datetime import datetime, timezone
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")

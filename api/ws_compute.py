"""Points of a subscription, computed by the same query.compute as GET /api/v1/query,
optionally restricted to a few windows; and which windows a changed pane or an advanced
watermark touches. Pure except for the one store read."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from query import Query, answer_json, compute, series_json
from query.compute import empty_points, point_json
from store import PaneStore
from store.point_cache import PointCache
from store.retention_clock import retention_now_ms


def compute_series(store: PaneStore, rq: Query, lo: int, hi: int, watermark_ms: int | None,
                   max_points: int, cache: PointCache | None = None, *, kept_at_ms: int) -> list[dict[str, Any]]:
    """One series per (stat, group) over the windows starting in [lo, hi) (lo, hi multiples of step),
    reading only rows retention keeps at kept_at_ms (store.retention_clock), as REST and the snapshot
    do (store.planner): a granule read past its keep answered 0, marked final, where REST reads a
    coarser one."""
    return [series_json(s) for s in compute(store, rq, lo, hi, watermark_ms=watermark_ms, max_points=max_points,
                                            cache=cache, now_ms=kept_at_ms)]


def snapshot_result(store: PaneStore, rq: Query, now_ms: int, watermark_ms: int | None,
                    max_points: int, cache: PointCache | None = None) -> dict[str, Any]:
    """The body of GET /api/v1/query for this subscription."""
    lo, hi = rq.range_at(now_ms)
    return answer_json(rq, lo, hi, watermark_ms,
                       compute(store, rq, lo, hi, watermark_ms=watermark_ms, max_points=max_points, cache=cache,
                               now_ms=retention_now_ms(store, now_ms)))


def windows_containing(pane_start_ms: int, rq: Query, lo: int, hi: int) -> range:
    """Starts t (multiples of step in [lo, hi)) of the windows [t, t + window) holding the pane start."""
    first = pane_start_ms - rq.window_ms + 1
    first += (-first) % rq.step_ms
    return range(max(first, lo), min(pane_start_ms + 1, hi), rq.step_ms)


def windows_finalized(old_wm: int | None, new_wm: int, rq: Query, lo: int, hi: int) -> range:
    """Starts of the windows whose end passed from after old_wm to at-or-before new_wm."""
    last = new_wm - rq.window_ms  # t + window <= new_wm
    last -= last % rq.step_ms
    if old_wm is None:
        first = lo
    else:
        first = old_wm - rq.window_ms + 1  # t + window > old_wm
        first += (-first) % rq.step_ms
    return range(max(first, lo), min(last + 1, hi), rq.step_ms)


ALL_GROUPS = None  # in an affected map: every group of that window changed


def affected_windows(
    rq: Query,
    changed: Iterable[tuple[int, Mapping[str, str]]],
    watermark_move: tuple[int | None, int] | None,
    lo: int,
    hi: int,
) -> dict[int, set[tuple[str, ...]] | None]:
    """window start -> the groups whose point there changed (ALL_GROUPS: every group)."""
    out: dict[int, set[tuple[str, ...]] | None] = {}
    filters = rq.filters
    for start_ms, dims in changed:
        if any(dims.get(name, "") != value for name, value in filters):
            continue
        group = tuple(dims.get(g, "") for g in rq.group_by)
        for t in windows_containing(start_ms, rq, lo, hi):
            groups = out.get(t, set())
            if groups is not ALL_GROUPS:
                groups.add(group)
                out[t] = groups
    if watermark_move is not None:
        for t in windows_finalized(*watermark_move, rq, lo, hi):
            out[t] = ALL_GROUPS
    return out


def runs(times: Iterable[int], step_ms: int, max_gap_points: int = 8) -> list[tuple[int, int]]:
    """Sorted window starts as [lo, hi) spans, splitting where more than max_gap_points are skipped."""
    spans: list[tuple[int, int]] = []
    for t in sorted(times):
        if spans and t - spans[-1][1] <= max_gap_points * step_ms:
            spans[-1] = (spans[-1][0], t + step_ms)
        else:
            spans.append((t, t + step_ms))
    return spans


def changed_points(store: PaneStore, rq: Query, affected: dict[int, set | None], watermark_ms: int | None,
                   max_points: int, cache: PointCache | None = None,
                   groups: Iterable[tuple[str, ...]] = (), *, kept_at_ms: int) -> list[dict[str, Any]]:
    """Recompute only the affected windows; keep the points of the groups that changed there.
    kept_at_ms: the clock retention is measured against (compute_series), the tick's.

    `groups`: those the subscribers were shown (their snapshots' and points'). A window affected for
    every group (ALL_GROUPS: the watermark passed it) gets a point for each of them, as REST answers
    it: one the recomputation left out (no rows of that group in these windows) an empty point."""
    merged: dict[tuple[str, tuple], dict[str, Any]] = {}
    groups = list(groups) if rq.group_by else []
    for lo, hi in runs(affected, rq.step_ms):
        seen: set[tuple[str, tuple]] = set()
        for s in compute_series(store, rq, lo, hi, watermark_ms, max_points, cache, kept_at_ms=kept_at_ms):
            group = tuple(s["group"].get(g, "") for g in rq.group_by)
            seen.add((s["stat"], group))
            points = []
            for p in s["points"]:
                groups_there = affected.get(p["t"], ())
                if groups_there is ALL_GROUPS or group in groups_there:
                    points.append(p)
            if points:
                key = (s["stat"], group)
                if key in merged:
                    merged[key]["points"].extend(points)
                else:
                    merged[key] = {"stat": s["stat"], "group": s["group"], "points": points}
        if not groups:
            continue
        whole = [t for t in range(lo, hi, rq.step_ms) if t in affected and affected[t] is ALL_GROUPS]
        if not whole:
            continue
        for i, stat in enumerate(rq.stats):
            missing = [g for g in groups if (stat, g) not in seen]
            if not missing:
                continue
            empty = {p.t_ms: point_json(p) for p in empty_points(rq, i, lo, hi, watermark_ms=watermark_ms)}
            points = [empty[t] for t in whole]
            for group in missing:
                key = (stat, group)
                if key in merged:
                    merged[key]["points"].extend(points)
                else:
                    merged[key] = {"stat": stat, "group": dict(zip(rq.group_by, group)), "points": list(points)}
    return list(merged.values())


def group_marks(rq: Query, series: Iterable[dict[str, Any]]) -> dict[tuple[str, ...], int | None]:
    """Per group of these series (JSON), the latest window start holding rows (count > 0); None for a
    group shown without any. Nothing without group_by (one series, always answered)."""
    marks: dict[tuple[str, ...], int | None] = {}
    if not rq.group_by:
        return marks
    for s in series:
        group = tuple(s["group"].get(g, "") for g in rq.group_by)
        last = max((p["t"] for p in s["points"] if p["count"]), default=None)
        held = marks.get(group)
        marks[group] = last if held is None else held if last is None else max(held, last)
    return marks

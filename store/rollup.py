"""Query-time roll-up of stored panes into windowed series: pure, no I/O, no clock.

Panes are stored once, at one fine granularity, and every query (any step, any sliding
window, any stat, any group-by) is answered by merging them; that is why a new metric or
a new dashboard resolution never needs reprocessing. Merging is associative and
commutative, so the work is split in two passes that keep the costly part, sketch
merges, few:

1. Every pane goes to a (group, bucket) accumulator. A bucket is gcd(step, window) long,
   so every window is a whole number of buckets (with window == step a bucket *is* a
   window). Sketch bytes are merged once per bucket; sketches the stat does not need are
   never deserialized.
2. Windows slide over the buckets with the two-stacks technique, so each bucket is merged
   a bounded number of times whatever window/step is: a 1-day window at a 1-minute step
   costs about what a tumbling one does.

Window semantics are Spark's window(time, windowDuration, slideDuration): a point's t_ms is
its window start, and it covers the panes whose start lies in [t, t + window).
"""

from __future__ import annotations

import json
import math
import re
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from sketches import HllSketch, KllSketch
from store.exact_sum import exact_sum
from store.panes import Pane, filtered_group

__all__ = [
    "DEFAULT_MAX_POINTS",
    "BucketStats",
    "ErrorBound",
    "Point",
    "RollupError",
    "Series",
    "SketchRow",
    "align_range",
    "rollup",
    "rollup_buckets",
    "rollup_sketch_rows",
    "window_points",
]

DEFAULT_MAX_POINTS = 11_000
_COUNT_STATS = ("count", "rate")
_VALUE_STATS = ("sum", "avg", "min", "max")
_PERCENTILE = re.compile(r"^p\d+(?:\.\d+)?$")


class RollupError(ValueError):
    """A query the roll-up cannot answer as asked; the API turns it into an HTTP 400."""


class ErrorBound(NamedTuple):
    """How far an estimated value may be off; attached to sketch-based values only (a named tuple,
    as Point: a cold day of 1-minute percentiles builds 1 440 of them, a frozen dataclass ~1 us each)."""

    kind: str  # "hll" or "kll"
    lower: float  # hll: 2-sigma lower bound; kll: value at rank q - rank_error
    upper: float
    relative_error: float | None = None  # hll: 1-sigma relative standard error (fraction)
    rank_error: float | None = None  # kll: normalized rank error (fraction, 99 % confidence)
    expected_undercount: float | None = None  # bloom (first_seen): expected false positives hidden in the value


class Point(NamedTuple):
    """One window's value (a named tuple, not a dataclass: a day at 1-minute steps by 8 groups
    makes 11 520 of them per query, and a frozen dataclass costs several times more to build)."""

    t_ms: int  # window start
    value: float | None  # None where the stat is undefined for the window (avg/min/max/pNN of nothing)
    count: int  # events in the window
    final: bool  # the watermark has passed the window's end: no more late data can change it
    revision: int  # max revision of the panes in the window, 0 when none
    error: ErrorBound | None


@dataclass(frozen=True)
class Series:
    group: dict[str, str]  # group-by dimension -> value ({} when not grouped)
    points: list[Point]


def window_points(start_ms: int, end_ms: int, step_ms: int) -> range:
    """The window starts of a query: start, start + step, ... while < end."""
    return range(start_ms, end_ms, step_ms)


def align_range(start_ms: int, end_ms: int, step_ms: int) -> tuple[int, int]:
    """Floor start and ceil end to multiples of step (also for times before 1970)."""
    if step_ms <= 0:
        raise RollupError(f"step_ms must be positive, got {step_ms}")
    return start_ms - start_ms % step_ms, end_ms + (-end_ms) % step_ms


def rollup(
    panes: Iterable[Pane],
    *,
    stat: str,
    quantile: float | None,
    value_field: str | None,
    distinct_field: str | None,
    start_ms: int,
    end_ms: int,
    step_ms: int,
    window_ms: int | None,
    pane_ms: int,
    group_by: Sequence[str] = (),
    filters: Mapping[str, str] | None = None,
    watermark_ms: int | None = None,
    max_points: int = DEFAULT_MAX_POINTS,
) -> list[Series]:
    """One series per group of `stat` over windows of `window_ms` (default: step) every `step_ms`.

    Panes outside the queried windows and panes not matching `filters` are skipped; with
    `group_by`, only groups that have a pane inside the queried windows get a series.
    """
    window_ms = step_ms if window_ms is None else window_ms
    kind = _check(stat, quantile, value_field, distinct_field, start_ms, end_ms, step_ms, window_ms, pane_ms, max_points)
    group_by = tuple(group_by)
    filters = dict(filters or {})

    bucket_ms, span_ms = _bucket_span(start_ms, end_ms, step_ms, window_ms)
    buckets = _fill_buckets(
        panes, kind, value_field or "", distinct_field or "", start_ms, span_ms, bucket_ms, group_by, filters
    )
    return _finish(buckets, kind, stat, quantile, start_ms, end_ms, step_ms, window_ms, group_by, watermark_ms)


def _bucket_span(start_ms: int, end_ms: int, step_ms: int, window_ms: int) -> tuple[int, int]:
    """The buckets' width (the gcd of step and window) and the span from start_ms the queried
    windows cover in whole buckets (the last window may reach past end_ms)."""
    bucket_ms = math.gcd(step_ms, window_ms)
    stride, width = step_ms // bucket_ms, window_ms // bucket_ms  # in buckets
    n_points = len(window_points(start_ms, end_ms, step_ms))
    return bucket_ms, ((n_points - 1) * stride + width) * bucket_ms


class SketchRow(NamedTuple):
    """What a sketch stat needs of one stored row (PaneStore.read_tier_sketch): no Pane, no exact
    stats, one sketch. A cold day at 1-minute steps reads 1 440 of them; building Panes for them
    cost about as much as the 1 440 quantiles."""

    start_ms: int
    dims: str  # the row's dimensions as stored (JSON text)
    count: int
    revision: int
    sketch: bytes | None  # the stat's KLL or HLL bytes, None when the row has none
    last_batch: int  # the newest batch that changed it: a cold query fingerprints its windows from these rows


def rollup_sketch_rows(
    rows: Iterable[SketchRow],
    *,
    stat: str,
    quantile: float | None,
    value_field: str | None,
    distinct_field: str | None,
    start_ms: int,
    end_ms: int,
    step_ms: int,
    window_ms: int | None,
    pane_ms: int,
    group_by: Sequence[str] = (),
    filters: Mapping[str, str] | None = None,
    watermark_ms: int | None = None,
    max_points: int = DEFAULT_MAX_POINTS,
) -> list[Series]:
    """rollup() of a sketch stat (distinct, pNN) from SketchRows holding its sketch: the same
    series as rollup() of the same rows as Panes (tests/unit/test_sketch_rows.py)."""
    window_ms = step_ms if window_ms is None else window_ms
    kind = _check(stat, quantile, value_field, distinct_field, start_ms, end_ms, step_ms, window_ms, pane_ms, max_points)
    if kind not in ("kll", "hll"):
        raise RollupError(f"stat {stat!r} is exact: its rows are summed by the store, not read as sketches")
    group_by = tuple(group_by)
    bucket_ms, span_ms = _bucket_span(start_ms, end_ms, step_ms, window_ms)
    buckets = _fill_sketch_buckets(rows, start_ms, span_ms, bucket_ms, group_by, dict(filters or {}))
    return _finish(buckets, kind, stat, quantile, start_ms, end_ms, step_ms, window_ms, group_by, watermark_ms)


class BucketStats(NamedTuple):
    """Exact stats of one bucket of one group, summed by the store (PaneStore.aggregate_tier);
    a named tuple, as Point, since a query makes one per stored group and bucket."""

    group: tuple[str, ...]  # the group-by values
    bucket: int  # index of the bucket of gcd(step, window) from the query's start
    count: int
    revision: int
    n: int = 0
    sum: float = 0.0
    min: float | None = None
    max: float | None = None
    last_batch: int = 0  # the newest batch that changed a row of it
    rows: int = 0  # stored rows summed into it


def rollup_buckets(
    rows: Iterable[BucketStats],
    *,
    stat: str,
    value_field: str | None,
    start_ms: int,
    end_ms: int,
    step_ms: int,
    window_ms: int | None,
    pane_ms: int,
    group_by: Sequence[str] = (),
    watermark_ms: int | None = None,
    max_points: int = DEFAULT_MAX_POINTS,
) -> list[Series]:
    """rollup() of an exact stat (count, rate, sum, avg, min, max) from per-bucket sums the store
    made (buckets of gcd(step, window) from start_ms; one bucket for a one-window query)."""
    window_ms = step_ms if window_ms is None else window_ms
    kind = _check(stat, None, value_field, None, start_ms, end_ms, step_ms, window_ms, pane_ms, max_points)
    if kind not in ("count", "value"):
        raise RollupError(f"stat {stat!r} needs sketches, not bucket sums")
    rows = rows if isinstance(rows, list) else list(rows)
    if window_ms == step_ms:
        tumbling = _tumbling_points(rows, stat, start_ms, end_ms, step_ms, tuple(group_by), watermark_ms)
        if tumbling is not None:
            return tumbling
    buckets: dict[tuple[str, ...], dict[int, _Acc]] = {}
    for group, bucket, count, revision, n, total, lo, hi, _, _ in rows:
        per_group = buckets.get(group)
        if per_group is None:
            per_group = buckets[group] = {}
        acc = per_group.get(bucket)
        if acc is None:
            acc = per_group[bucket] = _Acc(count, revision)
        else:
            acc.count += count
            if revision > acc.revision:
                acc.revision = revision
        if n:
            acc.add_values(n, total, lo, hi)
    return _finish(buckets, kind, stat, None, start_ms, end_ms, step_ms, window_ms, tuple(group_by), watermark_ms)


def _tumbling_points(rows: list[BucketStats], stat: str, start_ms: int, end_ms: int, step_ms: int,
                     group_by: tuple[str, ...], watermark_ms: int | None) -> list[Series] | None:
    """rollup_buckets' series where each window is one bucket holding at most one BucketStats per
    group (a 1-minute step read from 1-minute rows, the store's sums of one row each): the points
    made straight from them, none of _finish's accumulators (a day by 8 endpoints is 11 520 of
    them: ~20 of its ~90 ms). None when a bucket of a group holds several: _finish adds them up.
    The same points as _finish's (tests/unit/test_rollup_tumbling.py)."""
    per_group: dict[tuple[str, ...], dict[int, BucketStats]] = {}
    for b in rows:
        cells = per_group.get(b.group)
        if cells is None:
            cells = per_group[b.group] = {}
        elif b.bucket in cells:
            return None
        cells[b.bucket] = b
    if not group_by and not per_group:
        per_group[()] = {}  # ungrouped queries always answer one series, empty or not
    starts = window_points(start_ms, end_ms, step_ms)
    # Final: windows ending at or before the watermark, the first `final_until` of them.
    final_until = 0 if watermark_ms is None else max(0, min(len(starts), (watermark_ms - step_ms - start_ms) // step_ms + 1))
    empty_value = None if stat in ("avg", "min", "max") else 0.0
    out = []
    for group in sorted(per_group):
        cells = per_group[group]
        points = []
        for i, t in enumerate(starts):
            b = cells.get(i)
            if b is None:
                points.append(Point(t, empty_value, 0, i < final_until, 0, None))
                continue
            n = b.n
            if stat == "count":
                value = float(b.count)
            elif stat == "rate":
                value = b.count * 1000.0 / step_ms
            elif stat == "sum":
                value = exact_sum((b.sum,)) if n else 0.0
            elif stat == "avg":
                value = exact_sum((b.sum,)) / n if n else None
            elif stat == "min":
                value = b.min if n else None
            else:  # max
                value = b.max if n else None
            points.append(Point(t, value, b.count, i < final_until, b.revision, None))
        out.append(Series(group=dict(zip(group_by, group)), points=points))
    return out


def _finish(buckets: dict[tuple[str, ...], dict[int, _Acc]], kind: str, stat: str, quantile: float | None,
            start_ms: int, end_ms: int, step_ms: int, window_ms: int, group_by: tuple[str, ...],
            watermark_ms: int | None) -> list[Series]:
    """Pass 2 for every group: close the buckets, slide the windows, make the points."""
    bucket_ms = math.gcd(step_ms, window_ms)
    stride, width = step_ms // bucket_ms, window_ms // bucket_ms  # in buckets
    n_points = len(window_points(start_ms, end_ms, step_ms))
    if not group_by and not buckets:
        buckets[()] = {}  # ungrouped queries always answer one series, empty or not

    combine, absorb = _combiner(kind)
    out: list[Series] = []
    for group in sorted(buckets):
        per_group = buckets[group]
        if stride == width == 1:  # tumbling: each window is one bucket, nothing to merge
            out.append(Series(group=dict(zip(group_by, group)), points=_tumbling_sketch_points(
                per_group, kind, stat, quantile, start_ms, end_ms, step_ms, window_ms, watermark_ms)))
            continue
        if kind == "kll":  # its buckets closed as the windows reach them, each window's point made as it is
            windows: Iterable[_Acc | None] = _slide_kll(sorted(per_group.items()), n_points, stride, width)
        else:
            for acc in per_group.values():
                _close_bucket(acc, kind)
            items = sorted(per_group.items())
            windows = _slide(items, n_points, stride, width, combine, absorb)
            if stat in ("sum", "avg"):
                windows = _with_exact_totals(windows, _exact_window_totals(items, n_points, stride, width))
        points = [
            _point(t, acc, stat, kind, quantile, window_ms, watermark_ms)
            for t, acc in zip(window_points(start_ms, end_ms, step_ms), windows)
        ]
        out.append(Series(group=dict(zip(group_by, group)), points=points))
    return out


def _tumbling_sketch_points(per_group: dict[int, _Acc], kind: str, stat: str, quantile: float | None, start_ms: int,
                            end_ms: int, step_ms: int, window_ms: int, watermark_ms: int | None) -> list[Point]:
    """A tumbling window's points, each bucket's sketch made, asked and let go in turn: a day of
    1-minute KLLs held at once, with the sorted view each builds for its quantile, was ~25 MB
    that a query's process faulted in (and glibc gave back) at every cold query, ~40 ms of it."""
    points = []
    for i, t in enumerate(window_points(start_ms, end_ms, step_ms)):
        acc = per_group.get(i)
        if acc is not None:
            _close_bucket(acc, kind)
        points.append(_point(t, acc, stat, kind, quantile, window_ms, watermark_ms))
        if acc is not None:
            acc.sketch = None
    return points


def _check(
    stat: str,
    quantile: float | None,
    value_field: str | None,
    distinct_field: str | None,
    start_ms: int,
    end_ms: int,
    step_ms: int,
    window_ms: int,
    pane_ms: int,
    max_points: int,
) -> str:
    """Validate a query; return the kind of work the stat needs: count, value, kll or hll."""
    if pane_ms <= 0:
        raise RollupError(f"pane_ms must be positive, got {pane_ms}")
    if step_ms <= 0 or step_ms % pane_ms:
        raise RollupError(f"step_ms must be a positive multiple of the pane size {pane_ms} ms, got {step_ms}")
    if window_ms <= 0 or window_ms % pane_ms:
        raise RollupError(f"window_ms must be a positive multiple of the pane size {pane_ms} ms, got {window_ms}")
    if window_ms < step_ms:
        raise RollupError(f"window_ms must be at least step_ms ({step_ms}), got {window_ms}")
    if start_ms % step_ms:
        raise RollupError(f"start_ms must be a multiple of step_ms ({step_ms}), got {start_ms}; align the range first")
    if end_ms <= start_ms:
        raise RollupError(f"end_ms must be after start_ms ({start_ms}), got {end_ms}")
    n_points = len(window_points(start_ms, end_ms, step_ms))
    if n_points > max_points:
        raise RollupError(
            f"the query asks for {n_points} points, more than the limit of {max_points}; use a larger step or a shorter range"
        )

    if stat in _COUNT_STATS:
        return "count"
    if stat in _VALUE_STATS:
        if not value_field:
            raise RollupError(f"stat {stat!r} needs a value field")
        return "value"
    if stat == "distinct":
        if not distinct_field:
            raise RollupError("stat 'distinct' needs a distinct field")
        return "hll"
    if _PERCENTILE.match(stat):
        if not value_field:
            raise RollupError(f"stat {stat!r} needs a value field")
        if quantile is None or not 0.0 <= quantile <= 1.0:
            raise RollupError(f"stat {stat!r} needs a quantile within [0, 1], got {quantile}")
        return "kll"
    raise RollupError(
        f"unknown stat {stat!r}; expected one of count, rate, sum, avg, min, max, distinct or pNN (e.g. p99)"
    )


class _Acc:
    """Everything one bucket (or one window) needs for the stat asked, nothing more."""

    __slots__ = ("count", "revision", "n", "total", "lo", "hi", "sketch", "sums", "blobs")

    def __init__(self, count: int = 0, revision: int = 0, n: int = 0, total: float = 0.0,
                 lo: float | None = None, hi: float | None = None, sketch: KllSketch | HllSketch | None = None):
        self.count = count
        self.revision = revision
        self.n = n
        self.total = total
        self.lo = lo
        self.hi = hi
        self.sketch = sketch
        self.sums: list[float] | None = None  # per-pane sums, until the bucket is closed
        self.blobs: list[bytes] | None = None  # per-pane sketch bytes, until the bucket is closed

    def add_values(self, n: int, total: float, lo: float | None, hi: float | None) -> None:
        """One row's value stats into a bucket (its sum is kept apart until the bucket closes)."""
        self.n += n
        if self.sums is None:
            self.sums = []
        self.sums.append(total)
        if lo is not None and (self.lo is None or lo < self.lo):
            self.lo = lo
        if hi is not None and (self.hi is None or hi > self.hi):
            self.hi = hi


_UNSEEN: tuple[str, ...] = ("<unseen>",)  # compared by identity, so no real group can collide


def _fill_buckets(
    panes: Iterable[Pane],
    kind: str,
    value_field: str,
    distinct_field: str,
    start_ms: int,
    span_ms: int,
    bucket_ms: int,
    group_by: tuple[str, ...],
    filters: dict[str, str],
) -> dict[tuple[str, ...], dict[int, _Acc]]:
    """Pass 1: group -> bucket index -> accumulator, touching only what the stat needs."""
    buckets: dict[tuple[str, ...], dict[int, _Acc]] = {}
    group_of: dict[str, tuple[str, ...] | None] = {}  # dims text -> group, None when filtered out: parse once
    for pane in panes:
        key = pane.key
        offset = key.start_ms - start_ms
        if offset < 0 or offset >= span_ms:
            continue
        group = group_of.get(key.dims, _UNSEEN)
        if group is _UNSEEN:
            dims = key.dims_dict()
            group = group_of[key.dims] = filtered_group(dims, group_by, filters)
        if group is None:
            continue
        per_group = buckets.get(group)
        if per_group is None:
            per_group = buckets[group] = {}
        idx = offset // bucket_ms
        acc = per_group.get(idx)
        if acc is None:
            acc = per_group[idx] = _Acc()
        data = pane.data
        acc.count += data.count
        if pane.revision > acc.revision:
            acc.revision = pane.revision
        if kind == "value":
            stats = data.values.get(value_field)
            if stats is not None and stats.n:
                acc.add_values(stats.n, stats.sum, stats.min, stats.max)
        elif kind != "count":
            if kind == "kll":
                stats = data.values.get(value_field)
                blob = stats.kll if stats is not None else None
            else:
                blob = data.distincts.get(distinct_field)
            if blob:
                if acc.blobs is None:
                    acc.blobs = []
                acc.blobs.append(blob)
    return buckets


def _fill_sketch_buckets(
    rows: Iterable[SketchRow],
    start_ms: int,
    span_ms: int,
    bucket_ms: int,
    group_by: tuple[str, ...],
    filters: dict[str, str],
) -> dict[tuple[str, ...], dict[int, _Acc]]:
    """_fill_buckets for a sketch stat, from SketchRows: the same accumulators."""
    buckets: dict[tuple[str, ...], dict[int, _Acc]] = {}
    group_of: dict[str, tuple[str, ...] | None] = {}  # dims text -> group, None when filtered out: parse once
    for start, dims_text, count, revision, blob, _ in rows:
        offset = start - start_ms
        if offset < 0 or offset >= span_ms:
            continue
        group = group_of.get(dims_text, _UNSEEN)
        if group is _UNSEEN:
            dims = json.loads(dims_text)
            group = group_of[dims_text] = filtered_group(dims, group_by, filters)
        if group is None:
            continue
        per_group = buckets.get(group)
        if per_group is None:
            per_group = buckets[group] = {}
        idx = offset // bucket_ms
        acc = per_group.get(idx)
        if acc is None:
            acc = per_group[idx] = _Acc(count, revision)
        else:
            acc.count += count
            if revision > acc.revision:
                acc.revision = revision
        if blob:
            if acc.blobs is None:
                acc.blobs = [blob]
            else:
                acc.blobs.append(blob)
    return buckets


def _close_bucket(acc: _Acc, kind: str) -> None:
    # fsum is exactly rounded, so a bucket's sum does not depend on the order panes came in.
    if acc.sums is not None:
        acc.total = exact_sum(acc.sums)
        acc.sums = None
    if acc.blobs is not None:
        if kind == "kll" and len(acc.blobs) == 1:
            # One row: its own sketch (a KLL merged into an empty one answers the same; an HLL
            # union would switch it to the union's estimator, so HLLs are merged as before).
            acc.sketch = KllSketch.from_bytes(acc.blobs[0])
        else:
            acc.sketch = (KllSketch if kind == "kll" else HllSketch).merge_all(acc.blobs)
        acc.blobs = None


def _combiner(kind: str) -> tuple[Callable[[_Acc | None, _Acc | None], _Acc | None],
                                  Callable[[_Acc | None, _Acc], _Acc]]:
    """The merge of two accumulators for this kind of stat, which never mutates its inputs, and
    the merge of one into an accumulator the caller holds alone (a running merge): a KLL is then
    merged in place, the copy merge_all would make of it skipped (a third of a sliding window's
    merges copied a sketch of ~650 items)."""
    sketch_kind = KllSketch if kind == "kll" else HllSketch

    def combine(a: _Acc | None, b: _Acc | None) -> _Acc | None:
        # Returning the other side as is makes tumbling windows and empty buckets free.
        if a is None:
            return b
        if b is None:
            return a
        if a.sketch is None or b.sketch is None:
            sketch = a.sketch if b.sketch is None else b.sketch
        else:
            sketch = sketch_kind.merge_all([a.sketch, b.sketch])
        return _Acc(
            count=a.count + b.count,
            revision=max(a.revision, b.revision),
            n=a.n + b.n,
            total=a.total + b.total,
            lo=b.lo if a.lo is None else a.lo if b.lo is None else min(a.lo, b.lo),
            hi=b.hi if a.hi is None else a.hi if b.hi is None else max(a.hi, b.hi),
            sketch=sketch,
        )

    def absorb(into: _Acc | None, b: _Acc) -> _Acc:
        """combine(into, b), changing `into` (held by the caller alone; None: a copy of b to hold)."""
        if into is None:
            # A KLL is copied, as it will be merged into; an HLL is only ever replaced, never changed.
            sketch = b.sketch
            if kind == "kll" and sketch is not None:
                sketch = sketch.copy()
            return _Acc(b.count, b.revision, b.n, b.total, b.lo, b.hi, sketch)
        into.count += b.count
        if b.revision > into.revision:
            into.revision = b.revision
        into.n += b.n
        into.total += b.total
        if b.lo is not None and (into.lo is None or b.lo < into.lo):
            into.lo = b.lo
        if b.hi is not None and (into.hi is None or b.hi > into.hi):
            into.hi = b.hi
        if b.sketch is not None:
            if into.sketch is None:
                into.sketch = b.sketch.copy() if kind == "kll" else b.sketch
            elif kind == "kll":
                into.sketch.merge_in(b.sketch)  # what merge_all([into, b]) does, less its copy of `into`
            else:
                into.sketch = HllSketch.merge_all([into.sketch, b.sketch])
        return into

    return combine, absorb


def _slide(
    items: list[tuple[int, _Acc]],
    n_points: int,
    stride: int,
    width: int,
    combine: Callable[[_Acc | None, _Acc | None], _Acc | None],
    absorb: Callable[[_Acc | None, _Acc], _Acc],
) -> list[_Acc | None]:
    """Pass 2: for each point i, the merge of the items with index in [i*stride, i*stride + width).

    Two stacks make a queue with O(1) amortized merges per item: new items go on the back,
    which keeps a running merge; expiring items leave from the front, which holds suffix
    merges and is refilled by flipping the back when it runs dry. Only non-empty buckets
    are items, so sparse data costs little. The back's running merge is this function's own
    and is merged into in place; a point that is the back's merge alone gets a copy of it.
    """
    out: list[_Acc | None] = []
    front: list[tuple[int, _Acc | None]] = []  # (index, merge of it and all newer front items); oldest last
    back: list[tuple[int, _Acc]] = []
    back_merged: _Acc | None = None
    j = 0
    for i in range(n_points):
        lo = i * stride
        hi = lo + width
        while front or back:  # evict what the window left behind
            oldest = front[-1][0] if front else back[0][0]
            if oldest >= lo:
                break
            if not front:
                merged: _Acc | None = None
                for idx, acc in reversed(back):
                    merged = combine(acc, merged)
                    front.append((idx, merged))
                back.clear()
                back_merged = None
            front.pop()
        while j < len(items) and items[j][0] < hi:  # admit what the window reached
            back.append(items[j])
            back_merged = absorb(back_merged, items[j][1])
            j += 1
        top = front[-1][1] if front else None
        if top is None and back_merged is not None:
            out.append(absorb(None, back_merged))  # the back's merge goes on changing: the point keeps a copy
        else:
            out.append(combine(top, back_merged))
    return out


# Every finite double is a whole multiple of 2**-1074: scaled by 2**1074, sums of them are
# Python integers, exact, and a difference of prefix sums is a window's exact sum.
_FIXED_SHIFT = 1074


def _exact_window_totals(items: list[tuple[int, _Acc]], n_points: int, stride: int, width: int) -> list[float | None]:
    """Each window's sum of its closed buckets' totals, exactly rounded: _slide adds them in an
    order that depends on where the range starts (its stacks), so the same window asked in
    another range could differ in its last bits, or by whole units where values cancel (1e16, 1,
    -1e16: 0.0 where the sum is 1.0), and a window kept from one range (store/series.py's chunks)
    would differ from the same window computed in another. None where a total is not finite (or
    the sum is past a double): that window's plain sum stands."""
    n_buckets = (n_points - 1) * stride + width
    at: list[int] = []
    prefix, not_finite = [0], [0]
    for idx, acc in items:  # sorted by index
        if not 0 <= idx < n_buckets or not acc.n:
            continue
        at.append(idx)
        if math.isfinite(acc.total):
            num, den = acc.total.as_integer_ratio()  # den: a power of two, at most 2**1074
            prefix.append(prefix[-1] + (num << (_FIXED_SHIFT - den.bit_length() + 1)))
            not_finite.append(not_finite[-1])
        else:
            prefix.append(prefix[-1])
            not_finite.append(not_finite[-1] + 1)
    out: list[float | None] = []
    for i in range(n_points):
        first, last = bisect_left(at, i * stride), bisect_left(at, i * stride + width)
        if not_finite[last] != not_finite[first]:
            out.append(None)
            continue
        try:
            out.append((prefix[last] - prefix[first]) / (1 << _FIXED_SHIFT))  # int / int: correctly rounded
        except OverflowError:
            out.append(None)
    return out


def _with_exact_totals(windows: Iterable[_Acc | None], totals: list[float | None]) -> list[_Acc | None]:
    """The windows with their exact totals (_exact_window_totals); new accumulators, since _slide
    may hand the same one to several windows or a bucket's own."""
    out: list[_Acc | None] = []
    for acc, total in zip(windows, totals):
        if acc is not None and acc.n and total is not None and total != acc.total:
            acc = _Acc(acc.count, acc.revision, acc.n, total, acc.lo, acc.hi)
        out.append(acc)
    return out


def _range_max(values: np.ndarray, first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """max(values[first[i]:last[i]]) for each i, 0 for an empty range (values >= 0): a sparse table
    of maxima over spans of 2**k, each range the max of the two spans that cover it."""
    out = np.zeros(len(first), dtype=np.int64)
    length = last - first
    if not len(values) or not (length > 0).any():
        return out
    levels = [values]
    while 2 ** len(levels) <= len(values):
        half = 2 ** (len(levels) - 1)
        levels.append(np.maximum(levels[-1][:-half], levels[-1][half:]))
    level = np.zeros(len(first), dtype=np.int64)
    nonempty = length > 0
    level[nonempty] = np.floor(np.log2(length[nonempty])).astype(np.int64)
    level -= (np.left_shift(1, level) > length) & nonempty  # log2 of a float may round a 2**k - 1 up to k
    for k in np.unique(level[nonempty]).tolist():
        pick = nonempty & (level == k)
        table = levels[k]
        out[pick] = np.maximum(table[first[pick]], table[last[pick] - 2 ** k])
    return out


def _slide_kll(items: list[tuple[int, _Acc]], n_points: int, stride: int, width: int) -> Iterator[_Acc | None]:
    """_slide for KLL buckets (not yet closed), with the same sketch merges in the same order (so
    the same answers), less its per-merge objects: the windows' counts and revisions are prefix
    sums and sliding maxima over the buckets, and the two stacks hold bare sketches. A day's 1 h
    window at 1-minute steps makes ~4 300 merges; building an accumulator and calling a combiner
    for each was ~15 % of that query's time. A bucket's sketch is made when the window reaches it
    and the windows are yielded one by one: a day's 1 441 bucket sketches and 1 440 window merges,
    all held at once with their sorted views, were ~30 MB a cold query faulted in."""
    n_buckets = (n_points - 1) * stride + width
    kept = [(idx, acc) for idx, acc in items if 0 <= idx < n_buckets]  # items: sorted by index
    sketches = [(idx, acc) for idx, acc in kept if acc.blobs is not None or acc.sketch is not None]
    # Over the buckets that hold rows only, as store/series.py's fingerprints: dense arrays of every
    # bucket cost the window's length (a 36 500-day window over 10 s panes: 315 M buckets, gigabytes).
    at = np.array([idx for idx, _ in kept], dtype=np.int64)
    counts = np.concatenate([[0], np.cumsum(np.array([acc.count for _, acc in kept], dtype=np.int64))])
    starts = np.arange(n_points, dtype=np.int64) * stride
    first, last = np.searchsorted(at, starts), np.searchsorted(at, starts + width)
    window_counts = (counts[last] - counts[first]).tolist()
    window_present = (last - first).tolist()
    window_revisions = _range_max(np.array([acc.revision for _, acc in kept], dtype=np.int64), first, last).tolist()

    front: list[tuple[int, KllSketch]] = []  # (index, merge of it and all newer front sketches); oldest last
    back: list[tuple[int, KllSketch]] = []
    back_merged: KllSketch | None = None  # this function's own: merged into in place
    j = 0
    for i in range(n_points):
        lo = i * stride
        hi = lo + width
        while front or back:  # evict what the window left behind
            oldest = front[-1][0] if front else back[0][0]
            if oldest >= lo:
                break
            if not front:
                merged: KllSketch | None = None
                for idx, sketch in reversed(back):
                    if merged is not None:
                        sketch = KllSketch.merge_all([sketch, merged])
                    merged = sketch
                    front.append((idx, merged))
                back.clear()
                back_merged = None
            front.pop()
        while j < len(sketches) and sketches[j][0] < hi:  # admit what the window reached
            idx, acc = sketches[j]
            _close_bucket(acc, "kll")
            admitted, acc.sketch = acc.sketch, None  # held by the stacks only, let go once they drop it
            back.append((idx, admitted))
            if back_merged is None:
                back_merged = admitted.copy()
            else:
                back_merged.merge_in(admitted)
            j += 1
        if not window_present[i]:
            yield None
            continue
        top = front[-1][1] if front else None
        if top is None:
            sketch = back_merged.copy() if back_merged is not None else None  # the back's merge goes on changing
        elif back_merged is None:
            sketch = top
        else:
            sketch = KllSketch.merge_all([top, back_merged])
        yield _Acc(window_counts[i], window_revisions[i], sketch=sketch)


def _point(
    t_ms: int,
    acc: _Acc | None,
    stat: str,
    kind: str,
    quantile: float | None,
    window_ms: int,
    watermark_ms: int | None,
) -> Point:
    acc = acc or _Acc()
    value: float | None
    error: ErrorBound | None = None
    if stat == "count":
        value = float(acc.count)
    elif stat == "rate":
        value = acc.count * 1000.0 / window_ms
    elif stat == "sum":
        value = acc.total
    elif stat == "avg":
        value = acc.total / acc.n if acc.n else None
    elif stat == "min":
        value = acc.lo
    elif stat == "max":
        value = acc.hi
    elif kind == "hll":
        value = 0.0
        if acc.sketch is not None:
            value, lower, upper, relative_error = acc.sketch.estimate_bounds(2)
            error = ErrorBound("hll", lower, upper, relative_error)
    else:  # kll percentile
        value = None
        q = acc.sketch.quantile_bounds(quantile) if acc.sketch is not None else None
        if q is not None:
            value, lower, upper, rank_error = q
            error = ErrorBound("kll", lower, upper, None, rank_error)
    final = watermark_ms is not None and t_ms + window_ms <= watermark_ms
    return Point(t_ms, value, acc.count, final, acc.revision, error)

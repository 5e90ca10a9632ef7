"""One query path: the series of a stat over windows, read from the coarsest stored rows
that can answer it (store/planner.py) and rolled up (store/rollup.py). REST queries, the
websocket hub and alert rules all come through here, so they read the same numbers."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence

import numpy as np

from store.base import PaneStore
from store.panes import filtered_group
from store.planner import answerable_ms, plan_read
from store.point_cache import PointCache
from store.gc_pause import paused_gc
from store import tier_folds
from store.rollup import (DEFAULT_MAX_POINTS, BucketStats, Point, Series, SketchRow, rollup, rollup_buckets,
                           rollup_sketch_rows, window_points)

_EXACT_STATS = ("count", "rate", "sum", "avg", "min", "max")


def _plan(layout, pane_ms, start_ms, end_ms, step_ms, window_ms, needed, max_points, query_points=None, now_ms=None,
          folded_ms=None):
    """(segment, projection, bucket) for each segment to read; nothing for a query rollup refuses.

    query_points: the windows of the whole query when [start_ms, end_ms) is a part of it (the
    windows a cache missed). Read with the whole query's granules: a lone window may read any
    granule, and at a tier's keep horizon a coarser row still holds minutes the finer tier dropped,
    so that window would differ from the same window computed with the others (and be cached
    under the whole plan's fingerprint).

    now_ms: the clock retention is measured against (store.planner.kept_from_ms): no granule is
    read where its rows may be dropped. Spans nothing kept can answer are read from nowhere: the
    query refuses those steps before it gets here (query.model.check_kept)."""
    if step_ms <= 0 or window_ms <= 0 or end_ms <= start_ms:
        return []
    n_points = len(window_points(start_ms, end_ms, step_ms))
    if n_points > max_points:  # rollup refuses the query, with its reason
        return []
    span_end = start_ms + (n_points - 1) * step_ms + window_ms
    granule_points = n_points if query_points is None else query_points
    plan = plan_read(layout, pane_ms, start_ms, span_end, step_ms, window_ms, granule_points, needed, now_ms,
                     folded_ms)
    # A one-window query: every row lands in it, whatever bucket; else rollup's buckets of
    # gcd(step, window), also for a part of a query that is one window (the one before a kept
    # chunk): its sum is then added up by the same buckets as where the whole query computes it,
    # not by the dimensions' sums over the window, which round apart in the last bits.
    bucket = span_end - start_ms if granule_points == 1 else math.gcd(step_ms, window_ms)
    return [(seg, seg.proj, bucket) for seg in plan.segments]


def query_series(*args, **kwargs) -> list[Series]:
    """_query_series with the cyclic garbage collector paused: a query's objects (bucket sums, rows,
    sketches, points) are short-lived and acyclic, and the collector's passes over them were up to a
    fifth of a cold day's percentile (store/gc_pause.py says why pausing it is safe)."""
    with paused_gc():
        return _query_series(*args, **kwargs)


def _query_series(
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
    cache: PointCache | None = None,
    now_ms: int | None = None,
    plan_points: int | None = None,
    chunked: bool = True,
) -> list[Series]:
    """rollup()'s series of `stat` for windows starting in [start_ms, end_ms) every step_ms; with a
    cache, final points of sketch stats whose rows did not change are reused (store/point_cache.py),
    and a view's chunks of final windows, every group's (_reusing_chunks).

    plan_points: the whole query's windows where [start_ms, end_ms) is a part of it (_plan's
    query_points); chunked: False for such a part (its query looked for chunks already)."""
    window_ms = step_ms if window_ms is None else window_ms
    filters = dict(filters or {})
    needed = (*group_by, *filters)
    layout = store.tier_layout(stream)  # read once: the cached path plans twice
    # The coarser tiers' fold point (store/tier_folds.py), read with the layout: their rows
    # ending by the last shard's are complete, whatever a fold adds while the query reads.
    clock = store.tier_fold_clock(stream) if layout is not None else None
    folded_ms = None if clock is None else tier_folds.complete_point(layout, clock)
    query_points = plan_points or (len(window_points(start_ms, end_ms, step_ms)) if step_ms > 0 else 0)
    plan = _plan(layout, pane_ms, start_ms, end_ms, step_ms, window_ms, needed, max_points, plan_points, now_ms,
                 folded_ms)
    shape = None if cache is None else (  # the cache's key of this query's points (rows per layout)
        stream, stat, quantile, value_field, distinct_field, step_ms, window_ms, tuple(group_by),
        tuple(sorted(filters.items())), layout.to_json() if layout is not None else None)
    if stat in _EXACT_STATS:
        # Exact stats are summed by the store per bucket and group: few rows reach Python.
        value = value_field if stat not in ("count", "rate") else None

        def exact_series(lo: int, hi: int, segments) -> list[Series]:
            return rollup_buckets(_sums(store, stream, pane_ms, segments, lo, group_by, filters, value),
                                  stat=stat, value_field=value_field, start_ms=lo, end_ms=hi, step_ms=step_ms,
                                  window_ms=window_ms, pane_ms=pane_ms, group_by=group_by, watermark_ms=watermark_ms,
                                  max_points=max_points)

        if cache is None or not plan:
            return exact_series(start_ms, end_ms, plan)
        chunks = _chunk_validities(store, stream, pane_ms, plan, start_ms, end_ms, step_ms, window_ms, filters,
                                   watermark_ms) if chunked else {}
        if not chunks:
            return exact_series(start_ms, end_ms, plan)
        # A part's windows are read with the whole query's granules, as a cache miss's are.
        return _reusing_chunks(cache, shape, chunks, start_ms, end_ms, step_ms, answerable_ms(
            layout, pane_ms, step_ms, window_ms), group_by, lambda lo, hi: exact_series(lo, hi, _plan(
                layout, pane_ms, lo, hi, step_ms, window_ms, needed, max_points, query_points, now_ms, folded_ms)),
            lambda: _empty_points(stat, None, value_field, None, start_ms, end_ms, step_ms, window_ms, pane_ms,
                                  watermark_ms))

    kind = "hll" if stat == "distinct" else "kll"
    field = distinct_field if kind == "hll" else value_field

    def read_segments(lo: int, hi: int) -> list[list[SketchRow]]:
        if not field:  # rollup refuses the query, with its reason
            return []
        return [store.read_tier_sketch(stream, seg.granule_ms, proj, seg.start_ms, seg.end_ms, field=field,
                                       kind=kind, pane_ms=pane_ms)
                for seg, proj, _ in _plan(layout, pane_ms, lo, hi, step_ms, window_ms, needed, max_points,
                                          query_points, now_ms, folded_ms)]

    def read_rows(lo: int, hi: int) -> list[SketchRow]:
        return [row for segment in read_segments(lo, hi) for row in segment]

    def sketch_series(lo: int, hi: int, rows: list[SketchRow] | None = None) -> list[Series]:
        return rollup_sketch_rows(read_rows(lo, hi) if rows is None else rows, stat=stat, quantile=quantile,
                                  value_field=value_field, distinct_field=distinct_field, start_ms=lo, end_ms=hi,
                                  step_ms=step_ms, window_ms=window_ms, pane_ms=pane_ms, group_by=group_by,
                                  filters=filters, watermark_ms=watermark_ms, max_points=max_points)

    if cache is None or not plan:
        return sketch_series(start_ms, end_ms)
    # Its chunks of final windows as a query of this view kept them, while no row under them
    # changed (one summed read instead of every window's fingerprint and lookup, every group's); a
    # process before this one may have kept them (the backing), where none of this shape is in memory.
    chunks = _chunk_validities(store, stream, pane_ms, plan, start_ms, end_ms, step_ms, window_ms, filters,
                               watermark_ms) if chunked and (cache.holds(shape) or cache.backing is not None) else {}
    if chunks:
        return _reusing_chunks(cache, shape, chunks, start_ms, end_ms, step_ms, answerable_ms(
            layout, pane_ms, step_ms, window_ms), group_by, lambda lo, hi: _query_series(
                store, stream, pane_ms, stat=stat, quantile=quantile, value_field=value_field,
                distinct_field=distinct_field, start_ms=lo, end_ms=hi, step_ms=step_ms, window_ms=window_ms,
                group_by=group_by, filters=filters, watermark_ms=watermark_ms, max_points=max_points, cache=cache,
                now_ms=now_ms, plan_points=query_points, chunked=False),
            lambda: _empty_points(stat, quantile, value_field, distinct_field, start_ms, end_ms, step_ms, window_ms,
                                  pane_ms, watermark_ms))
    if not cache.holds(shape) and cache.backing is not None:  # saved by a process before this one?
        cache.load(shape, start_ms, end_ms)
    points: dict[tuple[tuple[str, ...], int], Point] = {}
    rows: list[SketchRow] | None = None
    if not cache.holds(shape):
        # Cold: no point of this shape to reuse, so every window is computed from its rows, read
        # once; their fingerprints are summed from the same rows, not read again as the store's sums.
        segments = read_segments(start_ms, end_ms)
        rows = [row for segment in segments for row in segment]
        # Summed per segment, as the store sums them (_sums): a bucket two tiers' segments share
        # (a ragged edge) adds their newest batches and revisions, where one cell would take the max.
        prints = _fingerprints([b for segment in segments
                                for b in _row_sums(segment, plan[0][2], start_ms, group_by, filters)],
                               start_ms, end_ms, step_ms, window_ms)
        missed = None  # every window with a row, once the empty ones are filled in
    else:
        # Windows whose fingerprint matches a cached point are not read again.
        prints = _fingerprints(_sums(store, stream, pane_ms, plan, start_ms, group_by, filters, None),
                               start_ms, end_ms, step_ms, window_ms)
    groups = sorted(prints) if group_by else [()]
    # Windows without a row are answered here, never cached nor kept: a stream's standard views
    # (query/standard_views.py) over the day before its first event were ~200 000 kept points.
    _fill_empty(points, groups, prints, start_ms, end_ms, step_ms, lambda: _empty_points(
        stat, quantile, value_field, distinct_field, start_ms, end_ms, step_ms, window_ms, pane_ms, watermark_ms))
    if rows is None:
        missed = _lookup(cache, shape, groups, prints, start_ms, end_ms, step_ms, points, watermark_ms)
        if missed and cache.backing is not None:  # saved by another process meanwhile?
            cache.load(shape, min(missed), max(missed) + step_ms)
            missed = _lookup(cache, shape, groups, prints, start_ms, end_ms, step_ms, points, watermark_ms)
    else:
        missed = sorted({t for group in groups for t in window_points(start_ms, end_ms, step_ms)
                         if (group, t) not in points})
    if missed:
        keep_ms = answerable_ms(layout, pane_ms, step_ms, window_ms)
        lo, hi = min(missed), max(missed) + step_ms
        computed = {tuple(s.group.get(g, "") for g in group_by): s.points for s in sketch_series(lo, hi, rows)}
        for group in groups:
            series_points = computed.get(group)
            if series_points is None:  # no row of this group in the recomputed windows
                series_points = _empty_points(stat, quantile, value_field, distinct_field, lo, hi, step_ms, window_ms,
                                              pane_ms, watermark_ms)
            fingerprints = prints.get(group)
            new = []
            for p in series_points:
                if (group, p.t_ms) not in points:
                    points[(group, p.t_ms)] = p
                    new.append(((shape, group, p.t_ms),
                                fingerprints[(p.t_ms - start_ms) // step_ms] if fingerprints else _NO_ROWS, p))
            cache.put_many(new, keep_ms=keep_ms, watermark_ms=watermark_ms)
        cache.save()
    return [Series(group=dict(zip(group_by, group)),
                   points=[points[(group, t)] for t in window_points(start_ms, end_ms, step_ms)])
            for group in groups]


_NO_ROWS = (0, 0, 0, 0)


# The windows a kept chunk holds: a day of 1-minute windows is 24 chunks, 24 rows in the store.
# Chunks start at multiples of CHUNK steps (since 1970), so a view whose range moves with the clock
# finds the chunks of the ranges before it.
CHUNK = 60


def _chunk_starts(start_ms, end_ms, step_ms, window_ms, watermark_ms) -> list[int]:
    """The starts of the chunks whose CHUNK windows are all in the query and final."""
    if watermark_ms is None or start_ms % step_ms:
        return []
    span = CHUNK * step_ms
    c = -(-start_ms // span) * span
    out = []
    while c + (CHUNK - 1) * step_ms < end_ms and c + (CHUNK - 1) * step_ms + window_ms <= watermark_ms:
        out.append(c)
        c += span
    return out


def _chunk_validities(store, stream, pane_ms, plan, start_ms, end_ms, step_ms, window_ms, filters,
                      watermark_ms) -> dict[int, str]:
    """The summary of the rows under each chunk of final windows (_chunk_starts) as text, by chunk
    start: the store's sums of each planned segment's rows per chunk-long bucket (events, rows,
    newest batch, highest revision, with the segment's granule and span), over the buckets the
    chunk's windows reach. Any change to those rows changes it: a row written (a straggler, a
    revision) carries the newest batch id, above every row's before it; a row dropped (retention)
    lowers the rows; another plan (another granule readable) reads other segments. A chunk
    without a row is left out: its windows are answered empty, never kept."""
    chunks = _chunk_starts(start_ms, end_ms, step_ms, window_ms, watermark_ms)
    if not chunks:
        return {}
    span = CHUNK * step_ms
    # Buckets that tile chunks: one a chunk where its windows' rows are within it (a window no
    # longer than the step), else ones that tile the window too, so that the rows past the chunk's
    # last window that its validity counts are less than a step's (a live batch seldom has one).
    bucket = span if window_ms <= step_ms else math.gcd(span, window_ms)
    per_chunk, reach = span // bucket, -(-((CHUNK - 1) * step_ms + window_ms) // bucket)
    origin, end = chunks[0], chunks[-1] + reach * bucket
    cells: dict[int, list[tuple]] = {}
    for seg, proj, _ in plan:
        lo, hi = max(seg.start_ms, origin), min(seg.end_ms, end)
        if lo < hi:
            for b in store.aggregate_tier(stream, seg.granule_ms, proj, lo, hi, origin_ms=origin, bucket_ms=bucket,
                                          filters=filters, pane_ms=pane_ms):
                b_lo = origin + b.bucket * bucket
                cells.setdefault(b.bucket, []).append((seg.granule_ms, proj, max(lo, b_lo), min(hi, b_lo + bucket),
                                                       b.count, b.rows, b.last_batch, b.revision))
    out = {}
    for i, c in enumerate(chunks):
        first = i * per_chunk
        entries = sorted(e for k in range(first, first + reach) for e in cells.get(k, ()))
        if entries:
            out[c] = json.dumps(entries, separators=(",", ":"))
    return out


def _reusing_chunks(cache, shape, chunks: dict[int, str], start_ms, end_ms, step_ms, keep_ms, group_by,
                    compute, empty_points) -> list[Series]:
    """A series per group whose chunks of final windows are reused while their validity
    (_chunk_validities) holds; the windows between them computed by `compute(lo, hi)` (the series
    of windows starting in [lo, hi)), and the chunks computed kept. A group without a point in a
    window (no row of it there) gets the window's empty point, as the query without a cache gives
    it (`empty_points()`: the range's, made only if needed); a kept chunk leaves out the groups
    whose points there are all empty ones. The validities are read before any row is: a row that
    changes after that makes the next validity differ."""
    reused = cache.final_chunks(shape, chunks)
    points: dict[tuple, dict[int, Point]] = {() : {}} if not group_by else {}  # group -> window start -> point
    covered: set[int] = set()  # the windows of the chunks reused
    span = CHUNK * step_ms
    for c, groups in reused.items():
        covered.update(range(c, c + span, step_ms))
        for group, chunk in groups.items():
            points.setdefault(group, {}).update(chunk)
    starts = window_points(start_ms, end_ms, step_ms)
    lo = None
    for t in (*starts, None):
        if t is not None and t not in covered:
            lo = t if lo is None else lo
        elif lo is not None:
            for s in compute(lo, t if t is not None else starts[-1] + step_ms):
                points.setdefault(tuple(s.group.get(g, "") for g in group_by), {}).update((p.t_ms, p) for p in s.points)
            lo = None
    empty = None
    for group_points in points.values():
        if len(group_points) < len(starts):
            if empty is None:
                empty = empty_points()
            for i, t in enumerate(starts):
                if t not in group_points:
                    group_points[t] = empty[i]
    fresh = {}
    for c, validity in chunks.items():
        if c not in reused:
            window_starts = range(c, c + span, step_ms)
            if all(group_points[t].final for group_points in points.values() for t in window_starts):
                if group_by and empty is None:
                    empty = empty_points()
                blank = [empty[(t - start_ms) // step_ms] for t in window_starts] if group_by else None
                fresh[c] = (validity, {group: chunk for group, chunk in (
                    (group, {t: group_points[t] for t in window_starts}) for group, group_points in points.items())
                    if not group_by or list(chunk.values()) != blank})
    for group, kept in cache.keep_chunks(shape, fresh, keep_ms=keep_ms).items():
        points[group].update(kept)  # the same points, with the texts written as they were kept
    return [Series(group=dict(zip(group_by, group)), points=[group_points[t] for t in starts])
            for group, group_points in sorted(points.items())]


def _fill_empty(points, groups, prints, start_ms, end_ms, step_ms, empty_points) -> None:
    """The windows of each group without a row (fingerprint _NO_ROWS) into `points`, from the one
    empty series `empty_points()` makes (made only if a window needs it)."""
    empty = None
    starts = window_points(start_ms, end_ms, step_ms)
    for group in groups:
        fingerprints = prints.get(group)
        for i, t in enumerate(starts):
            if fingerprints is None or fingerprints[i] == _NO_ROWS:
                if empty is None:
                    empty = empty_points()
                points[(group, t)] = empty[i]


def _lookup(cache, shape, groups, prints, start_ms, end_ms, step_ms, points, watermark_ms) -> list[int]:
    """Cached points with an unchanged fingerprint into `points` (final ones, and provisional ones
    computed under this watermark); the window starts missed."""
    missed = []
    starts = window_points(start_ms, end_ms, step_ms)
    for group in groups:
        fingerprints = prints.get(group) or [_NO_ROWS] * len(starts)
        asked = [t for t in starts if (group, t) not in points]
        found = cache.get_many([((shape, group, t), fingerprints[(t - start_ms) // step_ms]) for t in asked],
                               watermark_ms=watermark_ms)
        for t, point in zip(asked, found):
            if point is None:
                missed.append(t)
            else:
                points[(group, t)] = point
    return missed


def _row_sums(rows: list[SketchRow], bucket_ms: int, start_ms: int, group_by: Sequence[str],
              filters: Mapping[str, str]) -> list[BucketStats]:
    """What _sums gives for fingerprints (count, rows, newest batch, highest revision per bucket and
    dimensions, then per group), from the rows a cold query read anyway: equal to the store's sums
    of the same rows (tests/unit/test_cold_sketch_reads.py), so later queries find these points."""
    cells: dict[tuple[int, str], list[int]] = {}  # (bucket, dims text) -> [count, rows, newest batch, revision]
    for start, dims, count, revision, _, last_batch in rows:
        key = ((start - start_ms) // bucket_ms, dims)
        cell = cells.get(key)
        if cell is None:
            cells[key] = [count, 1, last_batch, revision]
        else:
            cell[0] += count
            cell[1] += 1
            if last_batch > cell[2]:
                cell[2] = last_batch
            if revision > cell[3]:
                cell[3] = revision
    group_of: dict[str, tuple[str, ...] | None] = {}  # dims text -> group, None when filtered out
    out = []
    for (bucket, dims), (count, n, last_batch, revision) in cells.items():
        if dims in group_of:
            group = group_of[dims]
        else:
            group = group_of[dims] = filtered_group(json.loads(dims), group_by, filters)
        if group is not None:
            out.append(BucketStats(group, bucket, count, revision, last_batch=last_batch, rows=n))
    return out


def _sums(store, stream, pane_ms, plan, start_ms, group_by, filters, value_field) -> list[BucketStats]:
    sums: list[BucketStats] = []
    for seg, proj, bucket in plan:
        sums += store.aggregate_tier(stream, seg.granule_ms, proj, seg.start_ms, seg.end_ms, origin_ms=start_ms,
                                     bucket_ms=bucket, group_by=group_by, filters=filters, value_field=value_field,
                                     pane_ms=pane_ms)
    return sums


def _fingerprints(sums: list[BucketStats], start_ms: int, end_ms: int, step_ms: int,
                  window_ms: int) -> dict[tuple[str, ...], list[tuple[int, int, int, int]]]:
    """Per group, per window, sums over its buckets of: events, rows, each bucket's newest batch and
    highest revision. A bucket's newest batch and revision only grow, and a dropped row changes the
    rows, so any change to a window's rows changes its fingerprint.

    Over the buckets that hold rows only (prefix sums of them, each window's first and last found by
    a binary search): O((buckets with rows + windows) log), whatever the window's length. Dense
    arrays of every bucket in the range cost that range: a 36 500-day window over 10 s buckets
    was 315 M of them, gigabytes and a minute for a single query."""
    n_points = len(window_points(start_ms, end_ms, step_ms))
    bucket_ms = math.gcd(step_ms, window_ms)
    stride, width = (1, 1) if n_points == 1 else (step_ms // bucket_ms, window_ms // bucket_ms)
    n_buckets = (n_points - 1) * stride + width
    if not sums:
        return {}
    index: dict[tuple[str, ...], int] = {}
    groups = np.array([index.setdefault(b.group, len(index)) for b in sums], dtype=np.int64)
    # One window: every bucket lands in it. Else a bucket outside [0, n_buckets) is in none.
    buckets = np.zeros(len(sums), np.int64) if n_points == 1 else np.array([b.bucket for b in sums], dtype=np.int64)
    inside = (buckets >= 0) & (buckets < n_buckets)
    span = n_buckets + 1  # a group's keys: group * span + bucket, all groups' in one sorted array
    keys = groups[inside] * span + buckets[inside]
    values = np.array([(b.count, b.rows, b.last_batch, b.revision) for b in sums], dtype=np.int64).reshape(-1, 4)
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    prefix = np.concatenate([np.zeros((1, 4), np.int64), np.cumsum(values[inside][order], axis=0)])
    lo = np.arange(len(index), dtype=np.int64)[:, None] * span + np.arange(n_points, dtype=np.int64) * stride
    first, last = np.searchsorted(keys, lo), np.searchsorted(keys, lo + width)
    windows = (prefix[last] - prefix[first]).tolist()  # [group][window] -> the four sums
    return {group: list(map(tuple, windows[g])) for group, g in index.items()}


def _empty_points(stat, quantile, value_field, distinct_field, lo, hi, step_ms, window_ms, pane_ms,
                  watermark_ms) -> list[Point]:
    """The empty points of the windows starting in [lo, hi): as many as the query asked (it was
    checked against its own limit), not refused at the default limit (query_max_points is
    configurable)."""
    return rollup([], stat=stat, quantile=quantile, value_field=value_field, distinct_field=distinct_field,
                  start_ms=lo, end_ms=hi, step_ms=step_ms, window_ms=window_ms, pane_ms=pane_ms,
                  watermark_ms=watermark_ms, max_points=len(window_points(lo, hi, step_ms)))[0].points


__all__ = ["query_series"]

"""Declared views computed ahead of their first query, so their final points are kept.

A cold query of a shape no process has computed merges every sketch of its range: ~65 ms of
CPU for a day of 1-minute p99s over a 1 h sliding window (about three KLL merges per point),
~35 ms for a day of 1-minute percentiles. The same query over points kept in the store
(store/final_points.py) loads them and sums their fingerprints: ~18 ms. The views a dashboard
declares (dashboard/views.py) are known before anyone opens them, so the service computes them
in the background (api/point_warmer.py, in the snapshot worker where there is one) and keeps
their final points; a browser's, a replica's or a restarted process's first query then only
loads them.

Nothing here changes an answer: the points are computed by the one query path
(query.compute → store/series.py) and kept by the point cache with the fingerprint of their
window's rows, so a revision of a pane or tier row the window covers (a straggler, a
correction) makes the kept point stale: the next query computes it again, and the next warm
replaces it in the store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from catalog.model import RATIO_STATS
from query.compute import compute
from query.model import Query
from store import PaneStore
from store.point_cache import PointCache
from store.retention_clock import retention_now_ms


def kept_part(q: Query) -> Query | None:
    """The query's stats whose answers a point cache keeps: all but ratios (each computed from two
    sums of the store's at every query, nothing kept: query.compute.ratio_series). None when it
    asks none of them."""
    keep = [(s, qt) for s, qt in zip(q.stats, q.quantiles) if s not in RATIO_STATS]
    if not keep:
        return None
    return replace(q, stats=tuple(s for s, _ in keep), quantiles=tuple(qt for _, qt in keep))


def warm(store: PaneStore, queries: Iterable[Query], *, now_ms: int, watermarks: Mapping[str, int],
         max_points: int, cache: PointCache) -> int:
    """Compute each query's kept part (kept_part) over its range at `now_ms` through `cache`, which
    keeps the final points (sketch stats, by window) and the chunks of final windows (grouped or
    not: store/series.py), in its backing store too if it has one; how many queries were computed.
    A query whose points are already kept and unchanged costs its fingerprints' sums only."""
    done = 0
    kept_at = retention_now_ms(store, now_ms)
    for q in filter(None, map(kept_part, queries)):
        lo, hi = q.range_at(now_ms)
        # Read as REST reads it at now_ms (only rows retention keeps there): the same plan, so the
        # same fingerprints, and the points kept are the ones its query would reuse.
        compute(store, q, lo, hi, watermark_ms=watermarks.get(q.stream), max_points=max_points, cache=cache,
                now_ms=kept_at)
        done += 1
    if cache.backing is not None:
        cache.backing.flush()  # written before the next warm reads the store again
    return done

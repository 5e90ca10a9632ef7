"""Which stored rows answer a query: the coarsest granule and the narrowest projection that
can, with finer granules only at the ragged edges. Pure: no I/O, no clock.

A query's windows are built from buckets of gcd(step, window) (see store.rollup). A row may
feed a bucket only if it lies wholly inside it, so a granule is usable when it divides the
bucket and the range starts on it; a one-window query (what alert rules ask) has a single
bucket, and any granule fits inside it: its range is covered by the coarsest rows that fit,
finer rows filling the edges (a 1 h window starting at 10:00:10 reads 59 one-minute rows and
the 10-second panes of its first and last minute).

Each granule is read only where retention still keeps all of its rows (kept_from_ms): a span
older than a finer granule's `keep` is read from a coarser granule kept there that fits the
buckets, and what no kept granule can answer exactly is the plan's `missing` (the query
refuses it: query/model.py; docs/event-time.md, "Tiers and retention").

A folded granule (store/tier_folds.py: the demo's 1 h) is read only for rows ending by the
stream's fold point: the hour under way is read from finer rows.

Each segment reads the narrowest projection kept at its granule that covers the query's
group-by and filters: at the pane granule only the total is kept besides the panes, so a
grouped query's pane-granule edges read the panes themselves (few rows: edges are short).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from store import tier_folds
from store.tiers import ALL_DIMS, TierLayout, covers


@dataclass(frozen=True)
class Segment:
    granule_ms: int
    start_ms: int  # rows starting in [start_ms, end_ms)
    end_ms: int
    proj: str = ALL_DIMS  # the projection its rows are read in (store.tiers)


@dataclass(frozen=True)
class ReadPlan:
    segments: tuple[Segment, ...]
    # Spans no kept granule fitting the buckets can answer (a finer granule's rows there may be
    # dropped already); spans before every granule's horizon (past all retention) are not listed.
    missing: tuple[tuple[int, int], ...] = ()


def keep_of(layout: TierLayout, granule_ms: int) -> int:
    """How long rows of a granule are kept: the panes (and pane-granule rows) for the retention."""
    return dict(layout.granules).get(granule_ms, layout.retention_ms)


def answerable_ms(layout: TierLayout | None, pane_ms: int, step_ms: int, window_ms: int) -> int | None:
    """How long after a window's start some granule that can answer it is still kept: the longest
    keep of the granules dividing its buckets (gcd of step and window), plus the window. A point
    kept longer is never read again (store/final_points.py). None: no tiers, nothing known."""
    if layout is None or layout.pane_ms != pane_ms:
        return None
    bucket = math.gcd(step_ms, window_ms)
    return max(keep_of(layout, g) for g in layout.granules_ms() if bucket % g == 0) + window_ms


def kept_from_ms(layout: TierLayout, granule_ms: int, now_ms: int) -> int:
    """The earliest start from which every row of the granule is surely still kept at now_ms.

    Retention drops a granule's rows ending at or before batch_now - keep
    (store.commit_plan.tier_horizons, retention_horizons), batch_now being a committed batch's
    clock: the callers pass the later of their clock and the newest batch's
    (store.retention_clock), so batch_now - keep <= now_ms - keep. A
    row straddling now_ms - keep may be gone at a later batch_now already: counted as gone too
    (conservative), so only rows starting at or after the horizon are read."""
    horizon = now_ms - keep_of(layout, granule_ms)
    return horizon + (-horizon) % granule_ms


def plan_read(layout: TierLayout | None, pane_ms: int, start_ms: int, span_end_ms: int, step_ms: int,
              window_ms: int, n_points: int, needed: Iterable[str], now_ms: int | None = None,
              folded_ms: int | None = None) -> ReadPlan:
    """The rows to read for windows covering [start_ms, span_end_ms), grouped or filtered by `needed`;
    with now_ms, only rows retention keeps at now_ms (None: every granule read as if kept forever).
    folded_ms: the stream's fold point (store/tier_folds.py): a folded granule's rows are read only
    where they end by it, finer rows answer after (None: every row holds all its panes)."""
    if layout is None or layout.pane_ms != pane_ms:
        return ReadPlan((Segment(pane_ms, start_ms, span_end_ms),))
    needed = tuple(needed)
    granules = usable_granules(layout, pane_ms, start_ms, step_ms, window_ms, n_points, needed)
    folded = set(tier_folds.folded(layout, folded_ms))
    if now_ms is None:
        segments = (cover(start_ms, span_end_ms, sorted(granules, reverse=True)) if not folded else
                    cover_kept(start_ms, span_end_ms, [(g, None, folded_ms if g in folded else None)
                                                       for g in sorted(granules, reverse=True)])[0])
        return ReadPlan(tuple(replace(seg, proj=granules[seg.granule_ms]) for seg in segments))
    kept = [(g, kept_from_ms(layout, g, now_ms), folded_ms if g in folded else None)
            for g in sorted(granules, reverse=True)]
    segments, missing = cover_kept(start_ms, span_end_ms, kept)
    # Past every granule's horizon nothing is kept at any step: that is the stream's retention, not
    # a step too fine, so it is not missing.
    gone = min(kept_from_ms(layout, g, now_ms) for g in layout.granules_ms())
    missing = [(max(lo, gone), hi) for lo, hi in missing if hi > gone]
    return ReadPlan(tuple(replace(seg, proj=granules[seg.granule_ms]) for seg in segments), tuple(missing))


def usable_granules(layout: TierLayout, pane_ms: int, start_ms: int, step_ms: int, window_ms: int,
                    n_points: int, needed: tuple[str, ...]) -> dict[int, str]:
    """The granules whose rows fit the query's buckets, each with its narrowest projection covering `needed`."""
    granules = layout.granules_ms()
    if n_points > 1:
        bucket = math.gcd(step_ms, window_ms)
        granules = [g for g in granules if bucket % g == 0 and start_ms % g == 0] or [pane_ms]
    # Each granule's narrowest projection that covers the query: a group-by the pane granule
    # keeps no rows for reads the panes (all dimensions) there (store.tiers.TierLayout.tiers).
    # A granule without such a projection (a tier with all_dimensions: false) is left to finer rows.
    proj = {g: min((p for p in layout.projections_at(g) if covers(p, needed)), key=_width, default=None)
            for g in granules}
    return {g: p for g, p in proj.items() if p is not None}


def finest_kept_granule(layout: TierLayout | None, pane_ms: int, start_ms: int, needed: Iterable[str],
                        now_ms: int) -> int:
    """The finest granule kept from start_ms on with a projection covering `needed`: the smallest
    step (and bucket) that can answer a range starting there. A range reaching back past every
    granule's horizon is measured from the earliest one (nothing is kept before it at any step:
    plan_read does not count that span missing either). The pane without tiers."""
    if layout is None or layout.pane_ms != pane_ms:
        return pane_ms
    needed = tuple(needed)
    start_ms = max(start_ms, min(kept_from_ms(layout, g, now_ms) for g in layout.granules_ms()))
    # Kept from within the first row of its own (the range starting at the granule's horizon, not
    # aligned to it): that sliver is the edge of retention (query.model.check_kept lets it be).
    kept = [g for g in layout.granules_ms()
            if kept_from_ms(layout, g, now_ms) < start_ms + g
            and any(covers(p, needed) for p in layout.projections_at(g))]
    return min(kept, default=pane_ms)


def cover_kept(start_ms: int, end_ms: int, granules: list[tuple[int, int | None, int | None]]
               ) -> tuple[list[Segment], list[tuple[int, int]]]:
    """cover(), each granule only from its kept_from on and, where it is folded, only for rows
    ending by its fold point ((granule, kept_from, folded_ms), coarsest first; None: no bound):
    the segments, and the spans no granule kept there can cover.

    The row a fold point falls in holds some of its panes only, and a fold may add more between a
    query's reads: it is never read, finer rows answer for it. A row ending by the point never
    takes a fold's panes (only stragglers', as every row does), so reading it is safe whenever."""
    if start_ms >= end_ms:
        return [], []
    if not granules:
        return [], [(start_ms, end_ms)]
    (g, kept_from, folded_ms), finer = granules[0], granules[1:]
    lo = start_ms if kept_from is None else max(start_ms, kept_from)
    lo += (-lo) % g
    hi = end_ms - end_ms % g
    if folded_ms is not None:
        hi = min(hi, folded_ms - folded_ms % g)
    if not finer:
        if lo >= end_ms:
            return [], [(start_ms, end_ms)]
        # The finest granule divides both ends (cover's contract), so [lo, end) is whole rows.
        return [Segment(g, lo, end_ms)], [(start_ms, lo)] if lo > start_ms else []
    if lo >= hi:
        return cover_kept(start_ms, end_ms, finer)
    left, left_missing = cover_kept(start_ms, lo, finer)
    right, right_missing = cover_kept(hi, end_ms, finer)
    return [*left, Segment(g, lo, hi), *right], [*left_missing, *right_missing]


def cover(start_ms: int, end_ms: int, granules: list[int]) -> list[Segment]:
    """[start_ms, end_ms) as segments of the coarsest granules whose rows fit inside it,
    finer granules at the edges (granules coarsest first; the last one must divide both ends)."""
    if start_ms >= end_ms:
        return []
    g, finer = granules[0], granules[1:]
    lo = start_ms + (-start_ms) % g
    hi = end_ms - end_ms % g
    if not finer:
        return [Segment(g, start_ms, end_ms)]
    if lo >= hi:
        return cover(start_ms, end_ms, finer)
    return [*cover(start_ms, lo, finer), Segment(g, lo, hi), *cover(hi, end_ms, finer)]


def _width(proj: str) -> tuple[int, int]:
    """Fewer dimensions, fewer rows: the total first, all dimensions last."""
    if proj == ALL_DIMS:
        return (1, 0)
    return (0, proj.count(",") + 1 if proj else 0)

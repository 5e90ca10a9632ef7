"""Which stored rows answer a query: the coarsest granule and the narrowest projection that
can, with finer granules only at the ragged edges. Pure: no I/O, no clock.

A query's windows are built from buckets of gcd(step, window) (see store.rollup). A row may
feed a bucket only if it lies wholly inside it, so a granule is usable when it divides the
bucket and the range starts on it; a one-window query (what alert rules ask) has a single
bucket, and any granule fits inside it: its range is covered by the coarsest rows that fit,
finer rows filling the edges (a 1 h window starting at 10:00:10 reads 59 one-minute rows and
the 10-second panes of its first and last minute).

Each segment reads the narrowest projection kept at its granule that covers the query's
group-by and filters: at the pane granule only the total is kept besides the panes, so a
grouped query's pane-granule edges read the panes themselves (few rows: edges are short).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

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


def plan_read(layout: TierLayout | None, pane_ms: int, start_ms: int, span_end_ms: int, step_ms: int,
              window_ms: int, n_points: int, needed: Iterable[str]) -> ReadPlan:
    """The rows to read for windows covering [start_ms, span_end_ms), grouped or filtered by `needed`."""
    if layout is None or layout.pane_ms != pane_ms:
        return ReadPlan((Segment(pane_ms, start_ms, span_end_ms),))
    needed = tuple(needed)
    granules = layout.granules_ms()
    if n_points > 1:
        bucket = math.gcd(step_ms, window_ms)
        granules = [g for g in granules if bucket % g == 0 and start_ms % g == 0] or [pane_ms]
    # Each granule's narrowest projection that covers the query: a group-by the pane granule
    # keeps no rows for reads the panes (all dimensions) there (store.tiers.TierLayout.tiers).
    # A granule without such a projection (a tier with all_dimensions: false) is left to finer rows.
    proj = {g: min((p for p in layout.projections_at(g) if covers(p, needed)), key=_width, default=None)
            for g in granules}
    granules = [g for g in granules if proj[g] is not None]
    return ReadPlan(tuple(replace(seg, proj=proj[seg.granule_ms])
                          for seg in cover(start_ms, span_end_ms, sorted(granules, reverse=True))))


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

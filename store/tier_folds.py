"""Folding: the rows of a stream's coarser tiers brought up to date as its time passes its panes,
not by every batch. Pure: no I/O, no clock.

Every batch merges its partials into the panes, the pane-granule totals and the rows of the
stream's first tier (the demo's 1 m). The rows of the tiers coarser than that (the demo's 1 h:
TierLayout.folded_granules) hold exactly the panes that start before the stream's fold point,
which the store keeps beside them (`tier_folds`, in the batch's transaction):

- a batch merges into those rows only its partials of panes before the point (stragglers,
  corrections, a backlog sent late), as before;
- when the stream's newest event less its allowed lateness passes more panes, the batch moves
  the point there (a pane boundary) and merges those panes into the rows once: as stored before
  the batch (fold_deltas), its own partials of them with its other deltas (store/tier_fold_store.py).

Why: the demo's hour row of each dimension combination was rewritten by every batch with one of
its events, about once a second at 20 000 events/s, and its sketches grow over the hour (twenty
minutes in: 3.4 KB on average and up to 14 KB, a pane's 1 KB). Folded, a row is written once a
pane of time: `python -m bench.steady_commits --stores sqlite --mix --seconds 300`, commit median
277 -> 132 ms (docs/benchmarks.md, "Session 95").

Queries read a folded granule's rows only where they end by the point (store/planner.py): the
row the point falls in lacks its later panes, and finer rows answer for it. So the first tier's
rows must outlive a row under way (foldable), and a stream without events moves its point by the
pipeline's clock: a quiet stream's last hour is read from its row again before the minutes under
it go. A stream without a point (a store from before, tiers just rebuilt from the panes) has
every stored pane in its rows: its next commit merges as before and sets the point past every
pane it holds (first_fold_point).

Shards: a stream's dimension combinations fall in SHARDS groups (shard: the CRC-32 of their
text), each with its own point, an eighth of a pane apart; the store keeps one fold clock per
stream, from which every shard's point follows (shard_points). Why: with one point, every
combination's hour row was folded in the same batch, once a pane of time, and that batch took
~300-500 ms more than the others (the demo's 2 200 request combinations a pane, their hour rows
growing over the hour): a batch in thirty, most of the demo's p99 freshness above its median.
Sharded, each batch that moves a shard folds an eighth of them. Queries read a folded row only
where it ends by the point of the last shard (complete_point). A point stored before shards, on
a pane boundary, is every shard's.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Iterable

from store.tiers import TierDelta, TierKey, TierLayout, stored_pane_deltas


def foldable(layout: TierLayout, lateness_ms: int | None) -> bool:
    """Whether a stream's coarser tiers are folded: while a row of theirs is under way (up to its
    granule and the lateness behind the stream's time, or the pipeline's clock), queries read its
    time from the first tier's rows, so those must be kept for that long, and a granule more (a
    stream whose first tier is kept 30 minutes, under hour rows, is not folded). A stream the
    pipeline no longer configures (no lateness) is not."""
    coarse = layout.folded_granules()
    if not coarse or lateness_ms is None:
        return False
    return layout.granules[0][1] >= lateness_ms + 2 * layout.pane_ms + 2 * max(coarse)  # a pane: the shards' spread


def folded(layout: TierLayout, point: int | tuple[int, ...] | None) -> tuple[int, ...]:
    """The granules a batch merges only its partials before `point` into (one, or each shard's;
    none without a point)."""
    return () if point is None else layout.folded_granules()


SHARDS = 8  # groups of dimension combinations folded at their own points (the module's docstring)


@functools.lru_cache(maxsize=1 << 16)
def shard(dims_key: str) -> int:
    """The shard of a dimension combination (its dims_key text): the same in every process and run."""
    return zlib.crc32(dims_key.encode()) % SHARDS


def _floor(ms: int, pane_ms: int) -> int:
    return ms - ms % pane_ms


def shard_points(layout: TierLayout, clock_ms: int) -> tuple[int, ...]:
    """Each shard's point for a stream's fold clock: shard s an (SHARDS - 1 - s)-th eighth of a pane
    ahead of the clock, on a pane boundary (so a clock on a boundary is every shard's point)."""
    step = layout.pane_ms // SHARDS
    return tuple(_floor(clock_ms + (SHARDS - 1 - s) * step, layout.pane_ms) for s in range(SHARDS))


def complete_point(layout: TierLayout, clock_ms: int) -> int:
    """The point every shard has passed (the last shard's): a folded row ending by it holds all its panes."""
    return _floor(clock_ms, layout.pane_ms)


def fold_clock(layout: TierLayout, clock_ms: int, newest_ms: int | None, lateness_ms: int) -> int | None:
    """Where the stream's fold clock moves after a batch: its newest event (or, for a stream without
    events in the batch, the pipeline's clock) less the allowed lateness, less the shards' spread,
    so that the first shard's point is where one point was (on the pane boundary before it: the
    panes before it take few events more); None where no shard's point moves. A final window ends
    by the first shard's point (the watermark is at most the newest event less the lateness, and
    held back by slow partitions); the last shard's is at most a pane before it, and the first
    tier outlives that (foldable): a window between them is read from the first tier's rows."""
    if newest_ms is None or not layout.folded_granules():
        return None
    to = newest_ms - lateness_ms - (SHARDS - 1) * (layout.pane_ms // SHARDS)
    return to if to > clock_ms and shard_points(layout, to) != shard_points(layout, clock_ms) else None


def passed(points_before: tuple[int, ...], points_after: tuple[int, ...]):
    """Whether a stored pane (start, dims_key text) is one a move of the points passes."""
    def keep(start_ms: int, key: str) -> bool:
        s = shard(key)
        return points_before[s] <= start_ms < points_after[s]
    return keep


def after(points: tuple[int, ...]):
    """Whether a stored pane (start, dims_key text) is at or after its shard's point."""
    return lambda start_ms, key: start_ms >= points[shard(key)]


def first_fold_point(layout: TierLayout, newest_pane_start_ms: int | None) -> int | None:
    """The point of a stream whose folded rows hold every stored pane: past the newest one (None:
    no pane yet, the next batch's commit sets it)."""
    if newest_pane_start_ms is None or not layout.folded_granules():
        return None
    return newest_pane_start_ms + layout.pane_ms


def fold_deltas(panes: Iterable, layout: TierLayout) -> dict[TierKey, TierDelta]:
    """The folded granules' deltas of stored panes (store.panes.Pane) as the point passes them."""
    return stored_pane_deltas(panes, layout, frozenset(layout.folded_granules()))

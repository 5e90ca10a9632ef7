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
"""

from __future__ import annotations

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
    return layout.granules[0][1] >= lateness_ms + layout.pane_ms + 2 * max(coarse)


def folded(layout: TierLayout, folded_ms: int | None) -> tuple[int, ...]:
    """The granules a batch merges only its partials before `folded_ms` into (none without a point)."""
    return () if folded_ms is None else layout.folded_granules()


def fold_point(layout: TierLayout, folded_ms: int, newest_ms: int | None, lateness_ms: int) -> int | None:
    """Where the stream's point moves after a batch: its newest event (or, for a stream without
    events in the batch, the pipeline's clock) less the allowed lateness, on a pane boundary (the
    panes before it take few events more); None where that is not past `folded_ms`. The watermark
    is never past it (it is at most the newest event less the lateness, and held back by slow
    partitions), so a final window never reads a folded row that lacks some of its panes."""
    if newest_ms is None or not layout.folded_granules():
        return None
    point = newest_ms - lateness_ms
    point -= point % layout.pane_ms
    return point if point > folded_ms else None


def first_fold_point(layout: TierLayout, newest_pane_start_ms: int | None) -> int | None:
    """The point of a stream whose folded rows hold every stored pane: past the newest one (None:
    no pane yet, the next batch's commit sets it)."""
    if newest_pane_start_ms is None or not layout.folded_granules():
        return None
    return newest_pane_start_ms + layout.pane_ms


def fold_deltas(panes: Iterable, layout: TierLayout) -> dict[TierKey, TierDelta]:
    """The folded granules' deltas of stored panes (store.panes.Pane) as the point passes them."""
    return stored_pane_deltas(panes, layout, frozenset(layout.folded_granules()))

"""The tiers' fold points (store/tier_folds.py) as both stores keep them, and a commit's fold:
SQL over a DB-API cursor (`p` is the backend's placeholder), in the batch's transaction."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from store import tier_folds
from store.tiers import TierDelta, TierKey, TierLayout


def stored_clocks(cursor) -> dict[str, int]:
    """Every stream's fold clock (store/tier_folds.py shard_points; a stream without one has every
    stored pane in its rows)."""
    return dict(cursor.execute("SELECT stream, folded_ms FROM tier_folds").fetchall())


def stored_clock(cursor, p: str, stream: str) -> int | None:
    """A stream's fold clock (None: every stored pane is in its rows)."""
    row = cursor.execute(f"SELECT folded_ms FROM tier_folds WHERE stream = {p}", (stream,)).fetchone()
    return None if row is None else row[0]


@dataclass(frozen=True)
class Fold:
    """A commit's fold, decided before it writes its panes (plan_fold)."""

    # Per stream with a point after the batch: each shard's, where its partials split (plan_batch's
    # `folds`). The folded tiers take its partials before them, including those of the panes passed.
    split: dict[str, tuple[int, ...]]
    # Per stream: the folded tiers' deltas of the panes the point passes, as stored before the batch.
    deltas: dict[str, dict[TierKey, TierDelta]]
    # Per stream whose fold clock moves: where (None: no longer folded).
    moved: dict[str, int | None]
    # The foldable streams without a point: it goes past their newest pane once written (first_points).
    unset: tuple[str, ...]


def plan_fold(newest: Mapping[str, int | None], layouts: Mapping[str, TierLayout], clocks: Mapping[str, int],
              lateness_ms: Mapping[str, int], read_panes: Callable[..., Sequence],
              clock_ms: int | None = None) -> Fold:
    """Per stream whose fold clock moves (`newest`: the streams the batch updates, by their newest
    event after it; the other streams with a fold clock in `clocks` (stored_clocks), by `clock_ms`,
    the batch's clock), where it moves and the panes its shards' points pass (`read_panes(stream,
    from, to, keep)`: the stored panes starting in [from, to) that keep(start, dims text) takes,
    read before the batch writes).

    Why before: the batch's partials of those panes reach the folded rows through the plan (split at
    the new points), and the panes as stored before it through these deltas; together exactly the
    panes as they are after the batch. Reading them after the write made a backlog's batch decode
    every pane it had just written: `python -m bench.day_of_data`'s commit 5.8 -> 8.2 s."""
    split: dict[str, tuple[int, ...]] = {}
    deltas: dict[str, dict[TierKey, TierDelta]] = {}
    moved: dict[str, int | None] = {}
    unset = []
    for stream in sorted(newest.keys() | clocks.keys()):
        layout, stored = layouts.get(stream), clocks.get(stream)
        if layout is None:
            continue
        if not tier_folds.foldable(layout, lateness_ms.get(stream)):
            if stored is not None:  # its lateness or tiers changed: the rows take every pane after the points
                before = tier_folds.shard_points(layout, stored)
                deltas[stream] = tier_folds.fold_deltas(
                    read_panes(stream, min(before), 2**62, tier_folds.after(before)), layout)
                moved[stream] = None
            continue
        if stored is None:  # every pane so far is in the rows: the point goes past them
            unset.append(stream)
            continue
        latest = newest.get(stream)
        to = tier_folds.fold_clock(layout, stored, clock_ms if latest is None else latest, lateness_ms[stream])
        before = tier_folds.shard_points(layout, stored)
        split[stream] = before if to is None else tier_folds.shard_points(layout, to)
        if to is None:
            continue
        deltas[stream] = tier_folds.fold_deltas(
            read_panes(stream, min(before), max(split[stream]), tier_folds.passed(before, split[stream])), layout)
        moved[stream] = to
    return Fold(split, {stream: d for stream, d in deltas.items() if d}, moved, tuple(unset))


def first_points(cursor, p: str, streams: Iterable[str], layouts: Mapping[str, TierLayout]) -> dict[str, int]:
    """The point of each stream whose folded rows hold every stored pane (Fold.unset): past its
    newest pane, read once the batch has written its own."""
    points = {}
    for stream in streams:
        top = cursor.execute(f"SELECT MAX(start_ms) FROM panes WHERE stream = {p}", (stream,)).fetchone()
        first = tier_folds.first_fold_point(layouts[stream], top[0])
        if first is not None:
            points[stream] = first
    return points


def save_points(cursor, p: str, points: Mapping[str, int | None]) -> None:
    """Each stream's new point (None: no longer folded)."""
    cursor.executemany(f"INSERT INTO tier_folds (stream, folded_ms) VALUES ({p}, {p})"
                       " ON CONFLICT (stream) DO UPDATE SET folded_ms = excluded.folded_ms",
                       [(stream, point) for stream, point in points.items() if point is not None])
    cursor.executemany(f"DELETE FROM tier_folds WHERE stream = {p}",
                       [(stream,) for stream, point in points.items() if point is None])


def forget(cursor, p: str, stream: str) -> None:
    """A stream's tiers rebuilt from every pane (or dropped): no point until its next commit."""
    cursor.execute(f"DELETE FROM tier_folds WHERE stream = {p}", (stream,))

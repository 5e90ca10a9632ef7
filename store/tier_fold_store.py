"""The tiers' fold points (store/tier_folds.py) as both stores keep them, and a commit's fold:
SQL over a DB-API cursor (`p` is the backend's placeholder), in the batch's transaction."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from store import tier_folds
from store.tiers import TierDelta, TierKey, TierLayout


def stored_points(cursor) -> dict[str, int]:
    """Every stream's fold point (a stream without one has every stored pane in its rows)."""
    return dict(cursor.execute("SELECT stream, folded_ms FROM tier_folds").fetchall())


def stored_point(cursor, p: str, stream: str) -> int | None:
    row = cursor.execute(f"SELECT folded_ms FROM tier_folds WHERE stream = {p}", (stream,)).fetchone()
    return None if row is None else row[0]


def fold(cursor, p: str, streams: Iterable, layouts: Mapping[str, TierLayout], points: Mapping[str, int],
         lateness_ms: Mapping[str, int], read_panes: Callable[[str, int, int], Sequence], clock_ms: int | None = None
         ) -> tuple[dict[str, dict[TierKey, TierDelta]], dict[str, int | None]]:
    """A commit's fold, after its panes are written: per stream whose point moves (`streams`: the
    plan's StreamUpdates, by their newest event; the other streams with a point, by `clock_ms`, the
    batch's clock), the folded tiers' deltas of the panes it passes (read with
    `read_panes(stream, from, to)`), and each such stream's new point (None: no longer folded,
    every pane after the point merged into its rows)."""
    newest = {update.stream: update.max_event_ms for update in streams}
    deltas: dict[str, dict[TierKey, TierDelta]] = {}
    moved: dict[str, int | None] = {}
    for stream in sorted(newest.keys() | points.keys()):
        layout, point = layouts.get(stream), points.get(stream)
        if layout is None:
            continue
        if not tier_folds.foldable(layout, lateness_ms.get(stream)):
            if point is not None:  # its lateness or tiers changed: the rows take every pane after the point
                deltas[stream] = tier_folds.fold_deltas(read_panes(stream, point, 2**62), layout)
                moved[stream] = None
            continue
        if point is None:  # every pane so far is in the rows: the point goes past them
            top = cursor.execute(f"SELECT MAX(start_ms) FROM panes WHERE stream = {p}", (stream,)).fetchone()
            first = tier_folds.first_fold_point(layout, top[0])
            if first is not None:
                moved[stream] = first
            continue
        latest = newest.get(stream)
        to = tier_folds.fold_point(layout, point, clock_ms if latest is None else latest, lateness_ms[stream])
        if to is None:
            continue
        folded = tier_folds.fold_deltas(read_panes(stream, point, to), layout)
        if folded:
            deltas[stream] = folded
        moved[stream] = to
    return {stream: d for stream, d in deltas.items() if d}, moved


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

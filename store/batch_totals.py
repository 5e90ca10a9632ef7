"""Each pipeline's committed batches summed as they are committed: how many, the events they read,
the newest batch id and commit time (PaneStore.progress's `batches`, `events_read`, `last_batch_id`
and `last_commit_ms`).

Summed from the `batches` table at every read, they cost a scan of every batch the pipeline ever
committed (~30 ms at a day of one batch a second, ~200 ms at a week), and progress is read every
second by the websocket's pipeline feed and by every batch with sessions or a window join. A
batch's commit adds itself to its pipeline's row in the same transaction (both stores serialize
commits: SQLite's BEGIN IMMEDIATE, PostgreSQL's commit lock), so the row is exactly the sums of
the committed batches. A row whose newest batch is not the pipeline's newest in `batches` (an
index lookup) is not trusted: batches committed before this table existed, or by a Sketchboard
from before it sharing the store (a rolling upgrade, a downgrade and back), which adds none. Such
a pipeline is read by a scan of its batches, and its next commit makes its row again from them:
no migration step, nothing that a commit racing a store's opening could get wrong.

Both stores run these statements; `mark` is their parameter placeholder ("?" or "%s")."""

from __future__ import annotations

from typing import Any, NamedTuple


class Totals(NamedTuple):
    last_batch_id: int | None
    last_commit_ms: int | None
    batches: int
    events_read: int


def _scan(cursor: Any, pipeline: str, mark: str) -> Totals:
    cursor.execute("SELECT MAX(batch_id), MAX(committed_at_ms), COUNT(*), COALESCE(SUM(events_read), 0)"
                   f" FROM batches WHERE pipeline = {mark}", (pipeline,))
    last_id, last_at, batches, events = cursor.fetchone()
    return Totals(last_id, last_at, int(batches), int(events))


def newest(cursor: Any, pipeline: str, mark: str) -> int | None:
    """The pipeline's newest committed batch id (one lookup in the primary key of `batches`)."""
    cursor.execute(f"SELECT MAX(batch_id) FROM batches WHERE pipeline = {mark}", (pipeline,))
    return cursor.fetchone()[0]


def _trusted(cursor: Any, pipeline: str, mark: str) -> Totals | None:
    """The pipeline's row while it names its newest batch (module docstring), else None."""
    cursor.execute("SELECT last_batch_id, last_commit_ms, batches, events_read FROM batch_totals"
                   f" WHERE pipeline = {mark}", (pipeline,))
    row = cursor.fetchone()
    return Totals(*row) if row is not None and row[0] == newest(cursor, pipeline, mark) else None


def read(cursor: Any, pipeline: str, mark: str) -> Totals:
    """The pipeline's totals: its row while it names the newest batch, else a scan of its batches."""
    return _trusted(cursor, pipeline, mark) or _scan(cursor, pipeline, mark)


def add(cursor: Any, pipeline: str, batch_id: int, committed_at_ms: int, events_read: int, mark: str,
        greatest: str) -> None:
    """In a batch's commit transaction, BEFORE its row goes into `batches`: the batch added to its
    pipeline's totals (`greatest`: the two-argument maximum, SQLite's MAX or PostgreSQL's GREATEST),
    the row made again from the batches before it where it is missing or behind them."""
    if _trusted(cursor, pipeline, mark) is not None:
        cursor.execute(f"UPDATE batch_totals SET batches = batches + 1, events_read = events_read + {mark},"
                       f" last_batch_id = {greatest}(last_batch_id, {mark}),"
                       f" last_commit_ms = {greatest}(last_commit_ms, {mark}) WHERE pipeline = {mark}",
                       (events_read, batch_id, committed_at_ms, pipeline))
        return
    before = _scan(cursor, pipeline, mark)
    cursor.execute(f"DELETE FROM batch_totals WHERE pipeline = {mark}", (pipeline,))
    cursor.execute(f"INSERT INTO batch_totals (pipeline, batches, events_read, last_batch_id, last_commit_ms)"
                   f" VALUES ({mark}, {mark}, {mark}, {mark}, {mark})",
                   (pipeline, before.batches + 1, before.events_read + events_read,
                    batch_id if before.last_batch_id is None else max(before.last_batch_id, batch_id),
                    committed_at_ms if before.last_commit_ms is None else max(before.last_commit_ms, committed_at_ms)))

"""Each pipeline's committed batches summed as they are committed: how many, the events they read,
the newest batch id and commit time (PaneStore.progress's `batches`, `events_read`, `last_batch_id`
and `last_commit_ms`).

Summed from the `batches` table at every read, they cost a scan of every batch the pipeline ever
committed (~30 ms at a day of one batch a second, ~200 ms at a week), and progress is read every
second by the websocket's pipeline feed and by every batch with sessions or a window join. A
batch's commit adds itself to its pipeline's row in the same transaction (both stores serialize
commits: SQLite's BEGIN IMMEDIATE, PostgreSQL's commit lock), so the row is exactly the sums of
the committed batches. A pipeline without a row (its batches were committed before this table
existed) gets one from a scan of its batches at its next commit, and is read by that scan until
then: no migration step, nothing that a commit racing a store's opening could get wrong.

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


def read(cursor: Any, pipeline: str, mark: str) -> Totals:
    """The pipeline's totals: its row, or (a pipeline with none yet) a scan of its batches."""
    cursor.execute("SELECT last_batch_id, last_commit_ms, batches, events_read FROM batch_totals"
                   f" WHERE pipeline = {mark}", (pipeline,))
    row = cursor.fetchone()
    return _scan(cursor, pipeline, mark) if row is None else Totals(*row)


def add(cursor: Any, pipeline: str, batch_id: int, committed_at_ms: int, events_read: int, mark: str,
        greatest: str) -> None:
    """In a batch's commit transaction, after its row went into `batches`: the batch added to its
    pipeline's totals (`greatest`: the two-argument maximum, SQLite's MAX or PostgreSQL's GREATEST)."""
    cursor.execute(f"UPDATE batch_totals SET batches = batches + 1, events_read = events_read + {mark},"
                   f" last_batch_id = {greatest}(last_batch_id, {mark}),"
                   f" last_commit_ms = {greatest}(last_commit_ms, {mark}) WHERE pipeline = {mark}",
                   (events_read, batch_id, committed_at_ms, pipeline))
    if cursor.rowcount == 0:  # its first commit since this table exists: every batch so far, this one included
        totals = _scan(cursor, pipeline, mark)
        cursor.execute(f"INSERT INTO batch_totals (pipeline, batches, events_read, last_batch_id, last_commit_ms)"
                       f" VALUES ({mark}, {mark}, {mark}, {mark}, {mark})",
                       (pipeline, totals.batches, totals.events_read, totals.last_batch_id, totals.last_commit_ms))

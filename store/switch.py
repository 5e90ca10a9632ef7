"""Switching a stream's served output to another namespace's (issue 16; docs/reprocessing.md).

In one transaction of the root store, under the commit lock (SQLite's BEGIN IMMEDIATE,
PostgreSQL's COMMIT_LOCK), the stream's rows in the root are copied into the `previous`
namespace, deleted, and replaced by the `source` namespace's (a reprocessing run's, or a
previous output: switching back is a switch too). Readers read one transaction, so they see
all old or all new. With the rows go:

- `stream_definitions`: the root now says it is built with the source's definition, which is
  also what fences a live pipeline still computing the old way (`check_definitions`);
- `pipeline_offsets`: the source's end offsets for the stream become the serving pipeline's,
  recorded as an offset move the serving pipeline applies to its Spark checkpoint when it
  starts again (`offset_moves`, store/definitions.py);
- one `switched` record in the change feed (revision SWITCHED_REVISION): websocket hubs
  reload their subscribers of the stream.
- the ids the copies of its corrections got in the root (`switched_corrections`): history
  under new ids, which the websocket's corrections feed does not push as news.

The change feed itself is not copied (its sequence numbers are the root's), nor the batch ids
(per pipeline, not per stream). SQL only, over store.connection.Db, the same for both backends:
the other namespaces are reached through a qualifier (SQLite: an ATTACHed database's alias;
PostgreSQL: the namespace's schema)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from store.connection import Db, SqliteDb, columns_of
from store.view_state import SWITCH_BATCH, ViewLink, append_changes, switch_changes

# A change-feed record that says "this stream's output was switched": no pane has this revision.
SWITCHED_REVISION = -1

# Every table whose rows belong to one stream (column `stream`): what a switch moves.
STREAM_TABLES = (
    "panes", "stream_progress", "dead_letter_counts", "dead_letters", "corrections",  # panes, tier rows: with sketches
    "partition_watermarks", "device_clocks", "tier_layouts", "tier_rows", "tier_folds", "bloom_filters",
    "bloom_chunks", "first_seen", "seen_event_ids", "event_id_partitions", "duplicate_counts", "table_rows",
    "enrich_misses",  # the stream's events enriched with "" (per table): a counter of its output
    "session_open", "session_buckets", "session_streams",  # its open sessions (rows or buckets): the state its `<stream>_sessions` output goes on from
    "dim_sets",  # the numbers its panes and tier rows give their dimensions (store/dim_sets.py)
)
# Not here, keyed by another name: a pattern's state and matches (below), moved with the stream
# when the run rebuilt them (catalog/dependents.py rebuilt_patterns; aligned_patterns, over two
# streams, by a synchronized switch), else the switch is refused;
# join_* state (JOIN_STATE_TABLES), moved by a synchronized switch (aggregates/reprocess.py), else
# refused; view_* state, moved by a synchronized switch with a table the view reads (its changelog
# stays the root's and gets the difference: `move_view`), else refused; and table_versions (a
# table's row versions, built by whichever pipeline enriches a stream from the table, not by the
# table's own output): moved with the table and the streams enriched from it that the run rebuilt
# (`switch_enriched`), else refused.
# The tables of a window join's state (column `join_name`): moved with a stream the join reads
# by a synchronized switch (aggregates/reprocess.py), the run having read the other stream too.
JOIN_STATE_TABLES = ("join_left", "join_right", "join_progress")
# The tables of a view's state (column `view_name`), moved like a join's; not its changelog, which
# readers page through by the root's positions (store/view_state.py).
VIEW_STATE_TABLES = ("view_rows", "view_definitions")
# The tables of a pattern's state and matches (column `pattern`).
PATTERN_TABLES = ("pattern_state", "pattern_buffer", "pattern_progress", "pattern_matches", "pattern_late",
                  "pattern_applied", "pattern_history")
# Keys the store numbers itself: a copy gets new ones (the correction ids readers page by stay increasing).
_NUMBERED = {"dead_letters": "id", "corrections": "id", "pattern_late": "id"}


class SwitchConflict(ValueError):
    """The served output changed since the switch was decided (another switch came first)."""


class SwitchHeld(RuntimeError):
    """A synchronized switch holds the pipeline's commits (table switch_holds): the batch is not
    committed now; the committer retries it (aggregates/commit_retry.py) until the switch is done
    (then the batch is refused as DefinitionSwitched) or given up (then it commits)."""


class NotAligned(SwitchConflict):
    """The run's offsets of a join's other stream are not the serving pipeline's: the run's join
    state would miss records the serving pipeline has read, or hold some twice."""


class DefinitionSwitched(RuntimeError):
    """A batch computed with a definition the namespace no longer holds (a switch happened since
    the pipeline started): not committed; the pipeline restarts with the new definition."""


@dataclass(frozen=True)
class Side:
    """One namespace in the switch's transaction: how its tables are named from the root's
    connection ('' for the root itself), and the pipeline whose offsets it holds."""

    qualifier: str
    pipeline: str

    def table(self, name: str) -> str:
        return f"{self.qualifier}.{name}" if self.qualifier else name


def table_columns(db: Db) -> dict[str, list[str]]:
    """The columns of every table a switch moves, as the root has them (every namespace is made by the same code)."""
    return {table: columns_of(db, table) for table in (*STREAM_TABLES, *PATTERN_TABLES, *JOIN_STATE_TABLES,
                                                     *VIEW_STATE_TABLES)}


def copy_stream(db: Db, stream: str, source: Side, target: Side, columns: Mapping[str, list[str]]) -> None:
    """Copy the stream's rows of every stream table, its offsets (renamed to the target's
    pipeline) and its definition from source to target (whose rows of it must be gone)."""
    for table in STREAM_TABLES:
        cols = ", ".join(f'"{c}"' for c in columns[table] if c != _NUMBERED.get(table))
        db.execute(f"INSERT INTO {target.table(table)} ({cols}) SELECT {cols} FROM {source.table(table)}"
                   f" WHERE stream = ?", (stream,))
    db.execute(f"INSERT INTO {target.table('pipeline_offsets')} (pipeline, stream, partition, end_offset)"
               f" SELECT ?, stream, partition, end_offset FROM {source.table('pipeline_offsets')}"
               f" WHERE pipeline = ? AND stream = ?", (target.pipeline, source.pipeline, stream))
    db.execute(f"INSERT INTO {target.table('stream_definitions')} (stream, version, definition, recorded_at_ms)"
               f" SELECT stream, version, definition, recorded_at_ms FROM {source.table('stream_definitions')}"
               f" WHERE stream = ?", (stream,))


def newest_correction_id(db: Db, side: Side) -> int:
    return int(db.execute(f"SELECT COALESCE(MAX(id), 0) FROM {side.table('corrections')}").fetchone()[0])


def record_copied_corrections(db: Db, root: Side, before_id: int, now_ms: int) -> None:
    """In the switch's transaction, after its copies into the root: the ids above `before_id` are
    the copies' (the commit lock is held, so no batch wrote one meanwhile)."""
    after_id = newest_correction_id(db, root)
    if after_id > before_id:
        db.execute("INSERT INTO switched_corrections (first_id, last_id, at_ms) VALUES (?, ?, ?)",
                   (before_id + 1, after_id, now_ms))


def delete_stream(db: Db, stream: str, side: Side) -> None:
    for table in STREAM_TABLES:
        db.execute(f"DELETE FROM {side.table(table)} WHERE stream = ?", (stream,))
    db.execute(f"DELETE FROM {side.table('pipeline_offsets')} WHERE pipeline = ? AND stream = ?",
               (side.pipeline, stream))
    db.execute(f"DELETE FROM {side.table('stream_definitions')} WHERE stream = ?", (stream,))


def stream_offsets(db: Db, stream: str, side: Side) -> dict[int, int]:
    rows = db.execute(f"SELECT partition, end_offset FROM {side.table('pipeline_offsets')}"
                      f" WHERE pipeline = ? AND stream = ?", (side.pipeline, stream)).fetchall()
    return {int(p): int(o) for p, o in rows}


def stored_version(db: Db, stream: str, side: Side) -> str | None:
    row = db.execute(f"SELECT version FROM {side.table('stream_definitions')} WHERE stream = ?", (stream,)).fetchone()
    return None if row is None else row[0]


def copy_keyed(db: Db, table: str, column: str, name: str, source: Side, target: Side, columns: Sequence[str],
               floor: int = 0) -> None:
    """Copy the rows of `table` whose `column` is `name` from source to target (whose rows of it
    must be gone); numbered rows get ids past the target's and `floor`."""
    if table == "pattern_matches":
        _copy_matches(db, name, source, target, columns, floor)
        return
    cols = ", ".join(f'"{c}"' for c in columns if c != _NUMBERED.get(table))
    db.execute(f"INSERT INTO {target.table(table)} ({cols}) SELECT {cols} FROM {source.table(table)}"
               f" WHERE {column} = ?", (name,))


def _copy_matches(db: Db, pattern: str, source: Side, target: Side, columns: Sequence[str], floor: int) -> None:
    """A pattern's matches keep their ids relative to each other (a retraction names the id of the
    match it withdraws), shifted past the target's highest id and `floor`, the highest it had before
    the switch deleted the replaced ones (readers page by id: it stays increasing)."""
    table = "pattern_matches"
    low = db.execute(f"SELECT MIN(id) FROM {source.table(table)} WHERE pattern = ?", (pattern,)).fetchone()[0]
    if low is None:
        return
    top = db.execute(f"SELECT COALESCE(MAX(id), 0) FROM {target.table(table)}").fetchone()[0]
    shift = max(int(top), floor) + 1 - int(low)
    others = [c for c in columns if c not in ("id", "retracts")]
    cols = ", ".join(f'"{c}"' for c in others)
    # retracts 0: a retraction whose match was not found (store/patterns.py): no id to shift.
    db.execute(f"INSERT INTO {target.table(table)} (id, retracts, {cols}) SELECT id + ?,"
               f" CASE WHEN retracts IS NULL OR retracts = 0 THEN retracts ELSE retracts + ? END, {cols}"
               f" FROM {source.table(table)} WHERE pattern = ?", (shift, shift, pattern))
    if not isinstance(db, SqliteDb):  # an identity column's sequence does not follow explicit ids
        db.execute(f"SELECT setval(pg_get_serial_sequence(?, 'id'), (SELECT MAX(id) FROM {target.table(table)}))",
                   (target.table(table),))


def move_keyed(db: Db, tables: Sequence[str], column: str, name: str, *, root: Side, source: Side, previous: Side,
               columns: Mapping[str, list[str]]) -> None:
    """A pattern's rows: the root's to `previous` (emptied of them first), the source's into the root."""
    for table in tables:
        floor = 0
        if table == "pattern_matches":
            floor = int(db.execute(f"SELECT COALESCE(MAX(id), 0) FROM {root.table(table)}").fetchone()[0])
        db.execute(f"DELETE FROM {previous.table(table)} WHERE {column} = ?", (name,))
        copy_keyed(db, table, column, name, root, previous, columns[table])
        db.execute(f"DELETE FROM {root.table(table)} WHERE {column} = ?", (name,))
        copy_keyed(db, table, column, name, source, root, columns[table], floor)


def view_links(db: Db, view: str, side: Side) -> dict[str, ViewLink]:
    """A view's entries in a namespace, by left key."""
    rows = db.execute(f"SELECT left_key, right_key, row_json, event_time_ms, log_partition, log_offset"
                      f" FROM {side.table('view_rows')} WHERE view_name = ?", (view,)).fetchall()
    return {lk: ViewLink(lk, rk, None if row is None else json.loads(row), int(t), int(p), int(o))
            for lk, rk, row, t, p, o in rows}


class _Cursor:
    """A DB-API cursor's face of a Db (its `?` placeholders), for store/view_state.py's writers."""

    def __init__(self, db: Db):
        self.db, self._found = db, None

    def execute(self, sql: str, args: Sequence = ()) -> None:
        self._found = self.db.execute(sql, args)

    def executemany(self, sql: str, rows: Sequence[Sequence]) -> None:
        self.db.executemany(sql, rows)

    def fetchone(self):
        return self._found.fetchone()


def move_view(db: Db, view: str, *, root: Side, source: Side, previous: Side, columns: Mapping[str, list[str]],
              now_ms: int) -> int:
    """A view's rows and definition: the root's to `previous`, the source's (rebuilt by the run) into
    the root, and the difference between the served rows and the rebuilt ones appended to the
    root's changelog as ordinary changes (old -> new), after every change a reader may have seen:
    a reader going on from its cursor sees each change once and ends with the rebuilt view.
    Returns how many changes were appended."""
    changes = switch_changes(view_links(db, view, root), view_links(db, view, source))
    move_keyed(db, VIEW_STATE_TABLES, "view_name", view, root=root, source=source, previous=previous, columns=columns)
    if changes:
        append_changes(_Cursor(db), view, SWITCH_BATCH, changes, now_ms, "?")
    return len(changes)


def switch_stream(db: Db, stream: str, *, root: Side, source: Side, previous: Side, serving_version: str,
                  now_ms: int, derived: Sequence[str] = (), patterns: Sequence[str] = (), joins: Sequence[str] = (),
                  aligned: Sequence[str] = (), views: Sequence[str] = ()) -> dict[int, int]:
    """In the open transaction: the root's rows of `stream` and of its `derived` streams (its
    sessions, its device clocks: catalog/dependents.py moved_with) to `previous` (emptied of them
    first), the source's into the root, likewise the state and matches of the `patterns` the run
    rebuilt (their `<pattern>_matches` streams are among `derived`), an offset
    move for the serving pipeline and one `switched` change record per stream moved. Returns the serving pipeline's new offsets for the stream.
    SwitchConflict, changing nothing, unless the root still serves `serving_version` (read under
    the lock: two switches at once must not both keep the root's rows as the same version).
    `joins`: window joins whose state (and, among `derived`, whose derived streams) the run
    rebuilt reading their other streams, `aligned`, too: NotAligned unless the run's offsets of
    each equal the serving pipeline's (a synchronized switch; its hold is released here). `views`:
    table-table join views the run rebuilt reading their other table too (aligned as well): their
    rows move, and their changelogs get the difference (`move_view`)."""
    if stored_version(db, stream, root) != serving_version:
        raise SwitchConflict(f"the served output of {stream!r} changed meanwhile (another switch?): try again")
    for other in aligned:
        live, run = stream_offsets(db, other, root), stream_offsets(db, other, source)
        if live != run:
            raise NotAligned(f"the run read stream {other!r} to {dict(sorted(run.items()))}, the serving pipeline"
                             f" to {dict(sorted(live.items()))}")
    columns = table_columns(db)
    copied_after = newest_correction_id(db, root)
    for name in (stream, *derived):
        delete_stream(db, name, previous)
        copy_stream(db, name, root, previous, columns)
        delete_stream(db, name, root)
        copy_stream(db, name, source, root, columns)
    for pattern in patterns:
        move_keyed(db, PATTERN_TABLES, "pattern", pattern, root=root, source=source, previous=previous, columns=columns)
    for join in joins:
        move_keyed(db, JOIN_STATE_TABLES, "join_name", join, root=root, source=source, previous=previous,
                   columns=columns)
    for view in views:
        move_view(db, view, root=root, source=source, previous=previous, columns=columns, now_ms=now_ms)
    record_copied_corrections(db, root, copied_after, now_ms)
    if aligned:
        db.execute("DELETE FROM switch_holds WHERE pipeline = ?", (root.pipeline,))
    offsets = stream_offsets(db, stream, root)
    db.execute("DELETE FROM offset_moves WHERE pipeline = ? AND stream = ?", (root.pipeline, stream))
    db.execute("INSERT INTO offset_moves (pipeline, stream, offsets, at_ms) VALUES (?, ?, ?, ?)",
               (root.pipeline, stream, json.dumps({str(p): o for p, o in sorted(offsets.items())}), now_ms))
    for name in (stream, *derived):
        db.execute("INSERT INTO changes (stream, start_ms, dims, revision, batch_id, count_added, at_ms)"
                   " VALUES (?, 0, '{}', ?, -1, 0, ?)", (name, SWITCHED_REVISION, now_ms))
    return offsets


def switch_enriched(db: Db, table: str, streams: Mapping[str, str], *, root: Side, source: Side, previous: Side,
                    now_ms: int, derived: Sequence[str] = ()) -> None:
    """In the switch's open transaction of the table `table`: the streams enriched from it that the
    run rebuilt (`streams`: each with the version the root serves it with, checked under the lock:
    SwitchConflict unless unchanged) move like the table itself, their rows, definition and
    offsets (an offset move each: the serving pipeline reads them again from the run's end) and
    their `derived` streams; and so do the table's row versions they look up (`table_versions`,
    keyed by the table): the root's to `previous`, the run's (rebuilt from the table's log with
    its new definition) into the root (docs/reprocessing.md "A table that enriches streams")."""
    for stream, serving in streams.items():
        if stored_version(db, stream, root) != serving:
            raise SwitchConflict(f"the served output of {stream!r} changed meanwhile (another switch?): try again")
        if stored_version(db, stream, source) is None:
            raise SwitchConflict(f"the run did not build {stream!r}, which is enriched from {table!r}: start a new run")
    columns = table_columns(db)
    copied_after = newest_correction_id(db, root)
    for name in (*streams, *derived):
        delete_stream(db, name, previous)
        copy_stream(db, name, root, previous, columns)
        delete_stream(db, name, root)
        copy_stream(db, name, source, root, columns)
    record_copied_corrections(db, root, copied_after, now_ms)
    move_keyed(db, ("table_versions",), "stream", table, root=root, source=source, previous=previous,
               columns={"table_versions": columns_of(db, "table_versions")})
    for stream in streams:
        offsets = stream_offsets(db, stream, root)
        db.execute("DELETE FROM offset_moves WHERE pipeline = ? AND stream = ?", (root.pipeline, stream))
        db.execute("INSERT INTO offset_moves (pipeline, stream, offsets, at_ms) VALUES (?, ?, ?, ?)",
                   (root.pipeline, stream, json.dumps({str(p): o for p, o in sorted(offsets.items())}), now_ms))
    for name in (*streams, *derived):
        db.execute("INSERT INTO changes (stream, start_ms, dims, revision, batch_id, count_added, at_ms)"
                   " VALUES (?, 0, '{}', ?, -1, 0, ?)", (name, SWITCHED_REVISION, now_ms))


def check_definitions(db: Db, versions: Mapping[str, str], pipeline: str | None = None) -> None:
    """Inside a batch's commit: DefinitionSwitched when the namespace's stored definition of one
    of the batch's streams is no longer the one the batch was computed with; SwitchHeld while a
    synchronized switch holds `pipeline`'s commits."""
    if not versions:
        return
    if pipeline is not None:
        # No placeholder: `db` is a backend's own connection here (SQLite's ?, psycopg's %s); a row or none.
        held = dict(db.execute("SELECT pipeline, run_id FROM switch_holds").fetchall()).get(pipeline)
        if held is not None:
            raise SwitchHeld(f"pipeline {pipeline!r} is held while run {held!r} is switched in (its other"
                             " streams' offsets must stay where the run aligns to): retried")
    stored = dict(db.execute("SELECT stream, version FROM stream_definitions").fetchall())
    moved = sorted(s for s, v in versions.items() if s in stored and stored[s] != v)
    if moved:
        raise DefinitionSwitched(
            f"the output of {', '.join(map(repr, moved))} was switched to another definition since this pipeline"
            " started: the batch is not committed; the pipeline restarts with the new definition")

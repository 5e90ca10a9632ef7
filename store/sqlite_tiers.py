"""The tier rows of the SQLite store (store/tiers.py says what they are): their tables, the
merge of a batch's deltas in the batch's transaction, per-tier retention, reads, and the
rebuild from the panes when a stream's layout changes. Functions over the store's
connection, called with its lock held (as store/bloom.py's are). Rows of both tables that hold
pane-shaped data, panes and tier_rows, are read, loaded and saved by the same functions here."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Callable

from store import dim_sets, dims_migration, row_codec
from store.commit_plan import (StoredPane, rebuild_chunks, rebuilt_rows, rebuilt_rows_to_save,
                               merged_tier_rows, tier_row_keys, tiers_kept_by_rebuild)
from store.panes import Pane, PaneData
from store.rollup import BucketStats
from store.stored_spans import in_stored_spans
from store import tier_fold_store
from store.tier_rebuild import drop_rows_to_rebuild
from store.connection import transaction
from store.tables import OLD_SKETCH_TABLES, TEXT_DIMS_TABLES, TIER_TABLES, table_ddl
from store.tiers import ALL_DIMS, TierDelta, TierKey, TierLayout

log = logging.getLogger(__name__)


def create_schema(conn: sqlite3.Connection) -> None:
    conn.executescript(TIER_TABLES)


# What a query's exact sums and a sketch query's fingerprints read of each row (aggregate()),
# kept apart from the rows: a rowid table's row holds a few kilobytes of its sketches in its leaf
# page, so a day of minute rows spans ~1 400 pages where this index spans a few dozen (a day's
# sums 7.4 -> 3.5-4.7 ms; each tier row's upsert writes one more index entry, within the noise of
# a 60 000-row upsert). SQLite only: PostgreSQL keeps the sketches out of line (TOAST) already.
SUMS_INDEX = ("CREATE INDEX IF NOT EXISTS tier_rows_sums ON tier_rows"
              " (stream, granule_ms, proj, start_ms, dims_id, count, revision, last_batch, stats)")


def create_indexes(conn: sqlite3.Connection) -> None:
    """After the migrations, which may rebuild tier_rows (and drop its indexes with the old table).
    A store of before gets it built once, at open, under the write lock (~0.5 s a day of 3 M
    events): logged with its time, as other processes opening the store wait for it meanwhile."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'tier_rows_sums'").fetchone():
        return
    rows = conn.execute("SELECT COUNT(*) FROM tier_rows").fetchone()[0]
    started = time.monotonic()
    conn.execute(SUMS_INDEX)
    if rows:
        log.info("built the index tier_rows_sums over %d tier rows in %.1f s (once, for a store made before it)",
                 rows, time.monotonic() - started)


def stored_layouts(conn: sqlite3.Connection) -> dict[str, TierLayout]:
    return {stream: TierLayout.from_json(text) for stream, text in conn.execute("SELECT stream, layout FROM tier_layouts")}


def apply_deltas(conn: sqlite3.Connection, deltas: Mapping[str, Mapping[TierKey, TierDelta]], now_ms: int,
                 batch_id: int) -> None:
    """Merge each stream's deltas into their stored tier rows (creating those that are new): one
    bulk load of the rows that exist, one bulk save, for every stream."""
    keys = tier_row_keys(deltas)
    stored = load_many(conn, "tier_rows", TIER_KEY, list(keys.values()))
    save_many(conn, "tier_rows", TIER_KEY, merged_tier_rows(deltas, keys, stored), now_ms, batch_id)


def read_rows(conn: sqlite3.Connection, table: str, where: str, args: tuple, start_ms: int, end_ms: int,
              sketches: Sequence[tuple[str, str]] | None, *, stats: bool = True, stream: str = "",
              keep: Callable[[int, str], bool] | None = None) -> list[Pane]:
    """Rows of `table` (panes or tier_rows) matching `where` that start in [start_ms, end_ms), as
    Panes with the sketches asked for ((field, kind) pairs; None: every sketch of every field). stats=False skips the exact stats
    (what a percentile or distinct query does not need): value fields then hold only their KLL.
    `keep(start, dims text)`: only the rows it takes are decoded (a fold's shard, store/tier_folds.py)."""
    span = f"{where} AND start_ms >= ? AND start_ms < ?"
    args = (*args, start_ms, end_ms)
    rows = conn.execute(
        "SELECT t.start_ms, d.dims, t.end_ms, t.count, t.stats, t.revision, t.updated_at_ms, t.last_batch, t.sketches"
        " FROM " + dim_sets.joined(f"SELECT stream, dims_id, start_ms, end_ms, count, {'stats' if stats else 'NULL'}"
                                   f" AS stats, revision, updated_at_ms, last_batch,"
                                   f" {row_codec.sketches_column(sketches)} AS sketches FROM {table} WHERE {span}")
        + " ORDER BY t.start_ms", args)
    if keep is not None:
        rows = [row for row in rows if keep(row[0], row[1])]
    return row_codec.assemble(stream, rows, sketches)


def rebuild(conn: sqlite3.Connection, stream: str, layout: TierLayout | None, read_panes: Callable,
            now_ms: int, chunk_ms: int = 6 * 3_600_000, progress: Callable[[str], None] | None = None) -> int:
    """Replace a stream's tier rows by ones rolled up from its stored panes under `layout`
    (None: the stream keeps no tiers) and record the layout; returns the panes read. Rows of a
    tier the old layout kept too that start before the first pane are kept (history past the
    panes' retention: store.commit_plan.tiers_kept_by_rebuild). The panes are read a chunk of
    event time at a time (a whole number of every granule), so memory stays bounded however
    many there are."""
    old = stored_layouts(conn).get(stream)
    conn.execute("DELETE FROM tier_layouts WHERE stream = ?", (stream,))
    tier_fold_store.forget(conn.cursor(), "?", stream)  # rolled up from every pane: none is left to fold
    if layout is None:
        conn.execute("DELETE FROM tier_rows WHERE stream = ?", (stream,))
        return 0
    first, last = conn.execute("SELECT MIN(start_ms), MAX(start_ms) FROM panes WHERE stream = ?", (stream,)).fetchone()
    kept = tiers_kept_by_rebuild(old, layout)
    drop_rows_to_rebuild(conn, "?", stream, kept, first)
    done = 0
    if first is not None:
        for lo, hi in rebuild_chunks(first, last, layout, chunk_ms):
            panes = read_panes(stream, lo, hi)
            deltas, last_batch = rebuilt_rows(panes, layout)
            save_many(conn, "tier_rows", TIER_KEY,
                      (((stream, key.granule_ms, key.proj, key.start_ms, key.dims), key.start_ms + key.granule_ms,
                        delta.data, delta.revision) for key, delta in rebuilt_rows_to_save(deltas, kept, first).items()),
                      now_ms, last_batch)
            done += len(panes)
            if progress is not None and panes:
                progress(f"tiers of {stream!r}: {done} panes rolled up (to {hi} ms)")
    conn.execute("INSERT INTO tier_layouts (stream, layout) VALUES (?, ?)", (stream, layout.to_json()))
    return done


# The key columns of the two tables that hold pane-shaped rows. Callers give keys with the
# dimensions' text last; the rows hold its number in dim_sets (store/dim_sets.py).
PANE_KEY = ("stream", "start_ms", "dims_id")
TIER_KEY = ("stream", "granule_ms", "proj", "start_ms", "dims_id")


_TYPES = {"stream": "TEXT", "start_ms": "INTEGER", "dims_id": "INTEGER", "granule_ms": "INTEGER", "proj": "TEXT"}


def load_many(conn: sqlite3.Connection, table: str, key_columns: tuple[str, ...],
              keys: Sequence[tuple]) -> dict[tuple, StoredPane]:
    """The stored rows of `table` (panes or tier_rows) among `keys` (the dimensions' text last),
    with all their sketches (what a merge into them needs); missing keys are absent. The keys go
    into a temporary table and the rows are read with one join, as store/postgres/rows.load does:
    the per-key lookups run in SQLite's C code rather than a statement per key from Python."""
    keys = in_stored_spans(conn.cursor(), "?", table, key_columns, keys)  # none, for a backfill into new time
    if not keys:
        return {}
    by_number = {number: key for key, number in dim_sets.numbered(conn, "?", keys).items()}
    keys = list(by_number)
    staged = f"temp.keys_{table}"
    columns = ", ".join(key_columns)
    conn.execute(f"CREATE TEMP TABLE IF NOT EXISTS keys_{table}"
                 f" ({', '.join(f'{c} {_TYPES[c]}' for c in key_columns)}, PRIMARY KEY ({columns})) WITHOUT ROWID")
    conn.executemany(f"INSERT OR IGNORE INTO {staged} VALUES ({', '.join('?' * len(key_columns))})", keys)
    n = len(key_columns)
    try:
        return {by_number[row[:n]]: StoredPane(row_codec.load_data(row[n], row[n + 1], row[n + 3]), row[n + 2])
                for row in conn.execute(f"SELECT {', '.join(f't.{c}' for c in key_columns)}, count, stats, revision,"
                                        f" sketches FROM {staged} k CROSS JOIN {table} t ON {_on('t', key_columns)}")}
    finally:
        conn.execute(f"DELETE FROM {staged}")


def _on(alias: str, key_columns: tuple[str, ...]) -> str:
    """The join of the staged keys (k) to a table; CROSS JOIN keeps the keys the outer loop."""
    return " AND ".join(f"{alias}.{c} = k.{c}" for c in key_columns)


def save_many(conn: sqlite3.Connection, table: str, key_columns: tuple[str, ...],
              rows: Iterable[tuple[tuple, int, PaneData, int]], now_ms: int, batch_id: int) -> dict[tuple, tuple]:
    """Insert or replace rows (key with the dimensions' text last, end_ms, data, revision) of
    `table` (panes or tier_rows) with their sketches: save_rows of them encoded."""
    return save_rows(conn, table, key_columns, row_codec.encoded_rows(rows), now_ms, batch_id)


def save_rows(conn: sqlite3.Connection, table: str, key_columns: tuple[str, ...],
              rows: Sequence[tuple[tuple, int, int, str, int, bytes]], now_ms: int, batch_id: int) -> dict[tuple, tuple]:
    """Insert or replace rows (key with the dimensions' text last, end_ms, count, stats text,
    revision, sketches blob: store/row_codec.py's encoding) of `table` (panes or tier_rows): one
    executemany for the whole batch. Returns each key as stored (the text's number last)."""
    number = dim_sets.numbered(conn, "?", (row[0] for row in rows))
    columns = ", ".join(key_columns)
    marks = ", ".join("?" * len(key_columns))
    conn.executemany(
        f"INSERT INTO {table} ({columns}, end_ms, count, stats, revision, updated_at_ms, last_batch, sketches)"
        f" VALUES ({marks}, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT ({columns}) DO UPDATE SET count = excluded.count,"
        " stats = excluded.stats, revision = excluded.revision, updated_at_ms = excluded.updated_at_ms,"
        " last_batch = excluded.last_batch, sketches = excluded.sketches",
        [(*number[key], end_ms, count, text, revision, now_ms, batch_id, blob)
         for key, end_ms, count, text, revision, blob in rows])
    return number


def fold_old_sketch_tables(conn: sqlite3.Connection) -> None:
    """A store made before sketches were a column of their row (store/tables.py
    OLD_SKETCH_TABLES): each such table rebuilt with its rows' sketches folded into the
    `sketches` column, the old sketch table dropped, in one transaction. Run at open, before
    anything else reads or writes; a store already in the new layout is left alone."""
    def columns(table: str) -> set[str]:
        return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}

    if all("sketches" in columns(table) for table in OLD_SKETCH_TABLES):
        return
    conn.create_aggregate("sketches_blob", 3, row_codec.SketchesAggregate)
    with transaction(conn):
        # Again under the write lock: another process opening the store may have folded them meanwhile.
        for table in [table for table in OLD_SKETCH_TABLES if "sketches" not in columns(table)]:
            sketch_table, key = OLD_SKETCH_TABLES[table]
            kept = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
            conn.execute(f"ALTER TABLE {table} RENAME TO old_{table}")
            conn.execute(table_ddl(table, TEXT_DIMS_TABLES))  # then numbered by number_dims, next
            cols = ", ".join(kept)
            if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (sketch_table,)).fetchone():
                blob = (f"COALESCE((SELECT sketches_blob(field, kind, data) FROM {sketch_table} s"
                        f" WHERE {' AND '.join(f's.{c} = o.{c}' for c in key)}), ?)")
            else:
                blob = "?"
            conn.execute(f"INSERT INTO {table} ({cols}, sketches) SELECT {', '.join(f'o.{c}' for c in kept)}, {blob}"
                         f" FROM old_{table} o", (row_codec.NO_SKETCHES,))
            conn.execute(f"DROP TABLE old_{table}")
            conn.execute(f"DROP TABLE IF EXISTS {sketch_table}")


def number_dims(conn: sqlite3.Connection) -> None:
    """A store whose rows hold their dimensions as text (store/dims_migration.py) rebuilt with
    them numbered, in one transaction. Run at open, after fold_old_sketch_tables; a store
    already in the new layout is left alone."""
    def columns() -> dict[str, set[str]]:
        return {table: {row[1] for row in conn.execute(f"PRAGMA table_info({table})")} for table in dims_migration.TABLES}

    if not dims_migration.old_tables(columns()):
        return
    conn.create_function("array_stats", 1, row_codec.array_stats, deterministic=True)
    with transaction(conn):
        # Again under the write lock: another process may have done it meanwhile.
        for statement in dims_migration.statements("array_stats(o.stats)", dims_migration.old_tables(columns())):
            conn.execute(statement)


__all__ = ["ALL_DIMS", "SUMS_INDEX", "apply_deltas", "create_indexes", "create_schema",
           "fold_old_sketch_tables", "load_many", "number_dims", "read_rows", "rebuild", "save_many", "save_rows",
           "stored_layouts"]


def aggregate(conn: sqlite3.Connection, table: str, where: str, args: tuple, *, start_ms: int, end_ms: int,
              origin_ms: int, bucket_ms: int, group_by: Sequence[str], filters: Mapping[str, str],
              value_field: str | None, one_row_per_bucket: bool = False) -> list[BucketStats]:
    """Exact stats summed in SQL: per (bucket of `bucket_ms` from `origin_ms`, group) of the rows
    of `table` matching `where` that start in [start_ms, end_ms) and pass `filters`: count, the
    highest revision, the value field's n/sum/min/max, the newest batch and the rows summed.

    SQLite groups by the rows' dimension numbers, then joins their texts (no JSON parsing per
    row); each distinct text is parsed once here and mapped to its group. Filters pick the
    stream's matching numbers from dim_sets (a JSON test per combination, not per row). With
    one_row_per_bucket (the rows are as long as the bucket and aligned on it: a 1-minute step
    read from 1-minute rows) each (bucket, dimensions) holds one row: the same sums without
    the GROUP BY's sort, about half the query's time for a day of 1-minute rows."""
    def agg(fn: str, expr: str) -> str:
        return expr if one_row_per_bucket else f"{fn}({expr})"

    clauses = [where, "start_ms >= ?", "start_ms < ?"]
    if filters:  # names are identifiers
        tests = " AND ".join(f"COALESCE(json_extract(f.dims, '$.{name}'), '') = ?" for name in filters)
        clauses.append(f"dims_id IN (SELECT f.id FROM dim_sets f WHERE f.stream = ? AND {tests})")
        filter_args = (args[0], *filters.values())  # every `where` here starts with the stream
    else:
        filter_args = ()
    if value_field:
        path = f"'$.{value_field}"
        # The sum exactly rounded (store/exact_sum.py), as the pane roll-up and the tier rows add.
        value = ", ".join(agg(fn, f"json_extract(stats, {path}[{i}]')")
                          for i, fn in enumerate(("SUM", "exact_sum", "MIN", "MAX")))
    else:
        value = "0, 0.0, NULL, NULL"
    grouped = (f"SELECT (start_ms - ?) / ? AS bucket, stream, dims_id, {agg('SUM', 'count')}, {agg('MAX', 'revision')},"
               f" {value}, {agg('MAX', 'last_batch')}, {'1' if one_row_per_bucket else 'COUNT(*)'}"
               f" FROM {table} WHERE {' AND '.join(clauses)}"
               f"{'' if one_row_per_bucket else ' GROUP BY bucket, stream, dims_id'}")
    sql = f"SELECT g.*, d.dims FROM {dim_sets.joined(grouped, 'g')}"
    rows = ((bucket, dims, *rest) for bucket, _, _, *rest, dims in
            conn.execute(sql, (origin_ms, bucket_ms, *args, start_ms, end_ms, *filter_args)))
    return row_codec.bucket_stats(rows, group_by)

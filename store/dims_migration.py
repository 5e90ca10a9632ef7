"""A store written before dimension combinations were numbered (store/dim_sets.py) and stats
were arrays (store/row_codec.py): its panes, tier rows and change records rebuilt in the new
layout when it is opened, in SQL the two backends share; each runs it in one transaction.

The old tables' rows (TEXT_DIMS_TABLES in store/tables.py: the dimensions as text, the stats
as {field: {n, sum, min, max}}) go into new tables made by the current DDL: each stream's
combinations numbered 1, 2, ... into dim_sets, each row keyed by its number, its stats
rewritten text to text (`stats_sql`: the same numbers, as they were written), everything else
as it was (change records keep their sequence numbers). The old tables are dropped; the
space they held is reused by later batches (SQLite: `VACUUM` gives it back to the disk)."""

from __future__ import annotations

from store.tables import table_ddl

# The tables rebuilt, each with its columns besides the dimensions (in the old and new tables alike).
TABLES = {
    "panes": ("stream", "start_ms", "end_ms", "count", "stats", "revision", "updated_at_ms", "last_batch", "sketches"),
    "tier_rows": ("stream", "granule_ms", "proj", "start_ms", "end_ms", "count", "stats", "revision", "updated_at_ms",
                  "last_batch", "sketches"),
    "changes": ("seq", "stream", "start_ms", "revision", "batch_id", "count_added", "at_ms", "correction_id"),
}


def old_tables(columns: dict[str, set[str]]) -> list[str]:
    """The tables, of a store whose tables have these columns, still in the old layout (a store
    of long ago may have some: the tables it lacked were made new when it was opened)."""
    return [table for table in TABLES if "dims_id" not in columns[table]]


def statements(stats_sql: str, tables: list[str]) -> list[str]:
    """The migration of `tables` (old_tables), in order: each new table made beside the old one
    (`new_<table>`), their combinations numbered (after any the stream has), the rows copied, the
    old table dropped and the new one renamed. `stats_sql`: the backend's expression of the new
    stats text from `o.stats`."""
    out = [table_ddl(table).replace(f"EXISTS {table} (", f"EXISTS new_{table} (") for table in tables]
    union = " UNION ".join(f"SELECT stream, dims FROM {table}" for table in tables)
    out.append("INSERT INTO dim_sets (stream, id, dims) SELECT u.stream, COALESCE((SELECT MAX(m.id) FROM dim_sets m"
               " WHERE m.stream = u.stream), 0) + ROW_NUMBER() OVER (PARTITION BY u.stream ORDER BY u.dims), u.dims"
               f" FROM ({union}) u WHERE NOT EXISTS (SELECT 1 FROM dim_sets e WHERE e.stream = u.stream"
               " AND e.dims = u.dims)")
    for table in tables:
        columns = TABLES[table]
        copied = [f"o.{c}" if c != "stats" else f"{stats_sql} AS stats" for c in columns]
        out.append(f"INSERT INTO new_{table} ({', '.join(columns)}, dims_id) SELECT {', '.join(copied)}, d.id"
                   f" FROM {table} o JOIN dim_sets d ON d.stream = o.stream AND d.dims = o.dims")
        out.append(f"DROP TABLE {table}")
        out.append(f"ALTER TABLE new_{table} RENAME TO {table}")
    return out

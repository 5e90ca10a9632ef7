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


def needed(columns: dict[str, set[str]]) -> bool:
    """Whether a store whose tables have these columns is in the old layout."""
    return any("dims_id" not in columns[table] for table in TABLES)


def statements(stats_sql: str) -> list[str]:
    """The migration, in order: each new table made beside the old one (`new_<table>`), the
    combinations numbered, the rows copied, the old table dropped and the new one renamed.
    `stats_sql`: the backend's expression of the new stats text from `o.stats`."""
    out = [table_ddl(table).replace(f"EXISTS {table} (", f"EXISTS new_{table} (") for table in TABLES]
    union = " UNION ".join(f"SELECT stream, dims FROM {table}" for table in TABLES)
    out.append("INSERT INTO dim_sets (stream, id, dims) SELECT stream, ROW_NUMBER() OVER (PARTITION BY stream"
               f" ORDER BY dims), dims FROM ({union}) u")
    for table, columns in TABLES.items():
        copied = [f"o.{c}" if c != "stats" else f"{stats_sql} AS stats" for c in columns]
        out.append(f"INSERT INTO new_{table} ({', '.join(columns)}, dims_id) SELECT {', '.join(copied)}, d.id"
                   f" FROM {table} o JOIN dim_sets d ON d.stream = o.stream AND d.dims = o.dims")
        out.append(f"DROP TABLE {table}")
        out.append(f"ALTER TABLE new_{table} RENAME TO {table}")
    return out

"""Pane-shaped rows (panes and tier rows) in PostgreSQL: bulk loads for a merge, bulk saves,
range reads with their sketches, and the exact stats summed by the server. The PostgreSQL
counterpart of store/sqlite_tiers.py's row functions; encoding is store/row_codec.py's.

A batch's rows are loaded with one query per table (the keys passed as arrays and joined)
and saved with executemany, which psycopg 3 pipelines: a commit costs a few round trips,
not a few per pane."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import psycopg

from store import row_codec
from store.commit_plan import StoredPane
from store.panes import Pane, PaneData
from store.rollup import BucketStats

PANE_KEY = ("stream", "start_ms", "dims")
TIER_KEY = ("stream", "granule_ms", "proj", "start_ms", "dims")
SKETCHES = {"panes": "pane_sketches", "tier_rows": "tier_sketches"}
_TYPES = {"stream": "text", "start_ms": "bigint", "dims": "text", "granule_ms": "bigint", "proj": "text"}


def load(conn: psycopg.Connection, table: str, key_columns: tuple[str, ...], keys: Sequence[tuple]) -> dict[tuple, StoredPane]:
    """The stored rows (with all their sketches) among `keys`; missing keys are absent."""
    if not keys:
        return {}
    columns = ", ".join(key_columns)
    arrays = ", ".join(f"%s::{_TYPES[c]}[]" for c in key_columns)
    args = [list(column) for column in zip(*keys, strict=True)]
    joined = f"JOIN unnest({arrays}) AS k ({columns}) USING ({columns})"
    sketches: dict[tuple, list] = {}
    for *key, name, kind, blob in conn.execute(
            f"SELECT {columns}, field, kind, data FROM {SKETCHES[table]} {joined}", args):
        sketches.setdefault(tuple(key), []).append((name, kind, blob))
    out = {}
    for *key, count, stats, revision in conn.execute(
            f"SELECT {columns}, count, stats, revision FROM {table} {joined}", args):
        key = tuple(key)
        out[key] = StoredPane(row_codec.load_data(count, stats, sketches.get(key, ())), revision)
    return out


def save(conn: psycopg.Connection, table: str, key_columns: tuple[str, ...],
         rows: Iterable[tuple[tuple, int, PaneData, int]], now_ms: int, batch_id: int) -> None:
    """Insert or replace rows (key, end_ms, data, revision) of `table` and their sketches."""
    rows = list(rows)
    columns = ", ".join(key_columns)
    marks = ", ".join(["%s"] * len(key_columns))
    with conn.cursor() as cur:
        cur.executemany(
            f"INSERT INTO {table} ({columns}, end_ms, count, stats, revision, updated_at_ms, last_batch)"
            f" VALUES ({marks}, %s, %s, %s, %s, %s, %s) ON CONFLICT ({columns}) DO UPDATE SET count = excluded.count,"
            " stats = excluded.stats, revision = excluded.revision, updated_at_ms = excluded.updated_at_ms,"
            " last_batch = excluded.last_batch",
            [(*key, end, data.count, row_codec.stats_text(data), revision, now_ms, batch_id)
             for key, end, data, revision in rows])
        sketches = [(*key, *sketch) for key, _, data, _ in rows for sketch in row_codec.sketch_rows(data)]
        if sketches:
            cur.executemany(
                f"INSERT INTO {SKETCHES[table]} ({columns}, field, kind, data) VALUES ({marks}, %s, %s, %s)"
                f" ON CONFLICT ({columns}, field, kind) DO UPDATE SET data = excluded.data", sketches)


def read(conn: psycopg.Connection, table: str, where: str, args: tuple, start_ms: int, end_ms: int,
         sketches: Sequence[tuple[str, str]] | None, *, stats: bool = True, stream: str = "") -> list[Pane]:
    """Rows of `table` matching `where` that start in [start_ms, end_ms), as Panes with the
    sketches asked for ((field, kind) pairs; None: all); stats=False leaves the exact stats out."""
    span = f"{where} AND start_ms >= %s AND start_ms < %s"
    args = (*args, start_ms, end_ms)
    rows = conn.execute(
        f"SELECT start_ms, dims, end_ms, count, {'stats' if stats else 'NULL'}, revision, updated_at_ms, last_batch"
        f" FROM {table} WHERE {span} ORDER BY start_ms", args).fetchall()
    query = f"SELECT start_ms, dims, field, kind, data FROM {SKETCHES[table]} WHERE {span}"
    if sketches is None:
        found = conn.execute(query, args).fetchall()
    elif sketches:
        pairs = " OR ".join(["(field = %s AND kind = %s)"] * len(sketches))
        found = conn.execute(f"{query} AND ({pairs})", (*args, *(x for pair in sketches for x in pair))).fetchall()
    else:
        found = []
    blobs = {(s, d, name, kind): bytes(blob) for s, d, name, kind, blob in found}
    return row_codec.assemble(stream, rows, blobs, sketches)


def aggregate(conn: psycopg.Connection, table: str, where: str, args: tuple, *, start_ms: int, end_ms: int,
              origin_ms: int, bucket_ms: int, group_by: Sequence[str], filters: Mapping[str, str],
              value_field: str | None) -> list[BucketStats]:
    """Exact stats summed by the server per (bucket, stored dimensions text), as
    store/sqlite_tiers.aggregate sums them; bigint division truncates as SQLite's does."""
    clauses = [where, "start_ms >= %s", "start_ms < %s", *["COALESCE(dims::jsonb ->> %s, '') = %s"] * len(filters)]
    filter_args = [x for item in filters.items() for x in item]
    if value_field:
        field = "(stats::jsonb -> %s)"
        value = (f"SUM(({field} ->> 'n')::bigint)::bigint, SUM(({field} ->> 'sum')::float8),"
                 f" MIN(({field} ->> 'min')::float8), MAX(({field} ->> 'max')::float8)")
        value_args = [value_field] * 4
    else:
        value, value_args = "0, 0.0::float8, NULL::float8, NULL::float8", []
    sql = (f"SELECT (start_ms - %s) / %s AS bucket, dims, SUM(count)::bigint, MAX(revision), {value},"
           f" MAX(last_batch), COUNT(*) FROM {table} WHERE {' AND '.join(clauses)} GROUP BY bucket, dims")
    return row_codec.bucket_stats(
        conn.execute(sql, (origin_ms, bucket_ms, *value_args, *args, start_ms, end_ms, *filter_args)), group_by)

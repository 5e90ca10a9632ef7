"""Pane-shaped rows (panes and tier rows, each with its sketches in its `sketches` column) in
PostgreSQL: bulk loads for a merge, bulk saves, range reads, and the exact stats summed by the server. The PostgreSQL
counterpart of store/sqlite_tiers.py's row functions; encoding is store/row_codec.py's.

A batch's keys and rows go to the server with COPY into temporary tables (emptied after use),
then one join (load) or one INSERT ... ON CONFLICT (save): a commit costs a few
round trips whatever its size. Measured on a first backfill batch of 28 000 pane partials
(~100 000 tier rows): per-row parameters (executemany, key arrays) spent most of the commit's
110 s binding them in Python; COPY streams them from C."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence

import psycopg

from store import dim_sets, row_codec
from store.commit_plan import StoredPane
from store.exact_sum import exact_sum_of
from store.panes import Pane, PaneData
from store.rollup import BucketStats
from store.stored_spans import in_stored_spans

# Callers give keys with the dimensions' text last; the rows hold its number (store/dim_sets.py).
PANE_KEY = ("stream", "start_ms", "dims_id")
TIER_KEY = ("stream", "granule_ms", "proj", "start_ms", "dims_id")
_TYPES = {"stream": "text", "start_ms": "bigint", "dims_id": "bigint", "granule_ms": "bigint", "proj": "text"}
_ROW = ("end_ms", "count", "stats", "revision", "updated_at_ms", "last_batch", "sketches")


# The server's type of every column COPY writes (store/postgres/schema.py: text, BIGINT, BYTEA): COPY
# goes in binary, where each value must come in its column's own type. In text format every byte of
# a batch's sketches went as two hex digits, parsed back by the server: a commit's COPY of its ~1 000
# tier rows took ~90 ms (bench.steady_commits, session 92), ~60 ms in binary.
_COPY_TYPES = {**_TYPES, "stats": "text", "sketches": "bytea",
               **{c: "bigint" for c in ("end_ms", "count", "revision", "updated_at_ms", "last_batch", "batch_id",
                                        "count_added", "at_ms", "correction_id", "time_ms", "log_partition",
                                        "log_offset", "matched")},
               "join_name": "text", "join_key": "text", "dims": "text", "id": "bigint", "pipeline": "text",
               **{c: "bigint" for c in ("pane_start_ms", "pane_end_ms", "revision_from", "revision_to",
                                        "events_added")},
               "old": "text", "new": "text"}


def copy_rows(conn: psycopg.Connection, table: str, columns: Sequence[str], rows: Iterable[Sequence]) -> None:
    """COPY rows into `table` (these columns, each named in _COPY_TYPES), in binary."""
    with conn.cursor() as cur, cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types([_COPY_TYPES[c] for c in columns])
        for row in rows:
            copy.write_row(row)


_STAGING = {  # temporary table -> its definition; one set per pooled connection
    "keys_panes": ", ".join(f"{c} {_TYPES[c]}" for c in PANE_KEY),
    "keys_tier_rows": ", ".join(f"{c} {_TYPES[c]}" for c in TIER_KEY),
    **{f"staged_{t}": f"LIKE {t}" for t in ("panes", "tier_rows", "join_left", "join_right")},
}
# The staged rows' sketches stored as they come, uncompressed: they are compressed once, into the
# table they go to (lz4: store/postgres/schema.py). Staged with the table's compression, each blob of
# a batch was compressed in the throwaway table, which was most of the COPY's time.
_STAGED_AS_THEY_COME = [f"ALTER TABLE staged_{t} ALTER COLUMN sketches SET STORAGE EXTERNAL"
                        for t in ("panes", "tier_rows")]
_staged_on: weakref.WeakSet = weakref.WeakSet()  # connections that have them
# Per connection, its tables that have dead rows since their VACUUM (only those are vacuumed: a
# commit without window joins leaves their staging tables alone).
_emptied_on: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Autovacuum never visits a session's temporary tables, so the rows each use deletes stayed in
# them: after 58 commits of bench.steady_commits --mix, 218 MB in staged_tier_rows, and every
# upsert's scan of it grew slower (a stream's tier rows 7 ms a statement in the first quarter, 25
# ms in the last; the commit's median 457 ms). Vacuumed before each writer's transaction: 3-4 ms,
# the tables stay at a few hundred KB, the median was 262 ms. (TRUNCATE in each use instead: 289
# ms, new files for every table at each use.)


def ensure_staging(conn: psycopg.Connection) -> None:
    """The temporary tables bulk loads and saves go through, made once per connection (they
    live as long as the session), and vacuumed of the rows earlier uses left dead. Each use
    empties its table in the same round trip as its last statement, and a failed transaction
    takes its rows back with it. (ON COMMIT DELETE ROWS would truncate them at every commit: new
    files each time, which made a commit of 10 panes cost twice as much.)

    Writers call this before they open their transaction: made outside a transaction, the
    tables last as long as the session. Made inside one (a caller that did not), they are
    made again at the next use: a transaction that rolls back (a lock timeout the commit is
    retried after, a value the server refuses) drops the tables it created with it, and a
    connection remembered as having them would then fail every later commit with
    UndefinedTable."""
    if conn not in _staged_on:
        conn.execute("; ".join([*(f"CREATE TEMP TABLE IF NOT EXISTS {name} ({definition})"
                                  for name, definition in _STAGING.items()), *_STAGED_AS_THEY_COME]))
        if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:  # no transaction to undo them
            _staged_on.add(conn)
    elif (_emptied_on.get(conn) and conn.autocommit
          and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE):  # VACUUM runs in none
        conn.execute(f"VACUUM {', '.join(sorted(_emptied_on.pop(conn)))}")


def _emptied(conn: psycopg.Connection, table: str) -> None:
    """`table` (a staging table) will have dead rows once this use empties it."""
    _emptied_on.setdefault(conn, set()).add(table)


def load(conn: psycopg.Connection, table: str, key_columns: tuple[str, ...], keys: Sequence[tuple]) -> dict[tuple, StoredPane]:
    """The stored rows (with all their sketches) among `keys` (the dimensions' text last);
    missing keys are absent."""
    with conn.cursor() as cur:
        keys = in_stored_spans(cur, "%s", table, key_columns, keys, _TYPES)  # none, for a backfill into new time
    if not keys:
        return {}
    ensure_staging(conn)
    with conn.cursor() as cur:
        by_number = {number: key for key, number in dim_sets.numbered(cur, "%s", keys).items()}
    keys = list(by_number)
    columns = ", ".join(key_columns)
    staged = f"keys_{table}"
    copy_rows(conn, staged, key_columns, keys)
    _emptied(conn, staged)
    # One round trip: the join, and the staged keys dropped (a second load in this transaction starts
    # empty). Its rows in binary: the sketches as they are, where text would send each byte as two hex digits.
    with conn.pipeline(), conn.cursor(binary=True) as cur:
        cur.execute(f"SELECT {columns}, count, stats, revision, sketches FROM {table} JOIN {staged} USING ({columns})")
        conn.execute(f"DELETE FROM {staged}")
        return {by_number[tuple(key)]: StoredPane(row_codec.load_data(count, stats, blob), revision)
                for *key, count, stats, revision, blob in cur.fetchall()}


def save(conn: psycopg.Connection, table: str, key_columns: tuple[str, ...],
         rows: Iterable[tuple[tuple, int, PaneData, int]], now_ms: int, batch_id: int) -> dict[tuple, tuple]:
    """Insert or replace rows (key with the dimensions' text last, end_ms, data, revision) of
    `table` with their sketches: save_rows of them encoded."""
    return save_rows(conn, table, key_columns, row_codec.encoded_rows(rows), now_ms, batch_id)


def save_rows(conn: psycopg.Connection, table: str, key_columns: tuple[str, ...],
              rows: Sequence[tuple[tuple, int, int, str, int, bytes]], now_ms: int, batch_id: int) -> dict[tuple, tuple]:
    """Insert or replace rows (key with the dimensions' text last, end_ms, count, stats text,
    revision, sketches blob: store/row_codec.py's encoding) of `table`; of rows with the same key,
    the last one is kept (one INSERT may not touch a row twice). Returns each key as stored (the
    text's number last)."""
    latest = {row[0]: row for row in rows}
    if not latest:
        return {}
    ensure_staging(conn)
    with conn.cursor() as cur:
        number = dim_sets.numbered(cur, "%s", latest)
    _upsert_unique(conn, table, (*key_columns, *_ROW), key_columns, _ROW,
                   ((*number[key], end, count, text, revision, now_ms, batch_id, blob)
                    for key, end, count, text, revision, blob in latest.values()))
    return number


def upsert(conn: psycopg.Connection, table: str, columns: Sequence[str], key: Sequence[str], updates: Sequence[str],
           rows: Sequence[tuple]) -> None:
    """INSERT rows (`columns` of `table`) ON CONFLICT (`key`) DO UPDATE SET `updates` from the
    new row, through the table's staging copy: COPY, then one statement, where an executemany
    sends and binds each row (a batch's window-join events were ~7 % of the service's commit, session
    93). Of rows with the same key the last is kept, as one after the other would leave it (one
    INSERT may not touch a row twice)."""
    at = [columns.index(c) for c in key]
    latest = list({tuple(row[i] for i in at): row for row in rows}.values())
    if latest:
        ensure_staging(conn)
        _upsert_unique(conn, table, columns, key, updates, latest)


def _upsert_unique(conn: psycopg.Connection, table: str, columns: Sequence[str], key: Sequence[str],
                   updates: Sequence[str], rows: Iterable[Sequence]) -> None:
    """upsert of rows with distinct keys (save_rows' and upsert's common part)."""
    staged = f"staged_{table}"
    _emptied(conn, staged)
    copy_rows(conn, staged, columns, rows)
    names = ", ".join(columns)
    conn.execute(  # one round trip: the upsert, and the staging emptied for the next use in this transaction
        f"INSERT INTO {table} ({names}) SELECT {names} FROM {staged} ON CONFLICT ({', '.join(key)})"
        f" DO UPDATE SET {', '.join(f'{c} = excluded.{c}' for c in updates)}; DELETE FROM {staged}")


def read(conn: psycopg.Connection, table: str, where: str, args: tuple, start_ms: int, end_ms: int,
         sketches: Sequence[tuple[str, str]] | None, *, stats: bool = True, stream: str = "",
         keep: Callable[[int, str], bool] | None = None) -> list[Pane]:
    """Rows of `table` matching `where` that start in [start_ms, end_ms), as Panes with the
    sketches asked for ((field, kind) pairs; None: all); stats=False leaves the exact stats out.
    `keep(start, dims text)`: only the rows it takes are decoded (a fold's shard, store/tier_folds.py)."""
    span = f"{where} AND start_ms >= %s AND start_ms < %s"
    args = (*args, start_ms, end_ms)
    rows = conn.execute(
        "SELECT t.start_ms, d.dims, t.end_ms, t.count, t.stats, t.revision, t.updated_at_ms, t.last_batch, t.sketches"
        " FROM " + dim_sets.joined(f"SELECT stream, dims_id, start_ms, end_ms, count, {'stats' if stats else 'NULL'}"
                                   f" AS stats, revision, updated_at_ms, last_batch,"
                                   f" {row_codec.sketches_column(sketches)} AS sketches FROM {table} WHERE {span}")
        + " ORDER BY t.start_ms", args).fetchall()
    if keep is not None:
        rows = [row for row in rows if keep(row[0], row[1])]
    return row_codec.assemble(stream, rows, sketches)


_SUM_AT = 6  # the value sum's column in aggregate()'s rows: bucket, stream, dims_id, count, revision, n, sum, ...


def _parts_summed(rows: Iterable[tuple]) -> Iterable[tuple]:
    """aggregate()'s rows with the value sum's parts (one per stored row) added exactly."""
    for row in rows:
        yield (*row[:_SUM_AT], exact_sum_of(row[_SUM_AT]), *row[_SUM_AT + 1:])


def aggregate(conn: psycopg.Connection, table: str, where: str, args: tuple, *, start_ms: int, end_ms: int,
              origin_ms: int, bucket_ms: int, group_by: Sequence[str], filters: Mapping[str, str],
              value_field: str | None, one_row_per_bucket: bool = False) -> list[BucketStats]:
    """Exact stats summed by the server per (bucket, dimensions' number), with the texts joined
    after, as store/sqlite_tiers.aggregate sums them (filters and one_row_per_bucket too); bigint
    division truncates as SQLite's does."""
    def agg(fn: str, expr: str) -> str:
        return expr if one_row_per_bucket else f"{fn}({expr})"

    clauses = [where, "start_ms >= %s", "start_ms < %s"]
    filter_args: list = []
    if filters:
        tests = " AND ".join(["COALESCE(f.dims::jsonb ->> %s, '') = %s"] * len(filters))
        clauses.append(f"dims_id IN (SELECT f.id FROM dim_sets f WHERE f.stream = %s AND {tests})")
        filter_args = [args[0], *(x for item in filters.items() for x in item)]  # every `where` starts with the stream
    if value_field:
        # json, not jsonb: ->> gives each number's text as written, and float8 reads it as SQLite and
        # Python do; jsonb holds numbers as numeric, which has no -0.0 (a min or max of -0.0 came back 0.0).
        field = "(stats::json -> %s)"
        # The sum's parts come back per row (array_agg) and are added exactly rounded here
        # (store/exact_sum.py), as the pane roll-up and the tier rows add: SUM over float8 rounds
        # at each step, and over numeric the parts are cast at 15 digits, neither the same.
        value = ", ".join(agg(fn, f"({field} ->> {i})::{kind}") + cast
                          for i, (fn, kind, cast) in enumerate((("SUM", "bigint", "::bigint"),
                                                               ("array_agg", "float8", ""),
                                                               ("MIN", "float8", ""), ("MAX", "float8", ""))))
        value_args = [value_field] * 4
    else:
        value, value_args = "0, 0.0::float8, NULL::float8, NULL::float8", []
    grouped = (f"SELECT (start_ms - %s) / %s AS bucket, stream, dims_id, {agg('SUM', 'count')}::bigint,"
               f" {agg('MAX', 'revision')}, {value}, {agg('MAX', 'last_batch')}, {'1' if one_row_per_bucket else 'COUNT(*)'}"
               f" FROM {table} WHERE {' AND '.join(clauses)}"
               f"{'' if one_row_per_bucket else ' GROUP BY bucket, stream, dims_id'}")
    found = conn.execute(f"SELECT g.*, d.dims FROM {dim_sets.joined(grouped, 'g')}",
                         (origin_ms, bucket_ms, *value_args, *args, start_ms, end_ms, *filter_args))
    if value_field and not one_row_per_bucket:
        found = _parts_summed(found)
    return row_codec.bucket_stats(((bucket, dims, *rest) for bucket, _, _, *rest, dims in found), group_by)

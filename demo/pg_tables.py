"""The demo's tables in PostgreSQL (setting `demo_postgres_dsn`): instead of POSTing the rows of
its table streams (the `users` of demo/users.py, and any other `kind: table` stream of the
catalog) to the API, the producer writes them into tables of that database, and the service
feeds the table streams from there by change data capture (ingest/cdc/, docs/tables.md).

One rule on both sides (catalog.cdc.postgres_fed_tables): every table stream without a source
of its own is the table `sketchboard_demo.<stream>`, keyed by its key_field (the primary key,
so deletes carry it), its dimensions text columns and its values float8 columns. The producer
creates the schema and the tables (and adds a column the catalog has gained); the service's
follower creates the publication and the slot. A row equal to the one stored is not written
again, so a restarted demo's initial load makes no changes for CDC to carry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import psycopg
from psycopg import sql

from catalog import Catalog, StreamDef
from catalog.cdc import postgres_fed_tables, resolve_dsn, with_postgres_sources
from catalog.tables import OP_FIELD

SCHEMA = "sketchboard_demo"


def fed_catalog(catalog: Catalog, dsn: str) -> Catalog:
    """The catalog as the service runs it when the demo's tables come from PostgreSQL."""
    return with_postgres_sources(catalog, dsn, SCHEMA)


def table_columns(stream: StreamDef) -> list[tuple[str, str]]:
    """(column, SQL type) of the stream's PostgreSQL table, the key first."""
    assert stream.key_field is not None
    dims = [(d, "text") for d in stream.dimensions if d not in (OP_FIELD, stream.key_field)]
    return [(stream.key_field, "text"), *dims, *((v, "float8") for v in stream.values)]


class PostgresTables:
    """Writes rows of the catalog's table streams into their PostgreSQL tables (upserts, one
    transaction per call). The connection is made on first use and again after it broke."""

    def __init__(self, dsn: str, catalog: Catalog, env: Mapping[str, str] | None = None):
        self.dsn = resolve_dsn(dsn, env)  # ValueError naming a ${NAME} that is not set
        self.tables = {s.name: s for s in postgres_fed_tables(catalog)}
        self._conn: psycopg.Connection | None = None

    def write(self, table: str, rows: Sequence[Mapping]) -> int:
        """Upsert `rows` (dicts by field; others ignored; a missing one is null) into `table` in
        one statement; returns the rows that changed something. psycopg.Error when the database
        cannot be written (then nothing was)."""
        typed = table_columns(self.tables[table])
        columns = [c for c, _ in typed]
        key, rest = columns[0], columns[1:]
        # One array per column, unnested into rows: one round trip for a whole initial load.
        insert = sql.SQL("INSERT INTO {} AS t ({}) SELECT * FROM unnest({}) ON CONFLICT ({}) ").format(
            sql.Identifier(SCHEMA, table), sql.SQL(", ").join(map(sql.Identifier, columns)),
            sql.SQL(", ").join(sql.SQL("%s::{}[]").format(sql.SQL(kind)) for _, kind in typed), sql.Identifier(key))
        if rest:  # only a row that differs is written: no change for CDC to carry otherwise
            names = sql.SQL(", ").join(sql.SQL("t.{}").format(sql.Identifier(c)) for c in rest)
            excluded = sql.SQL(", ").join(sql.SQL("excluded.{}").format(sql.Identifier(c)) for c in rest)
            insert += sql.SQL("DO UPDATE SET ({}) = ROW({}) WHERE ROW({}) IS DISTINCT FROM ROW({})").format(
                sql.SQL(", ").join(map(sql.Identifier, rest)), excluded, names, excluded)
        else:
            insert += sql.SQL("DO NOTHING")
        latest = {row[key]: row for row in rows}  # one statement may not touch a row twice: the newest wins
        try:
            cur = self._connection().execute(insert, [[row.get(c) for row in latest.values()] for c in columns])
            return cur.rowcount
        except psycopg.OperationalError:
            self.close()  # a broken connection: the next call makes a new one
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            conn = psycopg.connect(self.dsn, autocommit=True)
            try:
                self._create(conn)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _create(self, conn: psycopg.Connection) -> None:
        """The schema and each table, and any column the catalog declares that a table lacks
        (a column added to the demo's config since the table was made)."""
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(SCHEMA)))
        for name, stream in self.tables.items():
            key, *rest = table_columns(stream)
            conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({} text PRIMARY KEY)").format(
                sql.Identifier(SCHEMA, name), sql.Identifier(key[0])))
            for column, kind in rest:
                conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
                    sql.Identifier(SCHEMA, name), sql.Identifier(column), sql.SQL(kind)))

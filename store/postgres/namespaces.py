"""Namespaces as PostgreSQL schemas (store/namespace_storage.py): `<root schema>__<name>` in the
root's database, reached from the root's connection by qualified names; a switch's transaction
holds the commit lock the pipelines' commits hold."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager

import psycopg

from store.connection import Db
from store.namespace import ROOT, postgres_schema, quote_ident
from store.namespace_storage import NamespaceStorage
from store.postgres.db import _Rows, _sql
from store.postgres.notify import channel_for, notify_commit
from store.postgres.schema import COMMIT_LOCK


class _ConnectionDb(Db):
    """One connection, in the caller's transaction."""

    greatest = "GREATEST"

    def __init__(self, conn: psycopg.Connection):
        self.conn = conn

    def execute(self, sql: str, args: Sequence = ()):
        return _Rows(self.conn.execute(_sql(sql), args))

    def executemany(self, sql: str, rows) -> None:
        with self.conn.cursor() as cur:
            cur.executemany(_sql(sql), rows)

    def insert_id(self, sql: str, args: Sequence = ()) -> int:
        return self.execute(sql + " RETURNING id", args).fetchone()[0]

    def transaction(self):
        return self.conn.transaction()

    def create(self, ddl: str) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.conn.close()


class PostgresNamespaces(NamespaceStorage):
    def __init__(self, dsn: str):
        self.dsn = dsn

    def _schema(self, conn: psycopg.Connection, namespace: str) -> str:
        return postgres_schema(namespace, conn.execute("SELECT current_schema()").fetchone()[0])

    def exists(self, namespace: str) -> bool:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return conn.execute("SELECT 1 FROM information_schema.schemata WHERE schema_name = %s",
                                (self._schema(conn, namespace),)).fetchone() is not None

    def transaction(self, namespaces: Sequence[str]):
        @contextmanager
        def block():
            with psycopg.connect(self.dsn, autocommit=True) as conn, conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (COMMIT_LOCK,))
                yield _ConnectionDb(conn), {ns: quote_ident(self._schema(conn, ns)) for ns in namespaces}
                # Delivered at commit, as a batch's: API replicas' hubs read the `switched` record at once.
                notify_commit(conn, channel_for(conn.execute("SELECT current_schema()").fetchone()[0]), None)
        return block()

    def drop(self, namespace: str) -> None:
        if namespace == ROOT:
            raise ValueError("the store's root is never dropped")
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(self._schema(conn, namespace))} CASCADE")

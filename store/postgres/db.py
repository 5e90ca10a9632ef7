"""store.connection.Db on PostgreSQL, for the side stores (lag samples, Spark progress,
alerts): their SQL as written for both backends, `?` parameters turned into psycopg's `%s`,
their SQLite-flavoured DDL translated, on the pane store's connection pool."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager

import psycopg
from psycopg_pool import ConnectionPool

from store.connection import Db
from store.postgres.schema import SCHEMA_LOCK, SIDE_LOCK, order_keys_by_code_point, translate_ddl


def _sql(sql: str) -> str:
    if "%" in sql:
        raise ValueError("a literal % would be read as a psycopg placeholder; pass it as a parameter")
    return sql.replace("?", "%s")


@contextmanager
def snapshot(conn: psycopg.Connection) -> Iterator[psycopg.Connection]:
    """A read-only transaction whose statements all see one snapshot (REPEATABLE READ): at READ
    COMMITTED, a plain transaction's, each statement sees the commits made before it began, so
    reads that must agree (a batch's counters and its offsets) could straddle a commit."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield conn


class _Rows:
    """A statement's rows, fetched before its connection goes back to the pool."""

    def __init__(self, cursor: psycopg.Cursor):
        self.rowcount = cursor.rowcount
        self._rows = cursor.fetchall() if cursor.description is not None else []

    def fetchone(self):
        return self._rows[0] if self._rows else None

    def fetchall(self) -> list:
        return list(self._rows)

    def __iter__(self) -> Iterator:
        return iter(self._rows)


class PostgresDb(Db):
    greatest = "GREATEST"

    def __init__(self, pool: ConnectionPool):
        self._pool = pool  # the pane store's: it closes it
        self._local = threading.local()  # the connection of the transaction this thread is in

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection]:
        held = getattr(self._local, "conn", None)
        if held is not None:
            yield held
        else:
            with self._pool.connection() as conn:
                yield conn

    def execute(self, sql: str, args: Sequence = ()):
        with self._connection() as conn:
            return _Rows(conn.execute(_sql(sql), args))

    def executemany(self, sql: str, rows: Sequence[Sequence]) -> None:
        if rows:
            with self._connection() as conn, conn.cursor() as cur:
                cur.executemany(_sql(sql), rows)

    def insert_id(self, sql: str, args: Sequence = ()) -> int:
        return self.execute(sql + " RETURNING id", args).fetchone()[0]

    def transaction(self) -> AbstractContextManager[Db]:
        """One transaction that waits for, and holds off, every other side-store transaction on
        this schema (the namespace's), as SQLite's BEGIN IMMEDIATE does on its file: the side
        stores check, then write (a consumer per namespace, one going run per stream, a rule
        or dashboard name not yet taken, a removed file rule's end recorded once), which READ
        COMMITTED alone lets two writers both pass. A transaction-level advisory lock of its
        own (SIDE_LOCK, the schema's name hashed): pane commits (COMMIT_LOCK) neither wait for
        it nor hold it off."""
        return self._transaction(SIDE_LOCK)

    def _transaction(self, lock: int | None) -> AbstractContextManager[Db]:
        @contextmanager
        def block() -> Iterator[Db]:
            with self._pool.connection() as conn, conn.transaction():
                if lock is not None:
                    conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(current_schema()))", (lock,))
                self._local.conn = conn
                try:
                    yield self
                finally:
                    self._local.conn = None
        return block()

    def create(self, ddl: str) -> None:
        with self._transaction(None), self._connection() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))  # concurrent CREATEs can collide
            conn.execute(translate_ddl(ddl))
            order_keys_by_code_point(conn)  # a side store's tables from before

    def close(self) -> None:
        """The pool is the pane store's; nothing of its own to release."""

"""Every serving-store backend behind one interface for the store's contract tests: the
`store_backend` fixture (tests/conftest.py) is parametrized over these, so one test runs
against SQLite and against a real PostgreSQL server without being copied."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path

from store import PaneStore, SqlitePaneStore


class StoreBackend:
    """Makes stores, each in storage of its own, and closes them all at the end."""

    kind: str

    def __init__(self) -> None:
        self._opened: list[PaneStore] = []

    def _keep(self, store: PaneStore) -> PaneStore:
        self._opened.append(store)
        return store

    def create(self, *, linguistic: bool = False) -> PaneStore:
        """A store over new, empty storage. `linguistic`: where the storage has a default text
        order, a linguistic one (PostgreSQL: a database collated en-US, as deployments' usually
        are), for tests of what must be in code-point order whatever it is; SQLite has none."""
        raise NotImplementedError

    def reopen(self, store: PaneStore) -> PaneStore:
        """Another store over the same storage as `store` (a process restart)."""
        raise NotImplementedError

    def side_db(self, store: PaneStore | None = None):
        """A store.connection.Db for side stores (lag, health, alerts) beside `store`'s tables
        (a new store when None); the pane store stays open until the test ends."""
        return (store or self.create()).side_db()

    def tables(self, store: PaneStore, names: Sequence[str]) -> dict[str, list]:
        """Every row of these tables, sorted: what a test compares to show nothing changed."""
        raise NotImplementedError

    def set_schema_version(self, store: PaneStore, version: int) -> None:
        """Record another schema version in the store's storage (as another Sketchboard would)."""
        raise NotImplementedError

    def close(self) -> None:
        for store in self._opened:
            store.close()


class SqliteBackend(StoreBackend):
    kind = "sqlite"

    def __init__(self, mkdir: Callable[[], Path]):
        super().__init__()
        self._mkdir = mkdir

    def create(self, *, linguistic: bool = False) -> PaneStore:
        return self._keep(SqlitePaneStore(self._mkdir() / "store.db", synchronous="OFF"))  # tests need no fsync

    def reopen(self, store: PaneStore) -> PaneStore:
        return self._keep(SqlitePaneStore(store.path))

    def tables(self, store: PaneStore, names: Sequence[str]) -> dict[str, list]:
        with sqlite3.connect(store.path) as conn:
            return {name: sorted(conn.execute(f"SELECT * FROM {name}").fetchall()) for name in names}

    def set_schema_version(self, store: PaneStore, version: int) -> None:
        with sqlite3.connect(store.path) as conn:
            conn.execute(f"PRAGMA user_version = {int(version)}")


class PostgresBackend(StoreBackend):
    kind = "postgres"

    def __init__(self, server):
        super().__init__()
        self._server = server  # tests.postgres_server.PostgresServer

    def create(self, *, linguistic: bool = False) -> PaneStore:
        from store.postgres import PostgresPaneStore

        self._give_back_closed()
        dsn = self._server.fresh_dsn(self._server.linguistic_database()) if linguistic else self._server.fresh_dsn()
        # A small pool: a test opens many stores, and each process would hold its connections.
        return self._keep(PostgresPaneStore(dsn, pool_size=2))

    def _give_back_closed(self) -> None:
        """Schemas whose stores the test closed (a property test's examples) can serve the next."""
        by_dsn: dict[str, list] = {}
        for store in self._opened:
            by_dsn.setdefault(store.dsn, []).append(store)
        for dsn, stores in by_dsn.items():
            if all(s.closed for s in stores):
                self._server.give_back(dsn)
                self._opened = [s for s in self._opened if s.dsn != dsn]

    def close(self) -> None:
        super().close()
        self._give_back_closed()

    def reopen(self, store: PaneStore) -> PaneStore:
        from store.postgres import PostgresPaneStore

        return self._keep(PostgresPaneStore(store.dsn, pool_size=2))

    def tables(self, store: PaneStore, names: Sequence[str]) -> dict[str, list]:
        import psycopg

        with psycopg.connect(store.dsn) as conn:
            return {name: sorted(conn.execute(f"SELECT * FROM {name}").fetchall(), key=repr) for name in names}

    def set_schema_version(self, store: PaneStore, version: int) -> None:
        import psycopg

        with psycopg.connect(store.dsn, autocommit=True) as conn:
            conn.execute("UPDATE store_meta SET value = %s WHERE key = 'schema_version'", (str(version),))

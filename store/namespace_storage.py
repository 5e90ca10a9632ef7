"""Namespaces as storage (issue 16): whether one exists, one transaction that reaches several
from the root's connection (what a switch needs: store/switch.py), and deleting one (a drop).
The embedded store keeps a namespace in its own SQLite file (reached by ATTACH DATABASE),
PostgreSQL in its own schema of the same database (reached by qualified names); the names are
store/namespace.py's."""

from __future__ import annotations

import shutil
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from store.connection import Db, SqliteDb, open_connection, transaction
from store.namespace import ROOT, sqlite_store_path


class NamespaceStorage(ABC):
    @abstractmethod
    def exists(self, namespace: str) -> bool: ...

    @abstractmethod
    def transaction(self, namespaces: Sequence[str]) -> AbstractContextManager[tuple[Db, dict[str, str]]]:
        """One transaction on the root, under the pipelines' commit lock, that also reaches
        `namespaces` (which must exist: their tables made by opening a store there): the Db and
        each namespace's qualifier for store.switch.Side."""

    @abstractmethod
    def drop(self, namespace: str) -> None:
        """Delete the namespace and everything in it (never the root)."""


class SqliteNamespaces(NamespaceStorage):
    def __init__(self, data_dir: Path, *, busy_timeout_s: float = 30.0):
        self.data_dir = Path(data_dir)
        self.busy_timeout_s = busy_timeout_s

    def exists(self, namespace: str) -> bool:
        return sqlite_store_path(self.data_dir, namespace).exists()

    def transaction(self, namespaces: Sequence[str]):
        @contextmanager
        def block() -> Iterator[tuple[Db, dict[str, str]]]:
            conn = open_connection(sqlite_store_path(self.data_dir, ROOT), busy_timeout_s=self.busy_timeout_s)
            try:
                qualifiers = {}
                for i, namespace in enumerate(namespaces):
                    alias = f"ns{i}"
                    conn.execute(f"ATTACH DATABASE ? AS {alias}", (str(sqlite_store_path(self.data_dir, namespace)),))
                    qualifiers[namespace] = alias
                # BEGIN IMMEDIATE on the root: the pipelines' commits wait for it, as for each other.
                # In WAL mode SQLite commits each attached file atomically, not all of them as one:
                # the root's part (what readers read) is atomic; a crash between the files' commits can
                # leave the kept copy in `previous-...` incomplete, never the served output.
                with transaction(conn):
                    yield SqliteDb(conn), qualifiers
            finally:
                conn.close()
        return block()

    def drop(self, namespace: str) -> None:
        if namespace == ROOT:
            raise ValueError("the store's root is never dropped")
        folder = sqlite_store_path(self.data_dir, namespace).parent
        if folder.exists():
            shutil.rmtree(folder)

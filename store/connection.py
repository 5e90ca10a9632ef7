"""Opening the store's SQLite file: every store module (panes, bloom filters, lag samples,
Spark progress, alerts) uses its own connection to the same file, set up the same way."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def open_connection(path: Path, *, synchronous: str | None = "NORMAL", busy_timeout_s: float = 30.0) -> sqlite3.Connection:
    """Autocommit (transactions are explicit), shareable across threads (callers hold a lock),
    WAL so readers see the last commit while another process writes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    if synchronous is not None:
        conn.execute(f"PRAGMA synchronous={synchronous}")
    return conn


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any error (nothing half-written)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def where(*conditions: tuple[str, object]) -> tuple[str, list]:
    """" WHERE a = ? AND ..." and its arguments from (clause, value) pairs, skipping the pairs
    whose value is None (filters the caller did not ask for); "" when none is left."""
    kept = [(clause, value) for clause, value in conditions if value is not None]
    if not kept:
        return "", []
    return " WHERE " + " AND ".join(clause for clause, _ in kept), [value for _, value in kept]


class SideStore:
    """A store module with its own tables and connection in the store's file (lag samples,
    Spark progress, alerts): the connection, the lock that guards it, the schema, close()."""

    def __init__(self, path: str | Path, schema: str, *, synchronous: str = "NORMAL", busy_timeout_s: float = 30.0):
        self.path = Path(path)
        self._conn = open_connection(self.path, synchronous=synchronous, busy_timeout_s=busy_timeout_s)
        self._lock = threading.Lock()
        with self._lock:
            self._conn.executescript(schema)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

"""Opening the store's SQLite file: every store module (panes, bloom filters, lag samples,
Spark progress) uses its own connection to the same file, set up the same way."""

from __future__ import annotations

import sqlite3
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

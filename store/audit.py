"""The audit log: who changed what (alert rules, silences, tokens, ...), beside the panes (the
store's SQLite file with its own connection, or the PostgreSQL store's database: a
store/connection.py Db, as the lag and alert stores). Every write prunes entries older than
the retention."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from store.connection import Db, SideStore

_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms INTEGER NOT NULL,
    actor TEXT NOT NULL,      -- the token's name; 'anonymous' on an open service; 'cli:<user>'
    client TEXT,              -- the client's address, where there is one
    action TEXT NOT NULL,     -- 'PUT /api/v1/alerts/rules/x', 'token.create', ...
    target TEXT,              -- what it changed: a path or a token's name
    status INTEGER,           -- the HTTP status answered
    detail TEXT               -- JSON: the request body (bounded), a token's scopes
);
CREATE INDEX IF NOT EXISTS audit_log_by_time ON audit_log (at_ms);
"""


@dataclass(frozen=True)
class AuditEntry:
    id: int
    at_ms: int
    actor: str
    client: str | None
    action: str
    target: str | None
    status: int | None
    detail: Any

    def to_dict(self) -> dict:
        return asdict(self)


class AuditStore(SideStore):
    def __init__(self, path: str | Path | Db, *, retention_ms: int = 365 * 86_400_000, synchronous: str = "NORMAL",
                 busy_timeout_s: float = 30.0):
        if retention_ms <= 0:
            raise ValueError(f"audit retention must be positive, got {retention_ms} ms")
        super().__init__(path, _SCHEMA, synchronous=synchronous, busy_timeout_s=busy_timeout_s)
        self.retention_ms = retention_ms

    def record(self, at_ms: int, actor: str, action: str, *, target: str | None = None, client: str | None = None,
               status: int | None = None, detail: Any = None) -> int:
        with self._lock, self._conn.transaction() as conn:
            new_id = conn.insert_id(
                "INSERT INTO audit_log (at_ms, actor, client, action, target, status, detail) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (at_ms, actor, client, action, target, status, None if detail is None else json.dumps(detail)))
            conn.execute("DELETE FROM audit_log WHERE at_ms < ?", (at_ms - self.retention_ms,))
            return new_id

    def entries(self, *, limit: int = 100, after_id: int | None = None) -> list[AuditEntry]:
        """Newest first; with after_id, the entries after it, oldest first (to tail the log)."""
        with self._lock:
            if after_id is None:
                rows = self._conn.execute(
                    "SELECT id, at_ms, actor, client, action, target, status, detail FROM audit_log"
                    " ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
            else:
                rows = self._conn.execute(
                    "SELECT id, at_ms, actor, client, action, target, status, detail FROM audit_log"
                    " WHERE id > ? ORDER BY id LIMIT ?", (after_id, limit)).fetchall()
        return [AuditEntry(*row[:7], json.loads(row[7]) if row[7] is not None else None) for row in rows]

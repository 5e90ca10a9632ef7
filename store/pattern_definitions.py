"""Patterns defined through the API (`/api/v1/patterns`, issue 24), on the store's backend
(SQLite file or PostgreSQL) with a connection of their own, like dashboards and alert rules.

The store keeps each declaration as a JSON document and knows nothing of steps or streams
(catalog/patterns.py checks them before they get here). Patterns declared in the configuration
are not stored here: the configuration is their source of truth.

`pattern_definitions_version` is one counter bumped in the same transaction as every create,
replace and delete: the pipeline reads it once per batch (one row) and the API once a second,
and reload the definitions only when it moved. Each definition keeps the counter's value of its
last change as its own `version`, so a pattern deleted and created again under the same name has
a version it never had: its runner starts from nothing (aggregates/pattern_definitions.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from store.connection import Db, SideStore

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pattern_definitions (
    name TEXT PRIMARY KEY,
    definition TEXT NOT NULL,        -- JSON: the declaration, checked against the catalog
    version INTEGER NOT NULL,        -- the counter's value at its last create or replace
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS pattern_definitions_version (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL         -- bumped by every change: what readers poll
);
"""

_COLUMNS = "name, definition, version, created_ms, updated_ms"


class PatternConflict(Exception):
    """A name already taken by a stored pattern (create)."""


@dataclass(frozen=True)
class StoredPattern:
    name: str
    definition: dict
    version: int
    created_ms: int
    updated_ms: int


class PatternDefinitionStore(SideStore):
    def __init__(self, target: str | Path | Db, *, synchronous: str = "NORMAL", busy_timeout_s: float = 30.0):
        super().__init__(target, _SCHEMA, synchronous=synchronous, busy_timeout_s=busy_timeout_s)

    def version(self) -> int:
        """The counter of changes (0: none ever): equal versions mean equal definitions."""
        with self._lock:
            row = self._conn.execute("SELECT version FROM pattern_definitions_version WHERE id = 1").fetchone()
        return 0 if row is None else int(row[0])

    def patterns(self) -> tuple[int, list[StoredPattern]]:
        """(the counter, every stored pattern by name), read together."""
        with self._lock, self._conn.transaction() as conn:
            row = conn.execute("SELECT version FROM pattern_definitions_version WHERE id = 1").fetchone()
            rows = conn.execute(f"SELECT {_COLUMNS} FROM pattern_definitions ORDER BY name").fetchall()
        return (0 if row is None else int(row[0])), [_row(r) for r in rows]

    def pattern(self, name: str) -> StoredPattern | None:
        with self._lock:
            row = self._conn.execute(f"SELECT {_COLUMNS} FROM pattern_definitions WHERE name = ?", (name,)).fetchone()
        return None if row is None else _row(row)

    def create(self, name: str, definition: Mapping, *, now_ms: int) -> StoredPattern:
        with self._lock, self._conn.transaction() as conn:
            version = _bump(conn)  # first: its row lock orders concurrent writers, so the check below holds
            if conn.execute("SELECT 1 FROM pattern_definitions WHERE name = ?", (name,)).fetchone():
                raise PatternConflict(f"a pattern named {name!r} already exists; PUT /api/v1/patterns/{name}"
                                      " replaces it")
            conn.execute(f"INSERT INTO pattern_definitions ({_COLUMNS}) VALUES (?, ?, ?, ?, ?)",
                         (name, _dump(definition), version, now_ms, now_ms))
        return self.pattern(name)

    def replace(self, name: str, definition: Mapping, *, now_ms: int) -> StoredPattern | None:
        """None: no such pattern."""
        with self._lock, self._conn.transaction() as conn:
            row = conn.execute("SELECT updated_ms FROM pattern_definitions WHERE name = ?", (name,)).fetchone()
            if row is None:
                return None
            version = _bump(conn)
            conn.execute("UPDATE pattern_definitions SET definition = ?, version = ?, updated_ms = ? WHERE name = ?",
                         (_dump(definition), version, max(now_ms, row[0]), name))
        return self.pattern(name)

    def delete(self, name: str) -> bool:
        with self._lock, self._conn.transaction() as conn:
            if conn.execute("SELECT 1 FROM pattern_definitions WHERE name = ?", (name,)).fetchone() is None:
                return False
            _bump(conn)
            conn.execute("DELETE FROM pattern_definitions WHERE name = ?", (name,))
        return True


def _bump(conn: Db) -> int:
    conn.execute("INSERT INTO pattern_definitions_version (id, version) VALUES (1, 1)"
                 " ON CONFLICT (id) DO UPDATE SET version = pattern_definitions_version.version + 1")
    return int(conn.execute("SELECT version FROM pattern_definitions_version WHERE id = 1").fetchone()[0])


def _row(row) -> StoredPattern:
    name, definition, version, created, updated = row
    return StoredPattern(name, json.loads(definition), int(version), created, updated)


def _dump(value) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)

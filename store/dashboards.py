"""Dashboards saved through the API and provisioned from the dashboards folder, on the
store's backend (SQLite file or PostgreSQL) with a connection of their own, like the alert
rules (store/alerts.py).

The store keeps each definition as a JSON document and knows nothing of panels (dashboard/
does). A provisioned dashboard's source is 'file': the folder is its source of truth, so the
API may read and duplicate it but not change or delete it.

A dashboard's version is its `updated_ms`: every change sets it above the one before (never the
same twice for one dashboard, whatever the clock does), so a writer that names the version it
edited (`expected_ms`) is refused with DashboardStale once someone else changed the dashboard in
between, instead of silently undoing their change (optimistic concurrency, as Grafana does)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from store.connection import Db, SideStore

_SCHEMA = """
CREATE TABLE IF NOT EXISTS dashboards (
    name TEXT PRIMARY KEY,
    definition TEXT NOT NULL,        -- the validated dashboard, as the API shows it
    source TEXT NOT NULL,            -- 'file' (the dashboards folder) or 'api'
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
);
"""

_COLUMNS = "name, definition, source, created_ms, updated_ms"


class DashboardConflict(Exception):
    """A name already taken (create, duplicate), or a provisioned dashboard the API may not change."""


class DashboardStale(DashboardConflict):
    """The dashboard was changed since the version the writer edited: nothing was written."""

    field = "updated_ms"

    def __init__(self, name: str, expected_ms: int, updated_ms: int):
        at = datetime.fromtimestamp(updated_ms / 1000, timezone.utc).isoformat(timespec="milliseconds")
        super().__init__(f"dashboard {name!r} was changed by someone else since you loaded it, at"
                         f" {at.replace('+00:00', 'Z')} (updated_ms {updated_ms}; you edited {expected_ms}):"
                         " nothing was changed; reload it and make your change again")
        self.updated_ms = updated_ms


@dataclass(frozen=True)
class StoredDashboard:
    name: str
    definition: dict
    source: str
    created_ms: int
    updated_ms: int


class DashboardStore(SideStore):
    def __init__(self, target: str | Path | Db, *, synchronous: str = "NORMAL", busy_timeout_s: float = 30.0):
        super().__init__(target, _SCHEMA, synchronous=synchronous, busy_timeout_s=busy_timeout_s)

    def dashboards(self) -> list[StoredDashboard]:
        with self._lock:
            rows = self._conn.execute(f"SELECT {_COLUMNS} FROM dashboards ORDER BY name").fetchall()
        return [_row(row) for row in rows]

    def dashboard(self, name: str) -> StoredDashboard | None:
        with self._lock:
            row = self._conn.execute(f"SELECT {_COLUMNS} FROM dashboards WHERE name = ?", (name,)).fetchone()
        return None if row is None else _row(row)

    def create(self, name: str, definition: Mapping, *, now_ms: int) -> StoredDashboard:
        with self._lock, self._conn.transaction():
            if self._conn.execute("SELECT 1 FROM dashboards WHERE name = ?", (name,)).fetchone():
                raise DashboardConflict(f"a dashboard named {name!r} already exists;"
                                        f" PUT /api/v1/dashboards/{name} changes it")
            self._conn.execute(f"INSERT INTO dashboards ({_COLUMNS}) VALUES (?, ?, 'api', ?, ?)",
                               (name, _dump(definition), now_ms, now_ms))
        return self.dashboard(name)

    def replace(self, name: str, definition: Mapping, *, now_ms: int,
                expected_ms: int | None = None) -> StoredDashboard | None:
        """Change a saved dashboard (None: no such dashboard). `expected_ms`: the version the
        writer edited, refused (DashboardStale) when it is no longer the stored one; None
        overwrites whatever is stored (automation that owns the dashboard)."""
        with self._lock, self._conn.transaction():
            row = self._conn.execute("SELECT source, updated_ms FROM dashboards WHERE name = ?", (name,)).fetchone()
            if row is None:
                return None
            _refuse_file(name, row[0])
            _refuse_stale(name, expected_ms, row[1])
            self._conn.execute("UPDATE dashboards SET definition = ?, updated_ms = ? WHERE name = ?",
                               (_dump(definition), max(now_ms, row[1] + 1), name))
        return self.dashboard(name)

    def delete(self, name: str, *, expected_ms: int | None = None) -> bool:
        """Delete a saved dashboard (False: no such dashboard); `expected_ms` as for replace."""
        with self._lock, self._conn.transaction():
            row = self._conn.execute("SELECT source, updated_ms FROM dashboards WHERE name = ?", (name,)).fetchone()
            if row is None:
                return False
            _refuse_file(name, row[0])
            _refuse_stale(name, expected_ms, row[1])
            self._conn.execute("DELETE FROM dashboards WHERE name = ?", (name,))
        return True

    def sync_files(self, definitions: Mapping[str, Mapping], *, now_ms: int) -> None:
        """Make the provisioned dashboards exactly `definitions` (a saved one of the same name
        becomes the folder's: the folder is the source of truth), in one transaction."""
        with self._lock, self._conn.transaction():
            have = {name: (definition, source, updated) for name, definition, source, updated in self._conn.execute(
                "SELECT name, definition, source, updated_ms FROM dashboards")}
            for name, definition in definitions.items():
                text = _dump(definition)
                if name not in have:
                    self._conn.execute(f"INSERT INTO dashboards ({_COLUMNS}) VALUES (?, ?, 'file', ?, ?)",
                                       (name, text, now_ms, now_ms))
                elif have[name][:2] != (text, "file"):
                    self._conn.execute("UPDATE dashboards SET definition = ?, source = 'file', updated_ms = ?"
                                       " WHERE name = ?", (text, max(now_ms, have[name][2] + 1), name))
            for name, (_, source, _) in have.items():
                if source == "file" and name not in definitions:
                    self._conn.execute("DELETE FROM dashboards WHERE name = ?", (name,))


def _row(row) -> StoredDashboard:
    name, definition, source, created, updated = row
    return StoredDashboard(name, json.loads(definition), source, created, updated)


def _refuse_file(name: str, source: str) -> None:
    if source == "file":
        raise DashboardConflict(f"dashboard {name!r} is provisioned from the dashboards folder; change it there"
                                " (the folder is its source of truth) or duplicate it to edit a copy")


def _refuse_stale(name: str, expected_ms: int | None, updated_ms: int) -> None:
    if expected_ms is not None and expected_ms != updated_ms:
        raise DashboardStale(name, expected_ms, updated_ms)


def _dump(value) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)

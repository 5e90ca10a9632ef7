"""Alert rules, their instances' state and the history of state changes, in the store's
SQLite file with its own connection (like store/lag.py).

The store keeps definitions and states as JSON documents and knows nothing of their
meaning (alerts/ does): the import arrow points from alerts to store. One evaluation's
instances and history entries are saved in one transaction, so a restart resumes each
instance where it was (a `for` period keeps counting, as Prometheus restores it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from store.connection import Db, SideStore, where

_SCHEMA = """
CREATE TABLE IF NOT EXISTS alert_rules (
    name TEXT PRIMARY KEY,
    definition TEXT NOT NULL,        -- the validated rule, as the API shows it
    source TEXT NOT NULL,            -- 'file' (the alerts YAML file) or 'api'
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    silenced_until_ms INTEGER
);
CREATE TABLE IF NOT EXISTS alert_instances (
    rule TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    state TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (rule, fingerprint)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS alert_history (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    rule TEXT NOT NULL,
    at_ms INTEGER NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS alert_history_by_rule ON alert_history (rule, id);
CREATE INDEX IF NOT EXISTS alert_history_by_time ON alert_history (at_ms);
CREATE TABLE IF NOT EXISTS alert_notifier_memory (
    notifier TEXT NOT NULL,          -- e.g. the webhook's URL
    rule TEXT NOT NULL,
    data TEXT NOT NULL,              -- what that notifier last delivered for the rule
    PRIMARY KEY (notifier, rule)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS alert_rules_version (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL         -- bumped by every transaction that changes alert_rules
);
CREATE TABLE IF NOT EXISTS alert_cursors (
    rule TEXT PRIMARY KEY,
    cursor INTEGER NOT NULL          -- the last pattern match id a `pattern` rule has read
) WITHOUT ROWID;
"""


class RuleConflict(Exception):
    """A rule name already taken (create), or a rule the API may not change (file rules)."""


@dataclass(frozen=True)
class StoredRule:
    name: str
    definition: dict
    source: str
    created_ms: int
    updated_ms: int
    silenced_until_ms: int | None


@dataclass(frozen=True)
class HistoryEntry:
    id: int
    rule: str
    at_ms: int
    data: dict


class AlertStore(SideStore):
    def __init__(self, path: str | Path | Db, *, history_retention_ms: int = 30 * 86_400_000,
                 synchronous: str = "NORMAL", busy_timeout_s: float = 30.0):
        super().__init__(path, _SCHEMA, synchronous=synchronous, busy_timeout_s=busy_timeout_s)
        self.history_retention_ms = history_retention_ms
        with self._lock:  # a store from before the counter gets its row here (the table came with _SCHEMA)
            self._conn.execute("INSERT INTO alert_rules_version (id, version) VALUES (1, 0)"
                               " ON CONFLICT (id) DO NOTHING")

    # -- rules ---------------------------------------------------------------------------

    def rules(self) -> list[StoredRule]:
        with self._lock:
            rows = self._conn.execute(f"SELECT {_RULE_COLUMNS} FROM alert_rules ORDER BY name").fetchall()
        return [_rule(row) for row in rows]

    def rule(self, name: str) -> StoredRule | None:
        with self._lock:
            row = self._conn.execute(f"SELECT {_RULE_COLUMNS} FROM alert_rules WHERE name = ?", (name,)).fetchone()
        return None if row is None else _rule(row)

    def rules_version(self) -> int:
        """Changes whenever a rule is added, changed, silenced or removed (cheap to poll). A counter
        bumped in each rule-changing transaction, not derived from the rows: a delete plus a create
        by a replica whose clock is behind (or in the same millisecond) leaves the count and the
        newest `updated_ms` as they were, yet the rules changed."""
        with self._lock:
            return int(self._conn.execute("SELECT version FROM alert_rules_version WHERE id = 1").fetchone()[0])

    def _bump_rules_version(self) -> None:
        # Inside the caller's transaction, so that the version and the rules change together.
        self._conn.execute("UPDATE alert_rules_version SET version = version + 1 WHERE id = 1")

    def create_rule(self, name: str, definition: Mapping, *, source: str, now_ms: int) -> StoredRule:
        with self._lock, self._conn.transaction():
            if self._conn.execute("SELECT 1 FROM alert_rules WHERE name = ?", (name,)).fetchone():
                raise RuleConflict(f"a rule named {name!r} already exists; PUT /api/v1/alerts/rules/{name} changes it")
            self._conn.execute("INSERT INTO alert_rules (name, definition, source, created_ms, updated_ms)"
                               " VALUES (?, ?, ?, ?, ?)", (name, _dump(definition), source, now_ms, now_ms))
            self._bump_rules_version()
        return self.rule(name)

    def replace_rule(self, name: str, definition: Mapping, *, now_ms: int) -> StoredRule | None:
        """Change an API rule's definition (None: no such rule); its instances carry on."""
        with self._lock, self._conn.transaction():
            row = self._conn.execute("SELECT source, updated_ms FROM alert_rules WHERE name = ?", (name,)).fetchone()
            if row is None:
                return None
            _refuse_file_rule(name, row[0])
            self._conn.execute("UPDATE alert_rules SET definition = ?, updated_ms = ? WHERE name = ?",
                               (_dump(definition), max(now_ms, row[1] + 1), name))
            self._bump_rules_version()
        return self.rule(name)

    def delete_rule(self, name: str) -> bool:
        """Remove an API rule and its instances (the history stays)."""
        with self._lock, self._conn.transaction():
            row = self._conn.execute("SELECT source FROM alert_rules WHERE name = ?", (name,)).fetchone()
            if row is None:
                return False
            _refuse_file_rule(name, row[0])
            self._drop_rule_rows(name)
            self._bump_rules_version()
        return True

    def set_silence(self, name: str, until_ms: int | None, *, now_ms: int) -> StoredRule | None:
        with self._lock, self._conn.transaction():
            row = self._conn.execute("SELECT updated_ms FROM alert_rules WHERE name = ?", (name,)).fetchone()
            if row is None:
                return None
            self._conn.execute("UPDATE alert_rules SET silenced_until_ms = ?, updated_ms = ? WHERE name = ?",
                               (until_ms, max(now_ms, row[0] + 1), name))
            self._bump_rules_version()
        return self.rule(name)

    def sync_file_rules(self, definitions: Mapping[str, Mapping], *, now_ms: int,
                        ended: Callable[[list[dict]], Iterable[Mapping]] = lambda instances: ()) -> list[str]:
        """Make the file rules exactly `definitions`: the file is their source of truth (an API
        rule of the same name becomes the file's); silences survive a reload. Return the names of
        the file rules removed. A removed rule's instances go to the history as `ended(instances)`
        says, in the same transaction, so that a rule dropped from the file while the API was down
        still ends in the history (and only one replica records it)."""
        with self._lock, self._conn.transaction():
            have = {name: (definition, source, updated) for name, definition, source, updated in self._conn.execute(
                "SELECT name, definition, source, updated_ms FROM alert_rules")}
            changed = False
            for name, definition in definitions.items():
                text = _dump(definition)
                if name not in have:
                    self._conn.execute("INSERT INTO alert_rules (name, definition, source, created_ms, updated_ms)"
                                       " VALUES (?, ?, 'file', ?, ?)", (name, text, now_ms, now_ms))
                    changed = True
                elif have[name][:2] != (text, "file"):
                    self._conn.execute("UPDATE alert_rules SET definition = ?, source = 'file', updated_ms = ?"
                                       " WHERE name = ?", (text, max(now_ms, have[name][2] + 1), name))
                    changed = True
            removed = [name for name, (_, source, _) in have.items() if source == "file" and name not in definitions]
            for name in removed:
                self._record_ends(name, ended, now_ms)
                self._drop_rule_rows(name)
            if changed or removed:  # an unchanged file (every start) leaves the other replicas' caches be
                self._bump_rules_version()
        return removed

    def _record_ends(self, rule: str, ended: Callable[[list[dict]], Iterable[Mapping]], now_ms: int) -> None:
        # Inside the caller's transaction, before the instances go: their end goes to the history.
        rows = self._conn.execute("SELECT data FROM alert_instances WHERE rule = ? ORDER BY fingerprint",
                                  (rule,)).fetchall()
        for entry in ended([_load(data) for (data,) in rows]):
            self._conn.execute("INSERT INTO alert_history (rule, at_ms, data) VALUES (?, ?, ?)",
                               (rule, now_ms, _dump(entry)))

    def _drop_rule_rows(self, rule: str) -> None:
        # Inside the caller's transaction: the rule, its instances and its pattern cursor (the history stays).
        self._conn.execute("DELETE FROM alert_rules WHERE name = ?", (rule,))
        self._conn.execute("DELETE FROM alert_instances WHERE rule = ?", (rule,))
        self._conn.execute("DELETE FROM alert_cursors WHERE rule = ?", (rule,))

    # -- instances and history ---------------------------------------------------------------

    def instances(self, rule: str | None = None) -> list[dict]:
        with self._lock:
            if rule is None:
                rows = self._conn.execute("SELECT data FROM alert_instances ORDER BY rule, fingerprint").fetchall()
            else:
                rows = self._conn.execute("SELECT data FROM alert_instances WHERE rule = ? ORDER BY fingerprint",
                                          (rule,)).fetchall()
        return [_load(data) for (data,) in rows]

    def cursor(self, rule: str) -> int | None:
        """Where the rule's reading of an append-only feed (a pattern's matches) stopped; None: never read."""
        with self._lock:
            row = self._conn.execute("SELECT cursor FROM alert_cursors WHERE rule = ?", (rule,)).fetchone()
        return None if row is None else int(row[0])

    def save_evaluation(self, rule: str, instances: Iterable[Mapping], transitions: Iterable[Mapping],
                        *, now_ms: int, cursor: int | None = None) -> list[int]:
        """Replace the rule's instances with `instances` (each with 'fingerprint' and 'state') and
        append the transitions to the history, in one transaction; return the new history ids.
        `cursor` (pattern rules: the last match id read) is saved in the same transaction, so a
        restart neither reads a match twice nor skips one. A rule deleted meanwhile saves nothing."""
        ids = []
        with self._lock, self._conn.transaction():
            if not self._conn.execute("SELECT 1 FROM alert_rules WHERE name = ?", (rule,)).fetchone():
                return []
            self._conn.execute("DELETE FROM alert_instances WHERE rule = ?", (rule,))
            self._conn.executemany(
                "INSERT INTO alert_instances (rule, fingerprint, state, data) VALUES (?, ?, ?, ?)",
                [(rule, i["fingerprint"], i["state"], _dump(i)) for i in instances])
            for t in transitions:
                ids.append(self._conn.insert_id("INSERT INTO alert_history (rule, at_ms, data) VALUES (?, ?, ?)",
                                                (rule, t["at_ms"], _dump(t))))
            if cursor is not None:
                self._conn.execute("INSERT INTO alert_cursors (rule, cursor) VALUES (?, ?)"
                                   " ON CONFLICT (rule) DO UPDATE SET cursor = excluded.cursor", (rule, cursor))
            self._conn.execute("DELETE FROM alert_history WHERE at_ms < ?", (now_ms - self.history_retention_ms,))
        return ids

    def history(self, *, rule: str | None = None, after_id: int = 0, limit: int = 100,
                newest_first: bool = True) -> list[HistoryEntry]:
        clause, args = where(("id > ?", after_id), ("rule = ?", rule))
        with self._lock:
            rows = self._conn.execute(
                "SELECT id, rule, at_ms, data FROM alert_history" + clause
                + f" ORDER BY id {'DESC' if newest_first else 'ASC'} LIMIT ?", (*args, limit)).fetchall()
        return [HistoryEntry(i, r, at, _load(d)) for i, r, at, d in rows]

    # -- what notifiers delivered (alerts/webhook.py) ------------------------------------------

    def notifier_memory(self, notifier: str) -> dict[str, dict]:
        with self._lock:
            rows = self._conn.execute("SELECT rule, data FROM alert_notifier_memory WHERE notifier = ?",
                                      (notifier,)).fetchall()
        return {rule: json.loads(data) for rule, data in rows}

    def save_notifier_memory(self, notifier: str, rule: str, data: Mapping | None) -> None:
        with self._lock:
            if data is None:
                self._conn.execute("DELETE FROM alert_notifier_memory WHERE notifier = ? AND rule = ?",
                                   (notifier, rule))
            else:
                self._conn.execute("INSERT INTO alert_notifier_memory (notifier, rule, data) VALUES (?, ?, ?)"
                                   " ON CONFLICT (notifier, rule) DO UPDATE SET data = excluded.data",
                                   (notifier, rule, _dump(data)))


_RULE_COLUMNS = "name, definition, source, created_ms, updated_ms, silenced_until_ms"


def _rule(row) -> StoredRule:
    name, definition, source, created, updated, silenced = row
    return StoredRule(name, json.loads(definition), source, created, updated, silenced)


def _refuse_file_rule(name: str, source: str) -> None:
    if source == "file":
        raise RuleConflict(f"rule {name!r} is declared in the alerts file; change it there (the file is its"
                           " source of truth; the API may only silence it)")


def _dump(value) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _load(text: str):
    """An instance or history entry as stored; a value stored as Infinity or NaN (before alerts/
    outcome.py refused them) read as null: no JSON answer can carry it."""
    return json.loads(text, parse_constant=lambda _: None)


SqliteAlertStore = AlertStore  # the name from before PostgreSQL; the same class on a file path

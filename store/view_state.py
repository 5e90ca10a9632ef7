"""The state of table-table join views (catalog/views.py), as the store keeps it for every backend.

One row per (view, left key) for every row of the view's left table: the right key it names (the
index the maintenance rule needs: right key -> left keys) and its view row (NULL when an inner
view has no row for it). Written in the transaction of the batch whose table changes changed it,
beside table_rows, so the view is always the join of the tables as of the last committed batch.
`view_definitions` records which declaration a view's rows were built for: a view that is new,
changed or dropped (drop_view) is rebuilt from table_rows by the next batch (aggregates/views.py).

`view_changes` is the view's changelog: each change of a view row with its old and its new row,
in the same transaction, in commit order (batch id, then its place in the batch), kept for the
view stream's retention; replayed from empty it gives the view's rows. A rebuild starts it again
(its changes were of another declaration, or were dropped with the state).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from store.table_state import TableRow

DDL = """
-- Table-table join views (store/view_state.py): per left row, the right key it names and its view row.
CREATE TABLE IF NOT EXISTS view_rows (
    view_name TEXT NOT NULL,
    left_key TEXT NOT NULL,
    right_key TEXT,                -- the right table's key the left row names (NULL: none)
    row_json TEXT,                 -- the view's row (JSON object); NULL: not in the view (inner, no match)
    event_time_ms INTEGER NOT NULL, -- the time of the table change that set it
    log_partition INTEGER NOT NULL,
    log_offset INTEGER NOT NULL,   -- where that change is in its table's log
    batch_id INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (view_name, left_key)
);
CREATE INDEX IF NOT EXISTS view_rows_by_right ON view_rows (view_name, right_key);
CREATE TABLE IF NOT EXISTS view_definitions (
    view_name TEXT PRIMARY KEY,
    definition TEXT NOT NULL       -- the declaration its rows were built for (JSON)
);
CREATE TABLE IF NOT EXISTS view_changes (
    view_name TEXT NOT NULL,
    batch_id INTEGER NOT NULL,
    seq INTEGER NOT NULL,          -- the change's place in its batch
    left_key TEXT NOT NULL,
    old_json TEXT,                 -- the view row before (NULL: none, the row is new)
    new_json TEXT,                 -- the view row after (NULL: none, the row is gone)
    event_time_ms INTEGER NOT NULL, -- the time of the table change that caused it
    log_partition INTEGER NOT NULL,
    log_offset INTEGER NOT NULL,   -- where that change is in its table's log
    committed_at_ms INTEGER NOT NULL,
    PRIMARY KEY (view_name, batch_id, seq)
);
"""


@dataclass(frozen=True)
class ViewLink:
    """A left row's entry in a view: `row` None when it has no view row."""

    left_key: str
    right_key: str | None
    row: Mapping[str, Any] | None
    event_time_ms: int
    partition: int
    offset: int


@dataclass(frozen=True)
class ViewChangeRow:
    """One change of a view row, as the changelog keeps it: `old` None is a new row, `new` None a
    row gone. `cursor` ("batch.seq") orders the changes; set when read back."""

    key: str
    old: Mapping[str, Any] | None
    new: Mapping[str, Any] | None
    event_time_ms: int
    partition: int
    offset: int
    cursor: str = ""
    committed_at_ms: int = 0


@dataclass(frozen=True)
class ViewCommit:
    """A batch's changes of one view: per left key its new entry, None when the left row is gone.
    `rebuilt`: the entries are the whole view (its old rows are dropped first). `changes`: the
    changelog's new entries, kept `retention_ms` (None: for ever)."""

    view: str
    definition: str
    links: Mapping[str, ViewLink | None] = field(default_factory=dict)
    rebuilt: bool = False
    changes: Sequence[ViewChangeRow] = ()
    retention_ms: int | None = None


def _in(column: str, placeholder: str, values: Sequence[str]) -> tuple[str, Any]:
    if placeholder == "?":
        return f"{column} IN (SELECT value FROM json_each(?))", json.dumps(sorted(set(values)))
    return f"{column} = ANY(%s)", sorted(set(values))


def lookup(cursor, view: str, left_keys: Sequence[str], right_keys: Sequence[str], placeholder: str) -> list[ViewLink]:
    """The entries of these left keys and of the left keys naming these right keys."""
    q = placeholder
    in_left, left_arg = _in("left_key", q, left_keys)
    in_right, right_arg = _in("right_key", q, right_keys)
    cursor.execute("SELECT left_key, right_key, row_json, event_time_ms, log_partition, log_offset FROM view_rows"
                   f" WHERE view_name = {q} AND ({in_left} OR {in_right})", (view, left_arg, right_arg))
    return [ViewLink(lk, rk, None if row is None else json.loads(row), t, p, o)
            for lk, rk, row, t, p, o in cursor.fetchall()]


def table_rows_of(cursor, stream: str, keys: Sequence[str], placeholder: str) -> dict[str, dict[str, Any]]:
    """These keys' current rows of a changelog table (a key without a row is absent)."""
    in_keys, arg = _in("row_key", placeholder, keys)
    cursor.execute(f"SELECT row_key, row_json FROM table_rows WHERE stream = {placeholder} AND {in_keys}",
                   (stream, arg))
    return {key: json.loads(row) for key, row in cursor.fetchall()}


def definition(cursor, view: str, placeholder: str) -> str | None:
    cursor.execute(f"SELECT definition FROM view_definitions WHERE view_name = {placeholder}", (view,))
    found = cursor.fetchone()
    return None if found is None else found[0]


def drop(cursor, view: str, placeholder: str) -> None:
    """Forget a view's state: the next batch rebuilds it from the tables."""
    cursor.execute(f"DELETE FROM view_rows WHERE view_name = {placeholder}", (view,))
    cursor.execute(f"DELETE FROM view_definitions WHERE view_name = {placeholder}", (view,))
    cursor.execute(f"DELETE FROM view_changes WHERE view_name = {placeholder}", (view,))


def apply(cursor, commits: Sequence[ViewCommit], batch_id: int, now_ms: int, placeholder: str) -> None:
    """Write a batch's view changes with `cursor` (the batch's transaction)."""
    p = placeholder
    for c in commits:
        if c.rebuilt:
            drop(cursor, c.view, p)
        cursor.execute(f"INSERT INTO view_definitions (view_name, definition) VALUES ({p}, {p}) ON CONFLICT (view_name)"
                       " DO UPDATE SET definition = excluded.definition", (c.view, c.definition))
        gone = [(c.view, key) for key, link in c.links.items() if link is None]
        kept = [(c.view, key, link.right_key,
                 None if link.row is None else json.dumps(link.row, separators=(",", ":"), sort_keys=True),
                 link.event_time_ms, link.partition, link.offset, batch_id, now_ms)
                for key, link in c.links.items() if link is not None]
        if gone:
            cursor.executemany(f"DELETE FROM view_rows WHERE view_name = {p} AND left_key = {p}", gone)
        if kept:
            cursor.executemany(
                "INSERT INTO view_rows (view_name, left_key, right_key, row_json, event_time_ms, log_partition, log_offset,"
                f" batch_id, updated_at_ms) VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p})"
                " ON CONFLICT (view_name, left_key) DO UPDATE SET right_key = excluded.right_key,"
                " row_json = excluded.row_json, event_time_ms = excluded.event_time_ms,"
                " log_partition = excluded.log_partition, log_offset = excluded.log_offset,"
                " batch_id = excluded.batch_id, updated_at_ms = excluded.updated_at_ms", kept)
        if c.changes:
            cursor.executemany(
                "INSERT INTO view_changes (view_name, batch_id, seq, left_key, old_json, new_json, event_time_ms,"
                f" log_partition, log_offset, committed_at_ms) VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p})",
                [(c.view, batch_id, seq, ch.key, _json(ch.old), _json(ch.new), ch.event_time_ms, ch.partition,
                  ch.offset, now_ms) for seq, ch in enumerate(c.changes)])
        if c.retention_ms is not None:
            cursor.execute(f"DELETE FROM view_changes WHERE view_name = {p} AND committed_at_ms < {p}",
                           (c.view, now_ms - c.retention_ms))


def _json(row: Mapping[str, Any] | None) -> str | None:
    return None if row is None else json.dumps(row, separators=(",", ":"), sort_keys=True)


def changes_query(placeholder: str) -> str:
    """A view's changes in commit order after a position: args (view, batch, batch, seq, limit)."""
    p = placeholder
    return ("SELECT left_key, old_json, new_json, event_time_ms, log_partition, log_offset, batch_id, seq,"
            f" committed_at_ms FROM view_changes WHERE view_name = {p} AND (batch_id > {p} OR (batch_id = {p} AND"
            f" seq > {p})) ORDER BY batch_id, seq LIMIT {p}")


def parse_cursor(cursor: str) -> tuple[int, int]:
    """A changes cursor ("batch.seq"; "" for the beginning) as (batch, seq); ValueError naming why."""
    if not cursor:
        return -1, -1
    batch, dot, seq = cursor.partition(".")
    if not (dot and batch.isdigit() and seq.isdigit()):
        raise ValueError(f"cursor {cursor!r} is not a changes cursor (the next_cursor of a page before, like '12.3')")
    return int(batch), int(seq)


def to_change(found: tuple) -> ViewChangeRow:
    key, old, new, t, partition, offset, batch_id, seq, committed = found
    return ViewChangeRow(key, None if old is None else json.loads(old), None if new is None else json.loads(new),
                         t, partition, offset, f"{batch_id}.{seq}", committed)


_COLUMNS = "left_key, row_json, event_time_ms, log_partition, log_offset, updated_at_ms"


def row_query(placeholder: str) -> str:
    """One key's view row: args (view, key)."""
    p = placeholder
    return f"SELECT {_COLUMNS} FROM view_rows WHERE view_name = {p} AND left_key = {p} AND row_json IS NOT NULL"


def page_query(placeholder: str) -> str:
    """View rows in key order after a key: args (view, after, limit)."""
    p = placeholder
    return (f"SELECT {_COLUMNS} FROM view_rows WHERE view_name = {p} AND left_key > {p} AND row_json IS NOT NULL"
            f" ORDER BY left_key LIMIT {p}")


def to_row(found: tuple) -> TableRow:
    key, row_json, event_time_ms, partition, offset, updated = found
    return TableRow(key, json.loads(row_json), event_time_ms, partition, offset, updated)

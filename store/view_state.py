"""The state of table-table join views (catalog/views.py), as the store keeps it for every backend.

One row per (view, left key) for every row of the view's left table: the right key it names (the
index the maintenance rule needs: right key -> left keys) and its view row (NULL when an inner
view has no row for it). Written in the transaction of the batch whose table changes changed it,
beside table_rows, so the view is always the join of the tables as of the last committed batch.
`view_definitions` records which declaration a view's rows were built for: a view that is new,
changed or dropped (drop_view) is rebuilt from table_rows by the next batch (aggregates/views.py).

`view_changes` is the view's changelog: each change of a view row with its old and its new row,
in the same transaction, kept for the view stream's retention; replayed from empty it gives the
view's rows. A rebuild starts it again (its changes were of another declaration, or were dropped
with the state). Its order is the store's own: `change_seq`, numbered per view in the writing
transaction from `view_changelog_ends` (which a rebuild keeps, one past it, so positions never go
back and a cursor from before the rebuild is told it missed it: drop), not
the pipeline's batch ids: a switch (store/switch.py) writes changes too, between two batches of
the serving pipeline, and a run's batch ids are not the serving pipeline's. A reader's cursor is
that number ("17"); a cursor of the older form "batch.seq" is still read, as the position of the
last change a batch wrote at or before it (docs/tables.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from store.table_state import TableRow, page_compare

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
    change_seq INTEGER,            -- the change's position in the view's changelog (the cursor); see the module doc
    PRIMARY KEY (view_name, batch_id, seq)  -- batch_id SWITCH_BATCH: written by a switch (seq = change_seq)
);
CREATE TABLE IF NOT EXISTS view_changelog_ends (
    view_name TEXT PRIMARY KEY,
    last_seq INTEGER NOT NULL      -- the highest change_seq given to the view: kept when its changes are dropped
);
"""
# Made after the store's upgrade (store/sqlite.py _migrate, store/postgres/schema.py): a store made before
# change_seq has view_changes without it until then.
CHANGE_SEQ_INDEX = "CREATE INDEX IF NOT EXISTS view_changes_by_seq ON view_changes (view_name, change_seq)"
# What a commit's retention of the changelog (apply) drops by: without it each commit that edits a
# view read every change the view keeps (its retention: 7 days by default; a plan's price change
# rewrites the row of every user on it) to find the few past the horizon. Made at open like the
# one above, so a store made before gets it too.
COMMITTED_AT_INDEX = ("CREATE INDEX IF NOT EXISTS view_changes_by_commit_time"
                      " ON view_changes (view_name, committed_at_ms)")
# The batch id of the changes a switch writes (store/switch.py): a change of no batch of the pipeline.
SWITCH_BATCH = -1


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
    row gone. `cursor` (its position in the changelog) orders the changes; set when read back."""

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
    # Two indexed reads in one UNION (an entry found by both is read once): as one WHERE with
    # `left_key IN (...) OR right_key IN (...)`, SQLite read every entry of the view through the
    # index on its name alone (store/joins.py's lookup met the same).
    parts, args = [], []
    for column, keys in (("left_key", left_keys), ("right_key", right_keys)):
        if keys:
            in_keys, arg = _in(column, q, keys)
            parts.append("SELECT left_key, right_key, row_json, event_time_ms, log_partition, log_offset FROM view_rows"
                         f" WHERE view_name = {q} AND {in_keys}")
            args += [view, arg]
    if not parts:
        return []
    cursor.execute(" UNION ".join(parts), args)
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
    """Forget a view's state: the next batch rebuilds it from the tables. The changelog's end stays
    recorded, one position past it: the rebuilt view's changes come after every position a reader
    may hold, and the position skipped (no change has it) tells every cursor from before the
    rebuild, one at the old end too, that it missed the rebuild (check_continues: a 410), though
    the rebuild itself writes no change. A view never built (no definition) has no reader to tell."""
    last = last_position(cursor, view, placeholder)
    if definition(cursor, view, placeholder) is not None:
        last += 1
    cursor.execute(f"INSERT INTO view_changelog_ends (view_name, last_seq) VALUES ({placeholder}, {placeholder})"
                   " ON CONFLICT (view_name) DO UPDATE SET last_seq = excluded.last_seq", (view, last))
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
            append_changes(cursor, c.view, batch_id, c.changes, now_ms, placeholder)
        if c.retention_ms is not None:
            cursor.execute(f"DELETE FROM view_changes WHERE view_name = {p} AND committed_at_ms < {p}",
                           (c.view, now_ms - c.retention_ms))


def last_position(cursor, view: str, placeholder: str) -> int:
    """The highest position given to a change of the view (0: none yet)."""
    p = placeholder
    cursor.execute(f"SELECT last_seq FROM view_changelog_ends WHERE view_name = {p}", (view,))
    found = cursor.fetchone()
    # The changes' own maximum too: a store upgraded to change_seq may have no end recorded yet.
    cursor.execute(f"SELECT MAX(change_seq) FROM view_changes WHERE view_name = {p}", (view,))
    top = cursor.fetchone()[0]
    return max(0 if found is None else int(found[0]), 0 if top is None else int(top))


def append_changes(cursor, view: str, batch_id: int, changes: Sequence[ViewChangeRow], now_ms: int,
                   placeholder: str) -> None:
    """Append changes to the view's changelog at the next positions (in the open transaction, which
    holds the commit lock: no other writer numbers them meanwhile). A batch's changes are numbered
    `seq` in it; a switch's (`batch_id` SWITCH_BATCH) take their position as `seq`, unique per view."""
    p = placeholder
    last = last_position(cursor, view, p)
    cursor.executemany(
        "INSERT INTO view_changes (view_name, batch_id, seq, left_key, old_json, new_json, event_time_ms,"
        f" log_partition, log_offset, committed_at_ms, change_seq) VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p},"
        f" {p}, {p})",
        [(view, batch_id, last + 1 + i if batch_id == SWITCH_BATCH else i, ch.key, _json(ch.old), _json(ch.new),
          ch.event_time_ms, ch.partition, ch.offset, now_ms, last + 1 + i) for i, ch in enumerate(changes)])
    cursor.execute(f"INSERT INTO view_changelog_ends (view_name, last_seq) VALUES ({p}, {p}) ON CONFLICT (view_name)"
                   " DO UPDATE SET last_seq = excluded.last_seq", (view, last + len(changes)))


def fill_positions(cursor) -> None:
    """Number the changes a store kept from before change_seq in their old order (batch id, then
    place in the batch), per view: old "batch.seq" cursors then find their place among them."""
    cursor.execute(
        "UPDATE view_changes SET change_seq = r.n FROM (SELECT view_name AS v, batch_id AS b, seq AS s,"
        " ROW_NUMBER() OVER (PARTITION BY view_name ORDER BY batch_id, seq) AS n FROM view_changes) AS r"
        " WHERE r.v = view_changes.view_name AND r.b = view_changes.batch_id AND r.s = view_changes.seq"
        " AND view_changes.change_seq IS NULL")


def switch_changes(served: Mapping[str, ViewLink], rebuilt: Mapping[str, ViewLink]) -> list[ViewChangeRow]:
    """What a switch appends to a view's changelog (store/switch.py): per left key, in key order,
    the change from its served row to its rebuilt one, where they differ, so a reader who applied
    the changelog before the switch and applies these has the rebuilt view. A changed or new row
    carries the position of the table change that set it in the rebuilt view, a row gone that of
    its left row there (or, the left row gone too, of its served row's). Pure."""
    out = []
    for key in sorted(set(served) | set(rebuilt)):
        before, after = served.get(key), rebuilt.get(key)
        old = None if before is None or before.row is None else dict(before.row)
        new = None if after is None or after.row is None else dict(after.row)
        if old == new:
            continue
        at = after if after is not None else before
        out.append(ViewChangeRow(key, old, new, at.event_time_ms, at.partition, at.offset))
    return out


def _json(row: Mapping[str, Any] | None) -> str | None:
    return None if row is None else json.dumps(row, separators=(",", ":"), sort_keys=True)


def changes_query(placeholder: str) -> str:
    """A view's changes in changelog order after a position: args (view, position, limit)."""
    p = placeholder
    return ("SELECT left_key, old_json, new_json, event_time_ms, log_partition, log_offset, change_seq,"
            f" committed_at_ms FROM view_changes WHERE view_name = {p} AND change_seq > {p}"
            f" ORDER BY change_seq LIMIT {p}")


def legacy_position_query(placeholder: str) -> str:
    """The position of an old "batch.seq" cursor: that of the last change a batch wrote at or before
    it (0 when none is kept: every change kept comes after it). Args (view, batch, batch, seq)."""
    p = placeholder
    return (f"SELECT COALESCE(MAX(change_seq), 0) FROM view_changes WHERE view_name = {p} AND batch_id >= 0"
            f" AND (batch_id < {p} OR (batch_id = {p} AND seq <= {p}))")


@dataclass(frozen=True)
class Cursor:
    """A parsed changes cursor: a position in the changelog, or an old "batch.seq" one (`batch` set)."""

    position: int = 0
    batch: int | None = None
    seq: int = 0


_MAX_POSITION = 2**63 - 1  # the stores' 64-bit integers


def _position(text: str) -> int | None:
    """A cursor's number: ASCII digits only (str.isdigit takes '١٢' too) within 64 bits, else None
    (a larger one failed the store's bind with an OverflowError: a 500)."""
    if not (text.isascii() and text.isdigit()):
        return None
    number = int(text)
    return number if number <= _MAX_POSITION else None


def parse_cursor(cursor: str) -> Cursor:
    """A changes cursor ("17", the old "12.3", or "" for the beginning); ValueError naming why."""
    if not cursor:
        return Cursor()
    position = _position(cursor)
    if position is not None:
        return Cursor(position)
    batch, dot, seq = cursor.partition(".")
    batch_id, seq_no = _position(batch), _position(seq)
    if not (dot and batch_id is not None and seq_no is not None):
        raise ValueError(f"cursor {cursor!r} is not a changes cursor (the next_cursor of a page before, like '17')")
    return Cursor(batch=batch_id, seq=seq_no)


class CursorPastEnd(ValueError):
    """A cursor past the view's last change: no answer gave it, and reading on from it would skip
    the changes up to it once they are written."""


class ChangesGone(Exception):
    """The changes right after a cursor are no longer kept (past the view stream's retention, or
    dropped by a rebuild): reading on would skip them. `last` is the changelog's end when it was
    found: the rows read after it and the changes after it are the view again."""

    def __init__(self, after: int | str, first_kept: int | None, last: int):
        kept = "none is kept" if first_kept is None else f"the oldest kept is {first_kept}"
        super().__init__(f"the changes after cursor '{after}' are gone ({kept}; past the view's retention or"
                         " dropped by a rebuild)")
        self.last = last


def read_changes(cursor, view: str, after: str, limit: int, placeholder: str) -> list[ViewChangeRow]:
    """The view's changes after the cursor `after`, in changelog order (ValueError: a malformed
    cursor or one past the last change, CursorPastEnd; ChangesGone: the next changes are gone)."""
    parsed = parse_cursor(after)
    position = parsed.position
    if parsed.batch is not None:
        cursor.execute(legacy_position_query(placeholder), (view, parsed.batch, parsed.batch, parsed.seq))
        position = int(cursor.fetchone()[0])
    # The end before the changes: it only grows, so a change after the cursor that existed then and
    # is not read now is gone, never one committed in between.
    last = last_position(cursor, view, placeholder)
    cursor.execute(changes_query(placeholder), (view, position, limit))
    changes = [to_change(r) for r in cursor.fetchall()]
    # An empty cursor reads from the oldest change kept. An old "batch.seq" one is checked at the
    # position found for it (a change kept at or before it, else 0): every change up to it is
    # older, so it continues only when nothing between was pruned or dropped by a rebuild.
    if after:
        check_continues(position, changes, last, after if parsed.batch is not None else None)
    return changes


def check_continues(position: int, changes: Sequence[ViewChangeRow], last: int, named: str | None = None) -> None:
    """Whether the changes read after the cursor at `position` continue it: positions are given one
    after the other (append_changes), so the first one read must be the next (a rebuild skips one
    (drop): no cursor from before it continues)."""
    if position > last:
        raise CursorPastEnd(f"cursor '{position}' is past the view's last change ({last}): pass a cursor an"
                            " answer gave")
    first = int(changes[0].cursor) if changes else None
    if position < last and first != position + 1:
        raise ChangesGone(position if named is None else named, first, last)


def to_change(found: tuple) -> ViewChangeRow:
    key, old, new, t, partition, offset, position, committed = found
    return ViewChangeRow(key, None if old is None else json.loads(old), None if new is None else json.loads(new),
                         t, partition, offset, str(position), committed)


_COLUMNS = "left_key, row_json, event_time_ms, log_partition, log_offset, updated_at_ms"


def row_query(placeholder: str) -> str:
    """One key's view row: args (view, key)."""
    p = placeholder
    return f"SELECT {_COLUMNS} FROM view_rows WHERE view_name = {p} AND left_key = {p} AND row_json IS NOT NULL"


def page_query(placeholder: str, after: str | None) -> str:
    """View rows in key order after the key `after`, or from the first when None (the empty key
    too: store/table_state.py page_compare): args (view, page_start(after), limit)."""
    p = placeholder
    return (f"SELECT {_COLUMNS} FROM view_rows WHERE view_name = {p} AND left_key {page_compare(after)} {p}"
            f" AND row_json IS NOT NULL ORDER BY left_key LIMIT {p}")


def to_row(found: tuple) -> TableRow:
    key, row_json, event_time_ms, partition, offset, updated = found
    return TableRow(key, json.loads(row_json), event_time_ms, partition, offset, updated)

"""The maintenance rule of a table-table join view (catalog/views.py). Pure: no I/O, no clock.

Semantics as Kafka Streams / ksqlDB foreign-key table joins. The view has one row per left row
(keyed by the left key) whose foreign key (or, joining on primary keys, whose own key) names a
right row; a `left` view also has the left rows without one, the right's columns None:
- an upsert of a left row (re)joins it: a changed foreign key retracts it from the old right row
  and joins it to the new one (one change of the view row: old result -> new result);
- a delete of a left row deletes its view row;
- an upsert of a right row updates every view row of the left rows that point at it;
- a delete of a right row deletes those view rows (inner) or empties their right columns (left).
A change that leaves a view row as it was emits nothing.

The rule works on `ViewState`, which may be a subset of the tables: it must hold every left row
the changes touch, the index entries of those rows, and the right rows their foreign keys name
(aggregates/views.py loads that from the store per batch).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from store.table_versions import TableVersion, as_of

Row = Mapping[str, Any]


@dataclass(frozen=True)
class ViewShape:
    """What the rule needs of a view's declaration."""

    foreign_key: str | None  # a column of the left row; None: the left key itself
    inner: bool
    right_columns: tuple[str, ...]  # the right row's columns (None in a left view without a match)

    def right_key(self, left_key: str, left_row: Row) -> str | None:
        if self.foreign_key is None:
            return left_key
        value = left_row.get(self.foreign_key)
        return None if value in (None, "") else str(value)

    def joined(self, left_row: Row, right_row: Row | None) -> dict[str, Any] | None:
        """The view row of a left row and its match (None: no view row)."""
        if right_row is None:
            if self.inner:
                return None
            right_row = {}
        return {**left_row, **{c: right_row.get(c) for c in self.right_columns}}


@dataclass(frozen=True)
class TableEdit:
    """One change of a table the view reads: `row` None is a delete."""

    side: str  # "left" or "right"
    key: str
    row: Row | None
    time_ms: int = 0
    partition: int = -1  # where the change is in its table's log (carried into the view's changes)
    offset: int = -1


@dataclass(frozen=True)
class ViewChange:
    """One change of a view row: old None is an insert, new None a delete."""

    key: str
    old: Row | None
    new: Row | None
    time_ms: int
    partition: int = -1
    offset: int = -1


@dataclass
class ViewState:
    left: dict[str, Row] = field(default_factory=dict)
    right: dict[str, Row] = field(default_factory=dict)
    links: dict[str, str | None] = field(default_factory=dict)  # left key -> the right key it names
    index: dict[str, set[str]] = field(default_factory=dict)  # right key -> left keys naming it
    rows: dict[str, Row] = field(default_factory=dict)  # left key -> its view row

    def link(self, left_key: str, right_key: str | None) -> None:
        old = self.links.pop(left_key, None)
        if old is not None:
            keys = self.index.get(old)
            if keys is not None:
                keys.discard(left_key)
                if not keys:
                    del self.index[old]
        if right_key is not None:
            self.links[left_key] = right_key
            self.index.setdefault(right_key, set()).add(left_key)


def apply(shape: ViewShape, state: ViewState, edit: TableEdit) -> list[ViewChange]:
    """Apply one table change to `state` (in place); the view's changes it causes, in key order."""
    if edit.side == "left":
        if edit.row is None:
            state.left.pop(edit.key, None)
            state.link(edit.key, None)
        else:
            state.left[edit.key] = dict(edit.row)
            state.link(edit.key, shape.right_key(edit.key, edit.row))
        return _rejoin(shape, state, [edit.key], edit)
    if edit.row is None:
        state.right.pop(edit.key, None)
    else:
        state.right[edit.key] = dict(edit.row)
    return _rejoin(shape, state, sorted(state.index.get(edit.key, ())), edit)


def apply_all(shape: ViewShape, state: ViewState, edits: Iterable[TableEdit]) -> list[ViewChange]:
    return [change for edit in edits for change in apply(shape, state, edit)]


def _rejoin(shape: ViewShape, state: ViewState, left_keys: Iterable[str], edit: TableEdit) -> list[ViewChange]:
    out = []
    for key in left_keys:
        left = state.left.get(key)
        link = state.links.get(key)
        new = None if left is None else shape.joined(left, None if link is None else state.right.get(link))
        old = state.rows.get(key)
        if new == old:
            continue
        if new is None:
            del state.rows[key]
        else:
            state.rows[key] = new
        out.append(ViewChange(key, old, new, edit.time_ms, edit.partition, edit.offset))
    return out


def from_scratch(shape: ViewShape, left: Mapping[str, Row], right: Mapping[str, Row]) -> ViewState:
    """The view of two whole tables (a rebuild after a restart, a reprocess or a new view)."""
    state = ViewState(left={k: dict(r) for k, r in left.items()}, right={k: dict(r) for k, r in right.items()})
    for key, row in state.left.items():
        state.link(key, shape.right_key(key, row))
    for key, row in state.left.items():
        link = state.links.get(key)
        joined = shape.joined(row, None if link is None else state.right.get(link))
        if joined is not None:
            state.rows[key] = joined
    return state


def joined_as_of(shape: ViewShape, key: str, left: Sequence[TableVersion],
                 right: Mapping[str, Sequence[TableVersion]], at_ms: int) -> tuple[dict[str, Any] | None, bool]:
    """An enrichment's lookup through a view (docs/tables.md, "Enrichment through a view"): the
    view row of `key` as the log knew it at `at_ms`, i.e. the join of the left table's row as of
    then and the right row its foreign key named as of then (`left`: the key's versions, `right`:
    the right table's versions by key). Also whether both sides had a row then (False: a miss).
    The same as the view's row after the tables' changes up to `at_ms`: the view after a batch is
    the join of the tables after it."""
    left_row = as_of(left, at_ms)
    if left_row is None:
        return None, False
    right_key = shape.right_key(key, left_row)
    right_row = None if right_key is None else as_of(right.get(right_key, ()), at_ms)
    return shape.joined(left_row, right_row), right_row is not None

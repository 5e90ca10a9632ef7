"""Rows and changes of a PostgreSQL table as changes of a table stream. Pure, no I/O.

The source table's `key` column is the stream's key_field; its columns named like the stream's
dimensions and values fill them (others are ignored, and reported: `schema_report`). A row's
columns arrive in their text form (the snapshot casts to text, pgoutput sends text) and become
JSON values by their type: integer types a JSON integer, float and numeric types a number,
booleans true/false, anything else the text as it is; a dimension takes the text (a boolean's
"true"/"false"), a value needs a number (a text column that holds one as JSON writes it is
parsed: ASCII digits, no `_`). An upsert's time is the transaction's
commit time (the snapshot's: the time it was taken); a change that the table's rules refuse
(a number column that is not a number, a label over 1024 characters) is rejected with its
reason, counted and shown by the follower, never dropped silently. A row moved to another key
whose new row is refused still leaves its old key: that tombstone is written (NewRowRefused).

An update does not carry a column PostgreSQL keeps out of line (TOAST: it moves the widest
values out once the whole row is over about 2 kB, so a short label beside wide columns may be
one) when the update leaves it unchanged. The column kept its value: it is taken from the whole
old row (REPLICA IDENTITY FULL), else from the row the stream holds for the key (`stored_row`,
which the follower reads from the log), and the change is written as if the source had sent it.
Only when neither has it is the change rejected, naming REPLICA IDENTITY FULL.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from catalog import StreamDef
from catalog.tables import OP_FIELD
from ingest.cdc.pgoutput import UNCHANGED, Begin, Column, Commit, Delete, Insert, Relation, Truncate, Update
from ingest.events import Event
from ingest.tables import TableRowValidator, is_tombstone, key_problem, tombstone

# pg_type oids (stable since PostgreSQL 7): the types whose text form is a JSON number or boolean.
INTEGER_TYPES = frozenset({20, 21, 23, 26})  # int8, int2, int4, oid
NUMBER_TYPES = frozenset({700, 701, 1700})  # float4, float8, numeric
BOOL_TYPE = 16

# An Update's old tuple kind that is the whole old row (REPLICA IDENTITY FULL); "K" is the key only.
FULL_OLD_ROW = "O"


def json_value(text: str | None, type_oid: int):
    """A column's text form as the JSON value of its type."""
    if text is None:
        return None
    if type_oid in INTEGER_TYPES:
        return int(text)
    if type_oid in NUMBER_TYPES:
        return float(text)  # NaN and Infinity become floats the validator refuses, with the reason
    if type_oid == BOOL_TYPE:
        return text in ("t", "true")  # pgoutput writes t/f, a cast to text true/false
    return text


# A number as JSON writes one, with JSON's whitespace around it (a char(n) column pads with
# spaces). Python's float() alone would also read '1_000', '١٢' (Unicode digits) and 'inf'.
_JSON_NUMBER = re.compile(r"[ \t\n\r]*-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?[ \t\n\r]*")


def number_value(text: str | None, type_oid: int):
    """A value column: its JSON number (a text column holding a JSON number is parsed;
    ValueError for any other text)."""
    value = json_value(text, type_oid)
    return _json_number(value) if isinstance(value, str) else value


def _json_number(text: str) -> float:
    """The number `text` writes as JSON does (ValueError: it writes none)."""
    if _JSON_NUMBER.fullmatch(text) is None:
        raise ValueError("not a JSON number")
    return float(text)


@dataclass
class Transaction:
    """What one source transaction did to the table stream."""

    end_lsn: int
    commit_time_ms: int
    events: list[Event] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)  # the reason of each change refused
    relations: list[Relation] = field(default_factory=list)  # the table's columns, as the messages said
    truncated: bool = False


class NewRowRefused(ValueError):
    """A row moved to another key and its new version is refused: the old key's delete (`written`)
    is still applied, for the source has no row of that key any more; only the new row is rejected."""

    def __init__(self, reason: str, written: list[Event]):
        super().__init__(reason)
        self.written = written


class ChangeMapper:
    """Turns the rows and messages of the source table into upserts and tombstones of `stream`."""

    def __init__(self, stream: StreamDef, key_column: str):
        self.stream = stream
        self.key_column = key_column
        self.validator = TableRowValidator(stream)
        self.fields = {name for name in (*stream.dimensions, *stream.values) if name != OP_FIELD}
        self.relations: dict[int, Relation] = {}

    def row_event(self, columns: Sequence[Column], values: Sequence, time_ms: int,
                  kept: Mapping | None = None) -> Event:
        """The upsert of one row (ValueError: why it is refused). `kept`: the row the stream holds
        for the key (stored_values), whose values fill the columns an update left unchanged
        TOASTed (None: the stream holds no row for it)."""
        raw: dict = {}
        for column, text in zip(columns, values, strict=True):
            if column.name == self.key_column:
                if text is None or text is UNCHANGED:
                    raise ValueError(f"{self.key_column}: the row's key is null")
                raw[self.stream.key_field] = text
            elif column.name in self.fields:
                if text is UNCHANGED:
                    if kept is None or kept.get(column.name) is None:
                        raise ValueError(
                            f"{column.name}: PostgreSQL keeps its value out of line (TOAST) and the update left it"
                            " unchanged, so the change does not carry it, and the stream holds no row of the key to"
                            " keep it from: set REPLICA IDENTITY FULL on the table (its updates then carry the old row)")
                    raw[column.name] = kept[column.name]  # as the stream holds it: validated when written
                    continue
                if column.name in self.stream.values:
                    try:
                        value = number_value(text, column.type_oid)
                    except ValueError:
                        raise ValueError(f"{column.name}: {text[:40]!r} is not a number") from None
                else:  # a dimension is a label: the text as PostgreSQL writes it (a boolean true/false)
                    value = json_value(text, column.type_oid) if column.type_oid == BOOL_TYPE else text
                if value is not None:
                    raw[column.name] = value
        if self.stream.key_field not in raw:
            raise ValueError(f"the source table has no key column {self.key_column!r}")
        raw[self.stream.time_field] = time_ms
        return self.validator.validate(raw, time_ms)

    def key_of(self, columns: Sequence[Column], values: Sequence) -> str | None:
        for column, text in zip(columns, values, strict=True):
            if column.name == self.key_column:
                return None if text is UNCHANGED else text
        return None

    def transaction(self, messages: Iterable, live_keys: Callable[[list[Event]], set[str]],
                    stored_row: Callable[[str, list[Event]], Mapping | None] | None = None) -> Transaction:
        """The changes of one transaction's messages (Begin ... Commit). `live_keys(events)`: the
        keys the table stream holds once `events` (this transaction's so far) are appended,
        asked only for a Truncate, which deletes each of them. `stored_row(key, events)`: the
        row the stream holds for `key` once `events` are appended (stored_values; None: none),
        asked only for the keys of `kept_keys` (an update leaving a TOASTed column unchanged)."""
        begin: Begin | None = None
        txn = Transaction(end_lsn=0, commit_time_ms=0)
        for message in messages:
            if isinstance(message, Begin):
                begin = message
                txn.commit_time_ms = message.commit_time_ms
            elif isinstance(message, Commit):
                txn.end_lsn, txn.commit_time_ms = message.end_lsn, message.commit_time_ms
            elif isinstance(message, Relation):
                self.relations[message.oid] = message
                txn.relations.append(message)
            elif isinstance(message, (Insert, Update, Delete)):
                time_ms = begin.commit_time_ms if begin else 0
                try:
                    txn.events.extend(self._change(message, time_ms, lambda key: None if stored_row is None
                                                   else stored_row(key, txn.events)))
                except NewRowRefused as exc:  # the old key's delete stands: the source no longer has it
                    txn.events.extend(exc.written)
                    txn.rejected.append(str(exc))
                except ValueError as exc:
                    txn.rejected.append(str(exc))
            elif isinstance(message, Truncate):
                time_ms = begin.commit_time_ms if begin else 0
                txn.truncated = True
                txn.events.extend(tombstone(self.stream, key, time_ms) for key in sorted(live_keys(txn.events)))
        return txn

    def _tombstone(self, key: str, time_ms: int) -> Event:
        """A delete of `key`, whose text meets a label's rules as an upserted row's key does (so no
        store is asked to hold a key it cannot index)."""
        problem = key_problem(key)
        if problem is not None:
            raise ValueError(f"{self.key_column}: {problem}")
        return tombstone(self.stream, key, time_ms)

    def kept_keys(self, messages: Iterable) -> set[str]:
        """The keys whose stored row `messages` need: those of the updates that leave a declared
        column unchanged TOASTed without carrying the whole old row (the old key, for a row that
        moved: the column kept the old row's value). The follower reads them in one pass."""
        relations = dict(self.relations)
        keys: set[str] = set()
        for message in messages:
            if isinstance(message, Relation):
                relations[message.oid] = message
            elif isinstance(message, Update) and message.old_kind != FULL_OLD_ROW and UNCHANGED in message.new:
                relation = relations.get(message.oid)
                if relation is None or not any(v is UNCHANGED and c.name in self.fields
                                               for c, v in zip(relation.columns, message.new, strict=True)):
                    continue
                key = self._kept_key(relation.columns, message)
                if key is not None:
                    keys.add(key)
        return keys

    def _kept_key(self, columns: Sequence[Column], message: Update) -> str | None:
        """The key whose row holds what `message`'s unchanged columns kept: the old key when it
        carries one (the row moved), else the row's key."""
        old_key = self.key_of(columns, message.old) if message.old is not None else None
        return old_key if old_key is not None else self.key_of(columns, message.new)

    def _change(self, message: Insert | Update | Delete, time_ms: int,
                stored_row: Callable[[str], Mapping | None] = lambda key: None) -> list[Event]:
        relation = self.relations.get(message.oid)
        if relation is None:
            raise ValueError(f"a change of relation {message.oid} before its Relation message")
        columns = relation.columns
        if isinstance(message, Delete):
            key = self.key_of(columns, message.old)
            if key is None:
                raise ValueError(f"a delete without the key column {self.key_column!r}: make it the primary key, or"
                                 " set REPLICA IDENTITY FULL on the table")
            return [self._tombstone(key, time_ms)]
        new = message.new
        events = []
        kept = None
        if isinstance(message, Update):
            if message.old is not None and message.old_kind == FULL_OLD_ROW:
                new = _with_unchanged_from(new, message.old)
            elif UNCHANGED in new:  # without the old row, the stream's row holds what the columns kept
                key = self._kept_key(columns, message)
                kept = None if key is None else stored_row(key)
        if isinstance(message, Update) and message.old is not None:
            old_key = self.key_of(columns, message.old)
            if old_key is not None and old_key != self.key_of(columns, new) and key_problem(old_key) is None:
                # The row moved to another key. An old key no row can have was never stored: no delete.
                events.append(tombstone(self.stream, old_key, time_ms))
        try:
            events.append(self.row_event(columns, new, time_ms, kept))
        except ValueError as exc:
            if not events:
                raise
            raise NewRowRefused(f"{exc} (the row moved off key {events[0].key!r}: its delete is written)",
                                events) from None
        return events


def _with_unchanged_from(new: tuple, old_row: tuple) -> tuple:
    """`new` with each unchanged TOASTed column taken from the whole old row (REPLICA IDENTITY
    FULL). Only a whole old row may fill them: an old key ("K") has null in every other column,
    and a null there would blank the column instead of rejecting the change."""
    return tuple(o if v is UNCHANGED else v for v, o in zip(new, old_row, strict=True))


def stored_values(stream: StreamDef, event: Event) -> dict:
    """What an upsert of `stream` holds in its declared columns, as a raw row would send them
    (a dimension's label, a value's number): what an unchanged TOASTed column kept."""
    row = {name: event.strings.get(name) for name in stream.dimensions if name != OP_FIELD}
    row.update((name, event.numbers.get(name)) for name in stream.values)
    return row


def row_after(key: str, before: Mapping | None, stream: StreamDef, events: Iterable[Event]) -> Mapping | None:
    """The row (stored_values) `key` holds after `events`, from the one it held before (None: none)."""
    row = before
    for event in events:
        if event.key == key:
            row = None if is_tombstone(stream, event) else stored_values(stream, event)
    return row


def live_after(keys: set[str], stream: StreamDef, events: Iterable[Event]) -> set[str]:
    """The keys holding a row after `events`, from those holding one before."""
    keys = set(keys)
    for event in events:
        if is_tombstone(stream, event):
            keys.discard(event.key)
        else:
            keys.add(event.key)
    return keys


def schema_report(declared: Iterable[str], key_column: str, at_start: Sequence[str],
                  now: Sequence[str]) -> dict:
    """How the source table's columns differ from the stream's and from those it had when
    snapshotted: `missing` declared columns the table lacks (their dimension stays "", their value
    null), `added`/`removed` columns since the snapshot (a schema change, reported, never a crash)."""
    wanted = {*declared, key_column} - {OP_FIELD}
    return {
        "missing": sorted(wanted - set(now)),
        "ignored": sorted(set(now) - wanted),
        "added": [c for c in now if c not in at_start],
        "removed": [c for c in at_start if c not in now],
    }


def row_digest(stream: StreamDef, strings: Mapping, numbers: Mapping) -> bytes:
    """What a row of `stream` holds besides its key and time, as 16 bytes (BLAKE2b: equal rows,
    equal digests; different ones collide with a chance of 2^-128): a snapshot compares the
    table's rows with the stream's without holding the stream's rows. `strings`/`numbers` as an
    Event has them, or a log record's columns."""
    names = [f for f in stream.string_fields if f not in (OP_FIELD, stream.key_field)]
    row = [[strings.get(f) for f in names], [None if numbers.get(v) is None else float(numbers[v]) for v in stream.values]]
    return hashlib.blake2b(json.dumps(row).encode(), digest_size=16).digest()

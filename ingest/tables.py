"""Changes of a changelog table (`kind: table`, catalog/tables.py) as log records. Pure, no I/O.

A change is an event of the table's stream whose implicit dimension `op` says which change it is:
- an upsert carries the key and the row (the declared dimensions and values), `op` "upsert";
- a delete (tombstone) carries the key only, `op` "delete", and every other column null.
On the embedded log both are rows of a segment like any event. On Kafka an upsert is the row's
JSON (as a direct producer would send it) and a tombstone is a record with the key and a null
value, as Kafka's log compaction expects; reading one back gives the same events.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from catalog import StreamDef
from catalog.tables import DELETE, DELETED_FLAG, OP_FIELD, UPSERT
from ingest.events import Event, EventValidator, label_problem


def is_table(stream: StreamDef) -> bool:
    return stream.kind == "table"


def is_tombstone(stream: StreamDef, event: Event) -> bool:
    return is_table(stream) and event.strings.get(OP_FIELD) == DELETE


def tombstone(stream: StreamDef, key: str, time_ms: int) -> Event:
    """The delete of `key`'s row, at `time_ms`."""
    strings: dict[str, str | None] = {name: ("" if name in stream.dimensions else None) for name in stream.string_fields}
    strings[stream.key_field] = key
    strings[OP_FIELD] = DELETE
    return Event(event_time_ms=time_ms, key=key, strings=strings, numbers={name: None for name in stream.values})


def key_problem(key: str) -> str | None:
    """Why `key` cannot name a row, or None: a label's rules, and not empty. An empty key sorts
    before every other, where a listing's first page starts (its cursor "" is "from the start"), and
    no DELETE path can name it: such a row could be written but neither paged to nor deleted."""
    if not key:
        return "empty key"
    return label_problem(key)


def as_upsert(event: Event) -> Event:
    return replace(event, strings={**event.strings, OP_FIELD: UPSERT})


class TableRowValidator:
    """Validates the rows of a POST to a table: each an upsert of its key's row, or a delete."""

    def __init__(self, stream: StreamDef):
        self.stream = stream
        self.events = EventValidator(stream)
        self.columns = {stream.key_field, stream.time_field, *stream.dimensions, *stream.values} - {OP_FIELD}

    def validate(self, raw: Any, now_ms: int) -> Event:
        """The change a row asks for; ValueError says why it is refused. A row without the
        time field changes the table at `now_ms` (the time it was received)."""
        stream = self.stream
        if not isinstance(raw, dict):
            raise ValueError(f"a row must be a JSON object, got {type(raw).__name__}")
        if OP_FIELD in raw:
            raise ValueError(f"{OP_FIELD}: set by Sketchboard (upsert, or delete with \"{DELETED_FLAG}\": true)")
        deleted = raw.get(DELETED_FLAG, False)
        if not isinstance(deleted, bool):
            raise ValueError(f"{DELETED_FLAG}: must be true or false")
        undeclared = sorted(set(raw) - self.columns - {DELETED_FLAG})
        if undeclared:
            raise ValueError(f"{undeclared[0]}: not a column of table {stream.name!r} (a row holds its key"
                             f" {stream.key_field!r}, the time and the declared dimensions and values)")
        if stream.time_field not in raw:
            raw = {**raw, stream.time_field: now_ms}
        if deleted:
            extra = sorted(set(raw) - {stream.key_field, stream.time_field, DELETED_FLAG})
            if extra:
                raise ValueError(f"{extra[0]}: a delete carries only the key (and the time)")
            event = self._keyed({stream.key_field: raw.get(stream.key_field), stream.time_field: raw[stream.time_field]})
            return tombstone(stream, event.key, event.event_time_ms)
        return as_upsert(self._keyed({k: v for k, v in raw.items() if k != DELETED_FLAG}))

    def _keyed(self, raw: dict) -> Event:
        """The event of a row whose key can name a row (the event validator checks the label)."""
        event = self.events.validate(raw)
        if not event.key:
            raise ValueError(f"{self.stream.key_field}: empty key (a row's key is at least one character)")
        return event


# -- Kafka records -----------------------------------------------------------------------------


def record_value(stream: StreamDef, event: Event, to_json) -> bytes | None:
    """A Kafka record's value: None for a tombstone (what compaction deletes), else `to_json`'s."""
    if is_tombstone(stream, event):
        return None
    return to_json(stream, event)


def record_event(stream: StreamDef, validator: EventValidator, key: bytes | None, value: bytes | None,
                 timestamp_ms: int | None, from_json) -> Event:
    """The event of a Kafka record of `stream` (ValueError when it is none): a table's null value
    with a key is a tombstone at the record's timestamp; a table's JSON value is an upsert."""
    if not is_table(stream):
        return from_json(validator, value)
    if value is None:
        if key is None:
            raise ValueError("a tombstone (null value) without a key")
        if timestamp_ms is None:
            raise ValueError("a tombstone without a timestamp")
        try:
            text = key.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("a tombstone whose key is not UTF-8") from None
        # The rules a POSTed delete's key meets through the validator (a label, not empty).
        problem = key_problem(text)
        if problem is not None:
            raise ValueError(f"a tombstone's key: {problem}")
        return tombstone(stream, text, timestamp_ms)
    event = from_json(validator, value)
    if not event.key:  # as a POSTed row's (TableRowValidator)
        raise ValueError(f"{stream.key_field}: empty key (a row's key is at least one character)")
    return as_upsert(event)

"""Changes of a changelog table (`kind: table`, catalog/tables.py) as log records. Pure, no I/O.

A change is an event of the table's stream whose implicit dimension `op` says which change it is:
- an upsert carries the key and the row (the declared dimensions and values), `op` "upsert";
- a delete (tombstone) carries the key only, `op` "delete", and every other column null.
On the embedded log both are rows of a segment like any event. On Kafka an upsert is the row's
JSON (as a direct producer would send it) and a tombstone is a record with the key and a null
value, as Kafka's log compaction expects; reading one back gives the same events. A JSON record
read back meets a POSTed row's rules and must be keyed by its row's key (compaction goes by the
record key).
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

    def __init__(self, stream: StreamDef, events: EventValidator | None = None, *, keep_undeclared: bool = False):
        self.stream = stream
        # `events`: the stream's validator when the caller holds one (a Kafka reader, per record).
        self.events = EventValidator(stream) if events is None else events
        self.columns = {stream.key_field, stream.time_field, *stream.dimensions, *stream.values} - {OP_FIELD}
        # A record read from the log may have been written under a newer definition (a column
        # declared since): its undeclared columns are kept as the event's extra fields, as an
        # event stream's are, for the pipeline that reads it with that definition (reprocessing).
        self.keep_undeclared = keep_undeclared

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
        if undeclared and not (self.keep_undeclared and not deleted):
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
    with a key is a tombstone at the record's timestamp; a table's JSON value is the change its
    row asks for, under a POSTed row's rules, and keyed by that row's key."""
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
    return _record_row(stream, validator, key, value, timestamp_ms, from_json)


def _record_row(stream: StreamDef, validator: EventValidator, key: bytes | None, value: bytes,
                timestamp_ms: int | None, from_json) -> Event:
    """A table's JSON record: validated as a POSTed row is (a row without the time field takes the
    record's timestamp, as the API takes the time it received the row), and refused unless the
    record's key is the row's. Kafka compacts the topic by the record key: a row filed under
    another key would be kept or removed with that key's records, not its own."""
    if key is None:
        raise ValueError(f"a record without a key: a table's record is keyed by its row's {stream.key_field!r}")
    try:
        record_key = key.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("a record whose key is not UTF-8") from None
    event = from_json(_RecordRowValidator(stream, validator, timestamp_ms), value)
    if event.key != record_key:
        # Cut short: a key is a label, but a record's key may be anything a producer sent.
        raise ValueError(f"the record's key {record_key[:40]!r} is not its row's {stream.key_field!r}"
                         f" {event.key[:40]!r}: Kafka compacts a table's topic by the record key")
    return event


class _RecordRowValidator:
    """A table's row rules (TableRowValidator) behind the validate(raw) that `from_json` calls."""

    def __init__(self, stream: StreamDef, events: EventValidator, timestamp_ms: int | None):
        self.rows = TableRowValidator(stream, events, keep_undeclared=True)
        self.timestamp_ms = timestamp_ms

    def validate(self, raw: Any) -> Event:
        time_field = self.rows.stream.time_field
        if self.timestamp_ms is None and isinstance(raw, dict) and time_field not in raw:
            raise ValueError(f"{time_field}: required field is missing (and the record has no timestamp)")
        return self.rows.validate(_without_own_op(raw), self.timestamp_ms)


def _without_own_op(raw: Any) -> Any:
    """`raw` without the `op` Sketchboard writes into an upsert's JSON (ingest/log/records.py writes
    an event's strings): that one says what the record is. Any other `op` is refused as a
    POSTed row's is: a JSON record never silently becomes an upsert of a row that says otherwise."""
    if isinstance(raw, dict) and raw.get(OP_FIELD) == UPSERT:
        return {k: v for k, v in raw.items() if k != OP_FIELD}
    return raw

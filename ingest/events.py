"""The event model: validate raw JSON events against a stream's definition.

Each stream gets a pydantic model built from its declared fields. Validation is strict
about types (a latency of "12" or true is an error, not a guess) and turns the event
time into epoch milliseconds. Undeclared fields are kept as they are ("extra"), so a
later definition can use them when the log is reprocessed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    create_model,
)

from catalog import StreamDef
from catalog.labels import NUL, NUL_REASON, SURROGATE_REASON, UNSTORABLE, unstorable  # noqa: F401 (shared names)
from catalog.times import parse_event_time_ms

MAX_STRING_LENGTH = 1024
# And at most this many bytes of UTF-8 (1 024 characters of 3 or 4 bytes would be up to 4 096): a
# key is held in PostgreSQL B-tree entries (sessions, event ids, device clocks, tables, joins),
# whose limit is ~2 700 bytes; past it the insert fails and its batch with it, at every replay.
MAX_LABEL_BYTES = 2048
# A value field's magnitude: any sum of such values stays a finite double (it would take over
# 10**18 of them to pass 1.8e308), so a pane's or tier row's sum never overflows. math.fsum raised
# OverflowError on two 1e308 values in a batch, and a batch the store cannot commit fails at every
# replay; an infinite sum was stored as text neither store's JSON functions read.
MAX_ABS_VALUE = 1e290
VALUE_RANGE_REASON = "value must be within -1e290..1e290 (so that no sum of such values overflows)"
# What no label can hold (a NUL, a lone surrogate): catalog/labels.py, which the catalog's checks share.
_UNSTORABLE = UNSTORABLE


def label_problem(label: str) -> str | None:
    """Why `label` cannot be a label (its length, its bytes, a NUL, a lone surrogate), or None."""
    if len(label) > MAX_STRING_LENGTH:
        return f"longer than {MAX_STRING_LENGTH} characters"
    if _UNSTORABLE.search(label) is not None:
        return unstorable(label)
    if len(label) * 4 > MAX_LABEL_BYTES and not label.isascii() and len(label.encode("utf-8")) > MAX_LABEL_BYTES:
        return (f"longer than {MAX_LABEL_BYTES} bytes as UTF-8 ({MAX_STRING_LENGTH} characters at most, fewer"
                " where they take 3 or 4 bytes)")
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")


def has_surrogate(value: Any) -> bool:
    """Whether a JSON value holds a lone surrogate anywhere (its texts, keys, nested values)."""
    kind = type(value)
    if kind is str:
        return _SURROGATE.search(value) is not None
    if kind is dict:
        return any(has_surrogate(k) or has_surrogate(v) for k, v in value.items())
    if kind is list:
        return any(has_surrogate(v) for v in value)
    return False


def storable(text: str) -> str:
    """`text` with what no store can hold written as escapes (a NUL as \\x00, a lone surrogate as
    \\udXXX): for texts quoting what a producer sent, such as a dead letter's error."""
    if _UNSTORABLE.search(text) is None:
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace(NUL, "\\x00")


def _shown(value: Any) -> str:
    """A value for a message, cut short: a 4000-digit number or a 60 KB string is not worth echoing."""
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _to_label(value: Any) -> str:
    # Integers and booleans are accepted as labels (status: 200), like Prometheus label values.
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


EventTime = Annotated[int, BeforeValidator(parse_event_time_ms)]


@dataclass(frozen=True, slots=True)
class Event:
    """A validated event, ready for the log."""

    event_time_ms: int
    key: str | None
    strings: dict[str, str | None]  # dimensions ("" when missing), distinct fields, key
    numbers: dict[str, float | None]  # value fields (None when missing)
    extra: dict[str, Any] = field(default_factory=dict)
    # The stream's sent_time_field (when it declares one): when the device sent the event, by its
    # clock, in epoch ms; None when the event does not carry it (then it gives no clock sample).
    sent_time_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Rejection:
    index: int
    reason: str


class EventValidator:
    """Validates raw events for one stream; keeps the accepted ones and explains the rest."""

    def __init__(self, stream: StreamDef):
        self.stream = stream
        # Internal attribute names with the declared names as aliases: a field may then be
        # called anything the catalog allows (even "_x" or "model_config") without
        # colliding with pydantic's own attributes.
        self._attr: dict[str, str] = {}
        fields: dict[str, Any] = {}

        def declare(name: str, annotation: Any, default: Any) -> None:
            attr = f"f{len(self._attr)}"
            self._attr[name] = attr
            fields[attr] = (annotation, Field(default, alias=name))

        declare(stream.time_field, EventTime, ...)
        for name in stream.string_fields:
            required = name in (stream.key_field, stream.event_id_field)
            declare(name, StrictStr | StrictInt | bool | None, ... if required else None)
        for name in stream.values:
            declare(name, StrictFloat | StrictInt | None, None)
        if stream.sent_time_field:
            declare(stream.sent_time_field, EventTime | None, None)
        self._model: type[BaseModel] = create_model(  # type: ignore[call-overload]
            f"Event_{stream.name}",
            __config__=ConfigDict(extra="allow", populate_by_name=False, protected_namespaces=()),
            **fields,
        )
        self._adapter = TypeAdapter(self._model)
        # Computed once: the catalog derives it on every access, which cost ~8 % of a validation
        # (the Kafka source validates every record on the executors).
        self._string_fields = stream.string_fields

    def validate(self, raw: Any) -> Event:
        """Validate one raw event; raise ValueError with a readable reason."""
        if not isinstance(raw, dict):
            raise ValueError(f"an event must be a JSON object, got {type(raw).__name__}")
        try:
            model = self._adapter.validate_python(raw)
        except ValidationError as exc:
            raise ValueError(self._describe(exc)) from None
        stream = self.stream
        data = model.__dict__
        attr = self._attr
        strings: dict[str, str | None] = {}
        for name in self._string_fields:
            value = data.get(attr[name])
            if value is None:
                if name == stream.key_field:
                    raise ValueError(f"{name}: key field must not be null")
                if name == stream.event_id_field:
                    raise ValueError(f"{name}: event id field must not be null")
                strings[name] = "" if name in stream.dimensions else None
                continue
            label = _to_label(value)
            problem = label_problem(label)
            if problem is not None:
                raise ValueError(f"{name}: {problem}")
            strings[name] = label
        numbers: dict[str, float | None] = {}
        for name in stream.values:
            value = data.get(attr[name])
            if value is None:
                numbers[name] = None
                continue
            try:
                number = float(value)
            except OverflowError:  # an integer of hundreds of digits: past any float
                raise ValueError(f"{name}: value must be a finite number, got {_shown(value)}") from None
            if not math.isfinite(number):
                raise ValueError(f"{name}: value must be a finite number")
            if abs(number) > MAX_ABS_VALUE:
                raise ValueError(f"{name}: {VALUE_RANGE_REASON}, got {_shown(value)}")
            numbers[name] = number
        extra = dict(model.__pydantic_extra__ or {})
        for name, value in extra.items():  # kept as they are, but written as UTF-8 (a Kafka record)
            if has_surrogate(name) or has_surrogate(value):
                raise ValueError(f"{name}: {SURROGATE_REASON}")
        return Event(
            event_time_ms=data[attr[stream.time_field]],
            key=strings.get(stream.key_field) if stream.key_field else None,
            strings=strings,
            numbers=numbers,
            extra=extra,
            sent_time_ms=data.get(attr[stream.sent_time_field]) if stream.sent_time_field else None,
        )

    def _describe(self, exc: ValidationError) -> str:
        # One reason per field, in words a producer can act on (union errors are noisy).
        stream = self.stream
        reasons: dict[str, str] = {}
        for error in exc.errors(include_url=False):
            name = str(error["loc"][0]) if error["loc"] else "event"
            if name in reasons:
                continue
            if error["type"] == "missing":
                reasons[name] = "required field is missing"
            elif name == stream.time_field:
                reasons[name] = error["msg"].removeprefix("Value error, ")
            elif name == stream.sent_time_field:  # a time like the event time, by the device's clock
                reasons[name] = error["msg"].removeprefix("Value error, ").replace("event time", "sent time")
            elif name in stream.values:
                reasons[name] = f"must be a number, got {_json_type(error.get('input'))}"
            elif name in stream.string_fields:
                reasons[name] = f"must be a string or an integer, got {_json_type(error.get('input'))}"
            else:
                reasons[name] = error["msg"]
        return "; ".join(f"{name}: {reason}" for name, reason in reasons.items())


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return f"a string ({value[:40]!r})"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__

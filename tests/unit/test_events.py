"""ingest.events: per-stream validation of raw events and event-time parsing."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog import StreamDef, load_catalog
from catalog.times import EPOCH_MS_THRESHOLD, MAX_EVENT_TIME_MS, parse_event_time_ms
from ingest.events import (MAX_STRING_LENGTH, NUL_REASON, SURROGATE_REASON, Event, EventValidator, Rejection,
                           storable, unstorable)
from tests.support.events import validate_many

CONFIG = Path(__file__).resolve().parents[2] / "config" / "streams.yaml"
T_MS = 1_700_000_000_000  # 2023-11-14T22:13:20Z

BASE = {
    "time": T_MS,
    "user_id": "u1",
    "endpoint": "/cart",
    "method": "GET",
    "status": "200",
    "region": "eu",
    "latency_ms": 12.5,
    "response_bytes": 512,
}


@pytest.fixture(scope="module")
def validator() -> EventValidator:
    return EventValidator(load_catalog(CONFIG).stream("http_requests"))


def event(**changes: Any) -> dict:
    """BASE with fields changed; a value of ... removes the field."""
    raw = dict(BASE)
    for name, value in changes.items():
        if value is ...:
            raw.pop(name, None)
        else:
            raw[name] = value
    return raw


def reason(validator: EventValidator, raw: Any) -> str:
    with pytest.raises(ValueError) as info:
        validator.validate(raw)
    return str(info.value)


# -- a good event -----------------------------------------------------------------------


def test_valid_event(validator: EventValidator) -> None:
    e = validator.validate(event())
    assert isinstance(e, Event)
    assert e.event_time_ms == T_MS
    assert e.key == "u1"
    # plan, country and tier: enriched through the view user_plans by the pipeline; "" until then
    assert e.strings == {"endpoint": "/cart", "method": "GET", "status": "200", "region": "eu", "user_id": "u1",
                         "plan": "", "country": "", "tier": ""}
    assert e.numbers == {"latency_ms": 12.5, "response_bytes": 512.0}
    assert isinstance(e.numbers["response_bytes"], float)
    assert e.extra == {}


# -- event time -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("time", "ms"),
    [
        (T_MS, T_MS),  # epoch ms
        (1_700_000_000, T_MS),  # epoch s, int
        (1_700_000_000.5, T_MS + 500),  # epoch s, float
        (1_700_000_000.1234, T_MS + 123),  # rounded to the ms
        ("2023-11-14T22:13:20Z", T_MS),
        ("2023-11-14T22:13:20.250Z", T_MS + 250),
        ("2023-11-14T23:13:20+01:00", T_MS),
        ("2023-11-14T17:13:20.5-05:00", T_MS + 500),
        ("  2023-11-14T22:13:20Z  ", T_MS),
        ("1970-01-01T00:00:00Z", 0),
        (0, 0),
        (MAX_EVENT_TIME_MS, MAX_EVENT_TIME_MS),
        ("9999-12-31T23:59:59.999Z", MAX_EVENT_TIME_MS),
    ],
)
def test_event_time_forms(validator: EventValidator, time: Any, ms: int) -> None:
    assert validator.validate(event(time=time)).event_time_ms == ms


def test_naive_rfc3339_rejected(validator: EventValidator) -> None:
    text = reason(validator, event(time="2023-11-14T22:13:20"))
    assert text.startswith("time: ")
    assert "has no time zone" in text


@pytest.mark.parametrize("bad", ["yesterday", "2023-13-01T00:00:00Z", "", "12:00"])
def test_unparseable_time_rejected(validator: EventValidator, bad: str) -> None:
    assert "is not an RFC 3339 timestamp" in reason(validator, event(time=bad))


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (True, "not a boolean"),
        (False, "not a boolean"),
        (None, "must be epoch ms, epoch seconds or an RFC 3339 string"),
        ({"at": 1}, "must be epoch ms, epoch seconds or an RFC 3339 string"),
        ([T_MS], "must be epoch ms, epoch seconds or an RFC 3339 string"),
        (float("nan"), "must be finite"),
        (float("inf"), "must be finite"),
        (-1, "outside 1970..9999"),
        (MAX_EVENT_TIME_MS + 1, "outside 1970..9999"),
        ("1969-12-31T23:59:59Z", "outside 1970..9999"),
    ],
)
def test_bad_time_rejected(validator: EventValidator, bad: Any, words: str) -> None:
    text = reason(validator, event(time=bad))
    assert text.startswith("time: ")
    assert words in text


def test_missing_time(validator: EventValidator) -> None:
    assert reason(validator, event(time=...)) == "time: required field is missing"


def test_parse_event_time_threshold() -> None:
    # just below the threshold: seconds; at it: milliseconds
    assert parse_event_time_ms(EPOCH_MS_THRESHOLD - 1) == (EPOCH_MS_THRESHOLD - 1) * 1000
    assert parse_event_time_ms(EPOCH_MS_THRESHOLD) == EPOCH_MS_THRESHOLD


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=EPOCH_MS_THRESHOLD, max_value=MAX_EVENT_TIME_MS))
def test_epoch_ms_round_trips_exactly(ms: int) -> None:
    assert parse_event_time_ms(ms) == ms


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=0, max_value=EPOCH_MS_THRESHOLD, exclude_max=True, allow_nan=False))
def test_epoch_seconds_float_maps_to_rounded_ms(seconds: float) -> None:
    assert parse_event_time_ms(seconds) == round(seconds * 1000)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=EPOCH_MS_THRESHOLD - 1))
def test_epoch_seconds_int_maps_to_ms(seconds: int) -> None:
    assert parse_event_time_ms(seconds) == seconds * 1000


# -- values -----------------------------------------------------------------------------


def test_string_number_rejected(validator: EventValidator) -> None:
    assert reason(validator, event(latency_ms="12")) == "latency_ms: must be a number, got a string ('12')"


@pytest.mark.parametrize("flag", [True, False])
def test_bool_value_rejected(validator: EventValidator, flag: bool) -> None:
    assert reason(validator, event(latency_ms=flag)) == "latency_ms: must be a number, got a boolean"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_value_rejected(validator: EventValidator, bad: float) -> None:
    assert reason(validator, event(response_bytes=bad)) == "response_bytes: value must be a finite number"


@pytest.mark.parametrize(("bad", "kind"), [([1], "an array"), ({"v": 1}, "an object")])
def test_structured_value_rejected(validator: EventValidator, bad: Any, kind: str) -> None:
    assert reason(validator, event(latency_ms=bad)) == f"latency_ms: must be a number, got {kind}"


def test_missing_or_null_value_is_none(validator: EventValidator) -> None:
    assert validator.validate(event(latency_ms=...)).numbers["latency_ms"] is None
    assert validator.validate(event(latency_ms=None)).numbers["latency_ms"] is None


def test_negative_and_zero_values_are_fine(validator: EventValidator) -> None:
    assert validator.validate(event(latency_ms=-0.5, response_bytes=0)).numbers == {
        "latency_ms": -0.5,
        "response_bytes": 0.0,
    }


# -- strings ----------------------------------------------------------------------------


def test_integer_label_becomes_text(validator: EventValidator) -> None:
    assert validator.validate(event(status=200)).strings["status"] == "200"


def test_bool_label_becomes_text(validator: EventValidator) -> None:
    assert validator.validate(event(status=True)).strings["status"] == "true"


def test_float_label_rejected(validator: EventValidator) -> None:
    assert reason(validator, event(status=1.5)) == "status: must be a string or an integer, got a number"


def test_object_label_rejected(validator: EventValidator) -> None:
    assert reason(validator, event(region={"x": 1})) == "region: must be a string or an integer, got an object"


def test_missing_dimension_becomes_empty(validator: EventValidator) -> None:
    e = validator.validate(event(region=..., status=None))
    assert e.strings["region"] == ""
    assert e.strings["status"] == ""


def test_missing_key_rejected(validator: EventValidator) -> None:
    assert reason(validator, event(user_id=...)) == "user_id: required field is missing"


def test_null_key_rejected(validator: EventValidator) -> None:
    assert "key field must not be null" in reason(validator, event(user_id=None))


def test_integer_key_becomes_text(validator: EventValidator) -> None:
    e = validator.validate(event(user_id=42))
    assert e.key == "42"
    assert e.strings["user_id"] == "42"


def test_string_length_limit(validator: EventValidator) -> None:
    ok = "x" * MAX_STRING_LENGTH
    assert validator.validate(event(endpoint=ok)).strings["endpoint"] == ok
    assert reason(validator, event(endpoint=ok + "x")) == f"endpoint: longer than {MAX_STRING_LENGTH} characters"
    assert "longer than" in reason(validator, event(user_id="k" * (MAX_STRING_LENGTH + 1)))


def test_a_nul_character_or_a_lone_surrogate_in_a_label_is_refused(validator: EventValidator) -> None:
    """PostgreSQL's text cannot hold U+0000, and SQLite's json_each cuts a bound key at it; a lone
    surrogate is no Unicode text (no UTF-8 for a partition's hash, a store or an answer)."""
    assert reason(validator, event(user_id="u\x001")) == "user_id: contains a NUL character (U+0000), which the stores cannot hold"
    assert "NUL character" in reason(validator, event(region="e\x00u"))
    assert reason(validator, event(user_id="u\ud800")).startswith("user_id: contains a lone surrogate (U+D800..U+DFFF)")
    assert validator.validate(event(user_id="u\U0001f600")).key == "u\U0001f600"  # a pair is one character: fine
    # An undeclared field is kept as sent, but written as UTF-8 (a Kafka record): no lone surrogate there either.
    assert reason(validator, event(note="a\ud800")).startswith("note: contains a lone surrogate")
    assert reason(validator, event(tags=[{"k": ["x", "\udfff"]}])).startswith("tags: contains a lone surrogate")
    assert "unicode" in reason(validator, {**event(), "n\ud800te": 1})  # a name: pydantic refuses it itself
    assert validator.validate(event(note="a\x00", tags=["é"])).extra == {"note": "a\x00", "tags": ["é"]}


def test_a_label_is_at_most_2048_bytes_of_utf8(validator: EventValidator) -> None:
    """A key is held in PostgreSQL B-tree entries (~2 700 bytes at most): 1 024 characters of 3
    bytes would not fit, and its batch would fail at every replay."""
    assert validator.validate(event(user_id="中" * 682)).key == "中" * 682  # 2 046 bytes
    assert reason(validator, event(user_id="中" * 683)).startswith("user_id: longer than 2048 bytes as UTF-8")
    assert reason(validator, event(region="😀" * 513)).startswith("region: longer than 2048 bytes as UTF-8")
    assert validator.validate(event(region="x" * 1024)).strings["region"] == "x" * 1024


def test_a_text_quoting_a_producer_is_stored_with_escapes_where_no_store_could_hold_it():
    assert storable("plain, naïve") == "plain, naïve"
    assert storable("x\x00: integer") == "x\\x00: integer"
    assert storable("a\ud800b") == "a\\ud800b"
    assert unstorable("a\ud800b") == SURROGATE_REASON and unstorable("\x00") == NUL_REASON and unstorable("é") is None


def test_unicode_labels_kept(validator: EventValidator) -> None:
    assert validator.validate(event(region="zürich-東京")).strings["region"] == "zürich-東京"


# -- extra fields, whole-event errors ---------------------------------------------------


def test_extra_fields_kept(validator: EventValidator) -> None:
    e = validator.validate(event(trace_id="abc", nested={"a": [1, 2]}, flag=None))
    assert e.extra == {"trace_id": "abc", "nested": {"a": [1, 2]}, "flag": None}
    assert "trace_id" not in e.strings


@pytest.mark.parametrize(("raw", "kind"), [("text", "str"), (5, "int"), ([BASE], "list"), (None, "NoneType")])
def test_non_object_rejected(validator: EventValidator, raw: Any, kind: str) -> None:
    assert reason(validator, raw) == f"an event must be a JSON object, got {kind}"


def test_several_problems_named_once_each(validator: EventValidator) -> None:
    text = reason(validator, event(time=..., latency_ms="x", status=1.5))
    parts = dict(part.split(": ", 1) for part in text.split("; "))
    assert set(parts) == {"time", "latency_ms", "status"}
    assert parts["time"] == "required field is missing"


def test_validate_many(validator: EventValidator) -> None:
    raws = [
        event(),
        "not an object",
        event(latency_ms="12"),
        event(time=1_700_000_001),
        event(user_id=...),
        event(status=404, region=...),
    ]
    accepted, rejected = validate_many(validator, raws)
    assert [e.event_time_ms for e in accepted] == [T_MS, T_MS + 1000, T_MS]
    assert accepted[2].strings["status"] == "404"
    assert accepted[2].strings["region"] == ""
    assert rejected == [
        Rejection(1, "an event must be a JSON object, got str"),
        Rejection(2, "latency_ms: must be a number, got a string ('12')"),
        Rejection(4, "user_id: required field is missing"),
    ]


def test_validate_many_empty(validator: EventValidator) -> None:
    assert validate_many(validator, []) == ([], [])


# -- streams without a key, distinct fields that are not dimensions ---------------------


def test_keyless_stream_and_separate_distinct_field() -> None:
    stream = StreamDef(name="clicks", dimensions=("page",), values=("ms",), distinct=("session",))
    v = EventValidator(stream)
    e = v.validate({"time": T_MS, "page": "/", "session": "s1", "ms": 3})
    assert e.key is None
    assert e.strings == {"page": "/", "session": "s1"}
    missing = v.validate({"time": T_MS})
    assert missing.strings == {"page": "", "session": None}  # a distinct field that is not a dimension stays null
    assert missing.numbers == {"ms": None}


def test_custom_time_field() -> None:
    v = EventValidator(StreamDef(name="s", time_field="ts", values=("x",)))
    assert v.validate({"ts": "2023-11-14T22:13:20Z", "x": 1}).event_time_ms == T_MS
    assert v.validate({"ts": T_MS, "time": "ignored"}).extra == {"time": "ignored"}
    assert "ts: required field is missing" in str(pytest.raises(ValueError, v.validate, {"time": T_MS}).value)


# -- field names the catalog accepts must work as event fields --------------------------


def _field_round_trip(role: str, name: str) -> None:
    """The catalog accepts the name for the role, and an event's field of that name validates
    into the role, without a warning (pydantic warns when a field shadows a BaseModel attribute)."""
    stream = StreamDef(name="s", **{role: (name,)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        v = EventValidator(stream)
    if role == "dimensions":
        assert v.validate({"time": T_MS, name: "x"}).strings[name] == "x"
    else:
        assert v.validate({"time": T_MS, name: 5}).numbers[name] == 5.0


@pytest.mark.parametrize("name", ["json", "copy", "schema", "validate", "dict", "model_fields"])
@pytest.mark.parametrize("role", ["dimensions", "values"])
def test_names_shadowing_basemodel_attributes_work(role: str, name: str) -> None:
    _field_round_trip(role, name)


@pytest.mark.parametrize("role", ["dimensions", "values"])
def test_underscore_field_names(role: str) -> None:
    _field_round_trip(role, "_f")


def test_underscore_time_field() -> None:
    v = EventValidator(StreamDef(name="s", time_field="_t"))
    assert v.validate({"_t": T_MS}).event_time_ms == T_MS


def test_field_named_model_config() -> None:
    _field_round_trip("dimensions", "model_config")


@pytest.mark.parametrize("name", ["model_dump", "model_validate"])
def test_field_named_like_a_model_method(name: str) -> None:
    _field_round_trip("values", name)


def test_rejected_values_never_nan() -> None:
    v = EventValidator(StreamDef(name="s", values=("x",)))
    e = v.validate({"time": T_MS, "x": 1e290})
    assert math.isfinite(e.numbers["x"])


@pytest.mark.parametrize("value", [1e308, -1e291, 10**300])
def test_a_value_past_the_bound_no_sum_overflows_is_refused(value) -> None:
    # Two 1e308 in one pane made the commit's fsum raise at every replay of the batch.
    v = EventValidator(StreamDef(name="s", values=("x",)))
    with pytest.raises(ValueError, match=r"x: value must be within -1e290\.\.1e290"):
        v.validate({"time": T_MS, "x": value})
    assert v.validate({"time": T_MS, "x": -1e290}).numbers["x"] == -1e290

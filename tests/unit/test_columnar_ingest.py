"""The columnar ingest path (ingest/columnar.py) against the per-event one it stands in for.

Property: whatever body the columnar path takes, the per-event path (api/bodies.parse_events,
the stream's EventValidator and the JSON bounds) accepts every event of it, and both give the
same segment batch, with each reader (our scanner, Arrow's: ingest/columnar.py READERS).
Whatever the columnar path leaves (None) is decided by the per-event path as before, so the
API's answers cannot depend on which one ran. And it does take the plain
bodies producers send, NDJSON and JSON arrays, or it would be dead weight.
"""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.bodies import MalformedLine, columnar_body, parse_events
from catalog.loader import parse_catalog
from ingest.columnar import READERS, _plain_numbers, _validated, columnar_events, limits_allow, object_lines
from ingest.columnar_scan import scanned_fields
from ingest.events import EventValidator
from ingest.json_limits import JsonLimits, violation
from ingest.log.records import columns_to_batch, events_to_batch

T0 = 1_795_000_000_000
INGEST_MS = 1_795_000_100_000

CATALOG = parse_catalog("""
streams:
  readings:
    time_field: time
    key_field: device
    dimensions: [site, kind]
    values: [temp, bytes]
    distinct: [user]
    pane: 10s
    partitions: 3
  orders:
    time_field: time
    dimensions: [country]
    values: [amount]
    event_id_field: request_id
    partitions: 2
metrics:
  temp: {stream: readings, value: temp}
""")
STREAM = CATALOG.streams["readings"]
ORDERS = CATALOG.streams["orders"]  # keyless, with an event id that every event must carry
LIMITS = JsonLimits()

labels = st.text(max_size=6)  # a NUL among them: refused by the per-event path, left to it by the columnar one
# what st.text draws by default (no surrogates) less the NUL
clean_labels = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=6)
# Per field: what producers send, and what they get wrong.
FIELD_VALUES = {
    "time": st.one_of(st.integers(T0, T0 + 10**7), st.integers(1_795_000_000, 1_795_010_000),  # ms, s
                      st.integers(-10**12, 10**12), st.integers(2**62, 2**64), st.floats(allow_nan=True),
                      st.just("2026-11-23T10:00:00Z"), st.none(), st.booleans()),
    "device": st.one_of(labels, labels, st.integers(0, 300), st.none(), st.booleans()),
    "site": st.one_of(labels, labels, st.integers(-5, 5), st.none(), st.text(min_size=1020, max_size=1030)),
    "kind": st.one_of(labels, st.none(), st.lists(st.integers(), max_size=2), st.dictionaries(labels, labels, max_size=1)),
    "user": st.one_of(labels, st.none(), st.booleans()),
    "temp": st.one_of(st.floats(-1e6, 1e6), st.integers(-10**6, 10**6), st.integers(2**53, 2**70),
                      st.integers(10**38, 10**45), st.none(),
                      st.floats(allow_nan=True, allow_infinity=True), st.just("12"), st.booleans()),
    "bytes": st.one_of(st.integers(0, 10**6), st.none()),
    "extra": st.one_of(st.integers(), labels, st.dictionaries(labels, st.integers(), max_size=2)),
}
CLEAN_VALUES = {
    "time": st.integers(T0, T0 + 10**7),
    "device": clean_labels,
    "site": clean_labels,
    "kind": st.one_of(clean_labels, st.none()),
    "user": st.one_of(clean_labels, st.none()),
    "temp": st.one_of(st.floats(-1e6, 1e6), st.integers(-10**6, 10**6), st.none()),
    "bytes": st.integers(0, 10**6),
}


def events_from(values: dict, required: tuple[str, ...]) -> st.SearchStrategy[dict]:
    optional = {k: v for k, v in values.items() if k not in required}
    return st.fixed_dictionaries({k: values[k] for k in required}, optional=optional)


any_event = st.one_of(events_from(FIELD_VALUES, ()), events_from(FIELD_VALUES, ("time", "device")),
                      st.none(), st.integers(), st.lists(st.integers(), max_size=2))
clean_event = events_from(CLEAN_VALUES, ("time", "device"))


def ndjson(events: list, *, blank_lines: bool = False, two_on_a_line: bool = False, broken: bool = False) -> bytes:
    lines = [json.dumps(e) for e in events]
    if two_on_a_line and len(lines) > 1:
        lines[0:2] = [lines[0] + " " + lines[1]]
    if broken and lines:
        lines[-1] = lines[-1][:-1]
    if blank_lines:
        lines.insert(len(lines) // 2, "  ")
    return "\n".join(lines).encode()


def per_event(body: bytes, content_type: str, stream=STREAM) -> tuple[list, list[int]]:
    """What the per-event path makes of a body: the valid events, and the indexes it rejects."""
    accepted, rejected = [], []
    validator = EventValidator(stream)
    for index, raw in enumerate(parse_events(body, content_type)):
        if isinstance(raw, MalformedLine):
            rejected.append(index)
            continue
        try:
            event = validator.validate(raw)
        except ValueError:
            rejected.append(index)
            continue
        if violation(raw, LIMITS):
            rejected.append(index)
            continue
        accepted.append(event)
    return accepted, rejected


def assert_same_as_per_event(body: bytes, content_type: str, stream=STREAM, reader: str = "arrow"):
    columns = columnar_body(stream, body, content_type, LIMITS, reader=reader)
    if columns is None:
        return None
    accepted, rejected = per_event(body, content_type, stream)
    assert rejected == [], f"the columnar path took a body the per-event path rejects in part: {body[:300]!r}"
    assert columns_to_batch(stream, columns, INGEST_MS).equals(events_to_batch(stream, accepted, INGEST_MS))
    return columns


@pytest.mark.parametrize("reader", READERS)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(any_event, min_size=1, max_size=8), blank=st.booleans(), two=st.booleans(), broken=st.booleans())
def test_an_ndjson_body_taken_as_columns_is_one_the_per_event_path_accepts_whole(reader, events, blank, two, broken):
    assert_same_as_per_event(ndjson(events, blank_lines=blank, two_on_a_line=two, broken=broken),
                             "application/x-ndjson", reader=reader)


@pytest.mark.parametrize("reader", READERS)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(any_event, min_size=0, max_size=8))
def test_a_json_array_taken_as_columns_is_one_the_per_event_path_accepts_whole(reader, events):
    assert_same_as_per_event(json.dumps(events).encode(), "application/json", reader=reader)


@pytest.mark.parametrize("reader", READERS)
@settings(max_examples=150, deadline=None)
@given(events=st.lists(clean_event, min_size=1, max_size=30), array=st.booleans())
def test_plain_valid_bodies_take_the_columnar_path(reader, events, array):
    body, content_type = (json.dumps(events).encode(), "application/json") if array else \
        (ndjson(events), "application/x-ndjson")
    columns = assert_same_as_per_event(body, content_type, reader=reader)
    assert columns is not None and columns.num_rows == len(events)


# Our scanner (ingest/columnar_scan.py) on its own, before Arrow's reader takes what it leaves: JSON
# text written token by token, as producers other than Python's json module write it: raw UTF-8,
# any key order, whitespace anywhere, numbers in every form JSON has, and what JSON does not allow.
WHITESPACE = st.sampled_from(["", "", "", " ", "\t", "\r", "  "])
valid_number = st.one_of(
    st.integers(-10**6, 10**6).map(str), st.integers(-10**20, 10**20).map(str),
    st.floats(-1e6, 1e6).map(repr), st.floats(-1e-3, 1e-3).map(repr),  # Python's: 1e-05, 0.30000000000000004
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.tuples(st.sampled_from(["", "-"]), st.sampled_from(["0", "7", "12", "1795000000", "1795000000000"]),
              st.sampled_from(["", ".5", ".25", ".0001", ".123456789012345678901"]),
              st.sampled_from(["", "e3", "E+2", "e-7", "e400", "E-400", "e22", "e-22", "e23", "e-23"])).map("".join))
invalid_number = st.sampled_from(["-", "+1", ".5", "1.", "01", "-01", "1e", "1e+", "1.5.2", "0x10", "Infinity", "NaN",
                                  "true", "nul", "[]", "{}", '"12"'])
# Labels as producers write them when not escaping (no quote, backslash or control character), and any text.
raw_labels = st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters='"\\'), max_size=6)
raw_label = raw_labels.map(lambda t: json.dumps(t, ensure_ascii=False))
valid_label = st.one_of(raw_label, raw_label, raw_label, raw_label, st.just("null"),
                        st.text(max_size=6).map(lambda t: json.dumps(t, ensure_ascii=False)),  # escapes where needed
                        st.text(max_size=6).map(json.dumps))  # and of everything past ASCII
invalid_label = st.sampled_from(['"a\x01b"', '"tab\there"', '"a', "12", "true", "[]"])
label_text = st.one_of(valid_label, invalid_label)
number_text = st.one_of(valid_number, st.just("null"), invalid_number)
VALID_TEXTS = {"time": st.integers(T0, T0 + 10**7).map(str),
               "device": raw_label,
               "site": valid_label, "kind": valid_label, "user": valid_label,
               "temp": st.one_of(valid_number, st.just("null")), "bytes": st.one_of(valid_number, st.just("null"))}
OTHER_TEXTS = {"time": st.one_of(valid_number, invalid_number), "device": st.one_of(valid_label, invalid_label)}
rarely = st.sampled_from([False] * 19 + [True])


@st.composite
def event_text(draw, newlines: bool):
    """An object of the stream's fields in any order; now and then one of them missing, written
    otherwise (a value JSON has, or not), doubled, or an undeclared one."""
    names = draw(st.permutations(list(VALID_TEXTS)))
    texts = {name: draw(VALID_TEXTS[name]) for name in names}
    if draw(rarely):
        names = names[:draw(st.integers(0, len(names)))]
    if draw(rarely):
        flawed = draw(st.sampled_from(list(VALID_TEXTS)))
        texts[flawed] = draw(OTHER_TEXTS.get(flawed, st.one_of(number_text, label_text)))
    if draw(rarely):
        names.insert(draw(st.integers(0, len(names))), draw(st.sampled_from(["extra", *VALID_TEXTS])))
    space = st.one_of(WHITESPACE, st.just("\n")) if newlines or draw(rarely) else WHITESPACE
    pairs = [f'{draw(space)}"{name}"{draw(space)}:{draw(space)}{texts.get(name, "0")}{draw(space)}' for name in names]
    return "{" + ",".join(pairs) + "}"


@st.composite
def body_text(draw) -> tuple[bytes, bool]:
    array = draw(st.booleans())
    events = draw(st.lists(event_text(array), min_size=1, max_size=6))
    if array:
        space = st.one_of(WHITESPACE, st.just("\n"))
        return ("[" + ",".join(f"{draw(space)}{e}{draw(space)}" for e in events) + "]").encode(), False
    ends = st.sampled_from(["\n"] * 6 + ["\r\n", "\n\n", " \n", "\n  \n", " "])  # " ": two objects on a line
    text = "".join(e + draw(ends) for e in events)
    return (text if draw(st.booleans()) else text.rstrip()).encode(), True


def scanned(body: bytes, ndjson: bool, stream=STREAM) -> pa.Table | None:
    """What our scanner alone makes of a body (no Arrow reader after it), checked as columnar_events does."""
    read = scanned_fields(stream, body, ndjson)
    return None if read is None else _validated(stream, *read, search_nul=False)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=body_text())
def test_a_body_our_scanner_takes_is_one_the_per_event_path_accepts_whole_into_the_same_batch(body):
    text, ndjson_body = body
    columns = scanned(text, ndjson_body)
    if columns is None:
        return
    content_type = "application/x-ndjson" if ndjson_body else "application/json"
    accepted, rejected = per_event(text, content_type)
    assert rejected == [], f"the scanner took a body the per-event path rejects in part: {text[:300]!r}"
    assert columns_to_batch(STREAM, columns, INGEST_MS).equals(events_to_batch(STREAM, accepted, INGEST_MS))


RAW_VALUES = {**CLEAN_VALUES, "device": raw_labels, "site": raw_labels, "kind": st.one_of(raw_labels, st.none()),
              "user": st.one_of(raw_labels, st.none()),
              "temp": st.one_of(st.floats(-1e6, 1e6), st.floats(-1e6, 1e6).map(lambda v: v * 1e-9),
                                st.integers(-10**6, 10**6), st.none())}


@settings(max_examples=300, deadline=None)
@given(events=st.lists(events_from(RAW_VALUES, ("time", "device")), min_size=1, max_size=30), array=st.booleans(),
       compact=st.booleans())
def test_our_scanner_itself_takes_the_plain_bodies_producers_send(events, array, compact):
    """Not left to Arrow's reader: raw UTF-8 labels, every double Python writes (17 digits, exponents)."""
    separators = (",", ":") if compact else (", ", ": ")
    if array:
        body, content_type = json.dumps(events, ensure_ascii=False, separators=separators).encode(), "application/json"
    else:
        body = "\n".join(json.dumps(e, ensure_ascii=False, separators=separators) for e in events).encode()
        content_type = "application/x-ndjson"
    columns = scanned(body, not array)
    assert columns is not None and columns.num_rows == len(events)
    accepted, rejected = per_event(body, content_type)
    assert rejected == []
    assert columns_to_batch(STREAM, columns, INGEST_MS).equals(events_to_batch(STREAM, accepted, INGEST_MS))


@settings(max_examples=1000, deadline=None)
@given(raw=st.one_of(
    st.binary(max_size=8), st.text(max_size=4).map(lambda t: t.encode("utf-8", "surrogatepass")),
    # bytes at the edges of UTF-8's ranges: leads, continuations, what is neither
    st.lists(st.sampled_from([0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1,
                              0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF]), max_size=8).map(bytes)))
def test_our_scanner_takes_a_labels_bytes_exactly_where_pythons_strict_utf8_decoder_does(raw):
    """It checks UTF-8 itself (overlong forms, surrogates, past U+10FFFF, cut short), where the
    other readers' path decodes the whole body first."""
    assert_label_bytes_read_as_python_decodes(raw)


@pytest.mark.parametrize("raw", [
    b"\xc2\x80", b"\xdf\xbf", b"\xe0\xa0\x80", b"\xed\x9f\xbf", b"\xee\x80\x80", b"\xf0\x90\x80\x80",
    b"\xf4\x8f\xbf\xbf",  # the edges of what is UTF-8
    b"\xc0\x80", b"\xc1\xbf", b"\xe0\x9f\xbf", b"\xf0\x8f\xbf\xbf",  # overlong
    b"\xed\xa0\x80", b"\xed\xbf\xbf",  # surrogates
    b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xf7\xbf\xbf\xbf", b"\xff",  # past U+10FFFF
    b"\x80", b"\xe2\x82", b"a\xe2\x82\xac\xac",  # a stray continuation, cut short
], ids=lambda raw: raw.hex())
def test_our_scanner_takes_the_edges_of_utf8_as_pythons_decoder_does(raw):
    assert_label_bytes_read_as_python_decodes(raw)


def assert_label_bytes_read_as_python_decodes(raw: bytes) -> None:
    raw = bytes(b for b in raw if b >= 0x20 and b not in b'"\\')
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    columns = scanned(b'{"time": %d, "device": "' % T0 + raw + b'"}', True)
    assert (columns is not None) == (text is not None)
    if columns is not None:
        assert columns.column("device").to_pylist() == [text]


KEYED_BY_A_DIMENSION = parse_catalog("""
streams:
  taps:
    time_field: time
    key_field: device
    event_id_field: rid
    dimensions: [device, site]
""").streams["taps"]


@settings(max_examples=200, deadline=None)
@given(events=st.lists(st.fixed_dictionaries({"time": st.integers(T0, T0 + 10**7)}, optional={
    "device": st.one_of(raw_labels, st.none()), "rid": st.one_of(raw_labels, st.none()),
    "site": st.one_of(raw_labels, st.none())}), min_size=1, max_size=6))
def test_a_dimension_missing_is_blank_but_a_key_or_event_id_must_be_there_for_our_scanner_too(events):
    """Our scanner writes a missing dimension as "" itself, but not the key's (a dimension here)."""
    body = "\n".join(json.dumps(e, ensure_ascii=False) for e in events).encode()
    columns = scanned(body, True, KEYED_BY_A_DIMENSION)
    whole = all(isinstance(e.get("device"), str) and isinstance(e.get("rid"), str) for e in events)
    assert (columns is not None) == whole
    if columns is not None:
        accepted, rejected = per_event(body, "application/x-ndjson", KEYED_BY_A_DIMENSION)
        assert rejected == []
        assert columns_to_batch(KEYED_BY_A_DIMENSION, columns, INGEST_MS).equals(
            events_to_batch(KEYED_BY_A_DIMENSION, accepted, INGEST_MS))
        assert columns.column("site").to_pylist() == [e.get("site") or "" for e in events]


@pytest.mark.parametrize("text, value", [
    ("0.1", 0.1), ("-0", 0.0), ("-0.0", -0.0), ("1e18", 1e18), ("3e-23", 3e-23),
    ("9007199254740993", 9007199254740992.0),
    ("0.30000000000000004", 0.30000000000000004), ("123456789012345678", 123456789012345678.0),
    ("1.5E+2", 150.0), ("2.5e-3", 0.0025), ("4.9e-324", 5e-324), ("1.123456789012345678901", 1.1234567890123457),
])
def test_our_scanner_reads_a_number_as_pythons_float_does(text, value):
    columns = scanned(f'{{"time": {T0}, "device": "d", "temp": {text}}}'.encode(), True)
    assert columns is not None
    read = columns.column("temp")[0].as_py()
    assert read == value and math.copysign(1, read) == math.copysign(1, value)


@pytest.mark.parametrize("text", [
    '{"time": 1795000000000, "device": "d\\u00e9"}',  # an escape: Arrow's reader decodes it
    '{"time": 1795000000000.0, "device": "d"}',  # a time with a fraction
    '{"time": 1795000000000, "device": "d", "temp": 1' + "0" * 19 + "}",  # an integer of 20 digits
    '{"time": 1795000000000, "device": "d", "device": "e"}',
    '{"time": 1795000000000, "device": "d", "note": "x"}',
    '{}', '[]', '{"time": 1795000000000, "device": "d"}\n{"time": 1795000000000,\n"device": "e"}',
    '{"time": 1795000000000, "device": "d", "temp": 01}', '{"time": 1795000000000, "device": "d", "temp": -01.5}',
    '{"time": 1795000000000, "device": "d"]', '[{"time": 1795000000000, "device": "d"]]',  # malformed
    '{"time": 1795000000000, "device": "a\tb"}',  # raw control characters
    '{"time": 1795000000000, "device": "a\x01b"}',
    '{"time": 1795000000000, "device": "d"} {"time": 1795000000000, "device": "e"}',  # two objects on a line
    '{"time": 1795000000000, "device": "d"}\r{"time": 1795000000000, "device": "e"}',
])
def test_what_our_scanner_leaves_to_the_next_reader(text):
    assert scanned_fields(STREAM, text.encode(), not text.startswith("[")) is None


def lines_walked(body: bytes) -> int | None:
    """object_lines as the per-event reader splits a body: on \\n alone, blank lines skipped."""
    starts = [first for line in body.split(b"\n") if (first := line.lstrip()[:1])]
    return len(starts) if all(first == b"{" for first in starts) else None


@settings(max_examples=600, deadline=None)
@given(pieces=st.lists(st.sampled_from([b"{", b"}", b"\n", b"\n{", b"{}\n", b" ", b"\r", b"\t", b"\x0b", b"\x0c",
                                        b"[", b"x", b"\"\n\"", b"\xc2\xa0"]), max_size=12))
def test_object_lines_counts_as_the_line_walk_does(pieces):
    # Bodies from compact NDJSON (every line its brace: the counted case) to blank lines, CRLF,
    # indented or non-object lines and a newline inside a string (which the reader then refuses).
    body = b"".join(pieces)
    assert object_lines(body) == lines_walked(body)


@pytest.mark.parametrize("body, lines", [
    (b"{}", 1), (b"{}\n", 1), (b"{}\n{}", 2), (b"{}\r\n{}\r\n", 2), (b"{}\n\n{}", 2), (b" {}\n{}", 2),
    (b"{}\n \n", 1), (b"{}\nnull", None), (b"\n", 0), (b"", 0),
])
def test_object_lines_examples(body, lines):
    assert object_lines(body) == lines


@pytest.mark.parametrize("body", [
    b'{"time": 1795000000000, "device": "d", "site": "a\xff"}',  # not UTF-8: the 400 is the per-event path's
    b'{"time": 1795000000000, "device": "d"} {"time": 1795000000000, "device": "e"}',  # two on a line
    b'{"time": 1795000000000, "device": "d", "temp": NaN}',
    b'{"time": 1795000000000, "device": "d", "temp": 1e999}',
    b'{"time": 1795000000000, "device": "d", "temp": 1' + b"0" * 45 + b'}',  # past max_int_digits, read as 1e45
    b'{"time": -9223372036854775808, "device": "d"}',  # abs() of it would wrap into the valid range
    b'{"time": 1795000000000, "device": "d", "note": "undeclared fields stay JSON text"}',
    b'{"time": 1795000000000, "device": null}',
    b'{"time": 1795000000000.5, "device": "d"}',
    b'{"time": 1795000000000, "device": "d", "site": "\\ud800"}',
    b'{"time": 1795000000000, "device": "d", "site": "a\\u0000b"}',  # a NUL: the per-event path refuses it
    b'{"time": 1795000000000, "device": "d\\u0000"}',
    b'{"time": 1795000000000, "device": "d", "site": "a\x00b"}',  # a raw NUL: malformed JSON
    ('{"time": 1795000000000, "device": "%s"}' % ("中" * 700)).encode(),  # 2 100 bytes: over a label's
    b'{"time": 18446744073709551615, "device": "d"}',  # past int64
    # A newline inside a string is malformed JSON (a reader that joined the lines with commas, as
    # msgspec's did until session 99, must not make one line's string swallow the next line's brace).
    b'{"time": 1795000000000, "device": "x\n{"}, {"time": 1795000000000, "device": "y"}',
    # Two lines joined into one event: an array of objects across them.
    b'{"time": 1795000000000, "device": "d", "kind": [{"x": 1}\n{"y": 2}]}',
    b'{"time": 1795000000000, "device": "d"}\n{"time": 1795000000000, "device": "e"\n}',
], ids=lambda b: b[:40].decode("utf-8", "replace"))
@pytest.mark.parametrize("reader", READERS)
def test_what_the_columnar_path_leaves_to_the_per_event_one(body, reader):
    assert columnar_events(STREAM, body, reader=reader) is None


@pytest.mark.parametrize("reader", READERS)
def test_a_name_twice_is_left_to_the_per_event_path(reader):
    """Arrow's reader refuses a name twice in an object, and our scanner leaves it to Arrow's: the
    per-event path's json.loads keeps the last value."""
    body = b'{"time": 1795000000000, "device": "d", "device": "e"}'
    assert assert_same_as_per_event(body, "application/x-ndjson", reader=reader) is None


@pytest.mark.parametrize("columns, plain", [
    ([[1.5, -2.0], [3.0]], True),
    ([[None, None], [None]], True),  # every value null: nothing to refuse
    ([[9.9e18, -9.9e18], []], True),
    ([[1.0, math.nan], [2.0]], False),  # min_max skips a NaN: the sum shows it
    ([[None, math.nan], [None]], False),
    ([[1.0], [math.inf]], False), ([[-math.inf], [1.0]], False),
    ([[1e19], [1.0]], False), ([[1.0], [-1e19]], False),  # at BIG_NUMBER: maybe an integer past max_int_digits
], ids=str)
def test_the_value_columns_checks_run_once_over_every_column(columns, plain):
    """JSON has no NaN or Infinity literal (Arrow's reader fails on them, and on 1e999 it gives
    inf), so the NaN check is for what a reader could give; both are refused whatever column."""
    values = pa.chunked_array([pa.array(c, pa.float64()) for c in columns], pa.float64())
    assert _plain_numbers(values) is plain


@pytest.mark.parametrize("label, taken", [
    ("a" * 1024, True), ("a" * 1025, False),  # a label's characters: at most 1 024
    ("é" * 1024, True), ("é" * 1025, False),  # 2 048 bytes pass, one character more does not
    ("€" * 682, True), ("€" * 683, False),  # 2 046 bytes pass, 2 049 do not (683 characters would)
    ("𝄞" * 512, True), ("𝄞" * 512 + "a", False),  # 2 048 bytes, then one more
    ("a\x00", False), ("\x00" + "é" * 600, False),  # a NUL, on its own and past the byte count
    ("a\\u0000b", True),  # the text of an escape, not a NUL: the body's bytes hold `\\u0000`
], ids=lambda v: v if isinstance(v, bool) else f"{len(v)} chars {len(v.encode())} bytes")
@pytest.mark.parametrize("field", ["site", "device"])
@pytest.mark.parametrize("reader", READERS)
def test_labels_at_the_character_and_byte_limits_are_decided_as_the_per_event_path_does(label, taken, field, reader):
    """The columnar path counts a label's characters only where its bytes could be too many, and
    searches for a NUL only in a body that holds one: each label here is taken, or left to the
    per-event path that refuses it, exactly as that path decides."""
    events = [{"time": T0, "device": "d", "site": "s"}, {"time": T0 + 1, "device": "e", field: label}]
    for body, content_type in ((ndjson(events), "application/x-ndjson"), (json.dumps(events).encode(), "application/json")):
        columns = assert_same_as_per_event(body, content_type, reader=reader)
        assert (columns is not None) == taken
        if not taken:
            assert per_event(body, content_type, STREAM)[1], "the per-event path refuses it"


def test_tighter_json_bounds_than_the_validator_turn_the_columnar_path_off():
    assert limits_allow(JsonLimits())
    assert not limits_allow(JsonLimits(max_string_chars=100))
    assert not limits_allow(JsonLimits(max_int_digits=12))
    body = ndjson([{"time": T0, "device": "d" * 200}])
    assert columnar_body(STREAM, body, "application/x-ndjson", JsonLimits(max_string_chars=100)) is None
    assert columnar_body(STREAM, body, "application/x-ndjson", JsonLimits()) is not None


@pytest.mark.parametrize("reader", READERS)
def test_seconds_become_milliseconds_and_big_integers_round_like_python(reader):
    body = ndjson([{"time": 1_795_000_000, "device": "d", "temp": 2**60 + 1}])
    columns = assert_same_as_per_event(body, "application/x-ndjson", reader=reader)
    assert columns.column("time").to_pylist() == [1_795_000_000_000]
    assert columns.column("temp").to_pylist() == [float(2**60 + 1)]
    assert not math.isnan(columns.column("temp")[0].as_py())


order = st.fixed_dictionaries({"time": st.integers(T0, T0 + 10**7)},
                              optional={"request_id": st.one_of(clean_labels, st.none(), st.integers(0, 9)),
                                        "country": clean_labels, "amount": st.floats(0, 1e4)})


@pytest.mark.parametrize("reader", READERS)
@settings(max_examples=200, deadline=None)
@given(orders=st.lists(order, min_size=1, max_size=8), array=st.booleans())
def test_an_event_id_is_required_on_both_paths(reader, orders, array):
    body, content_type = (json.dumps(orders).encode(), "application/json") if array else \
        (ndjson(orders), "application/x-ndjson")
    columns = assert_same_as_per_event(body, content_type, ORDERS, reader=reader)
    if all(isinstance(o.get("request_id"), str) for o in orders):
        assert columns is not None


def test_a_stream_with_a_sent_time_is_left_to_the_per_event_path():
    catalog = parse_catalog("""
streams:
  taps:
    time_field: time
    key_field: device
    sent_time_field: sent
    partitions: 1
metrics:
  taps: {stream: taps}
""")
    body = ndjson([{"time": T0, "device": "d"}, {"time": T0, "device": "e", "sent": T0 + 5}])
    for reader in READERS:
        assert columnar_events(catalog.streams["taps"], body, reader=reader) is None


def test_a_reader_not_among_the_readers_is_refused():
    with pytest.raises(ValueError, match="reader 'simdjson' is not one of scan, arrow"):
        columnar_events(STREAM, b'{"time": 1795000000000, "device": "d"}', reader="simdjson")

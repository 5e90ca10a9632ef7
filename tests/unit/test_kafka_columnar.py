"""The Kafka source's columnar conversion (ingest/kafka_source.py, issue 28) against the per-record
one it stands in for, without a JVM.

Property: for any batch of Kafka records over the demo catalog — good events, wrong types, missing,
undeclared and null fields, non-JSON, over-limit strings and integers, newlines inside values,
tombstones and tables' records mixed in — `RecordConverter.convert` gives exactly the rows, in
the same order and with the same reasons, as the record-by-record conversion (`columnar=False`).
And a batch of valid events does take the columnar path, or it would be dead weight.
"""

from __future__ import annotations

import json
from unittest import mock

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalog import load_catalog
from ingest import kafka_source
from ingest.json_limits import JsonLimits
from ingest.kafka_source import RECORD_SCHEMA, RecordConverter
from ingest.source_rows import SOURCE_SCHEMA
from tests.conftest import DEMO_CONFIG

T0 = 1_795_000_000_000
PREFIX = "sketchboard."
CATALOG = load_catalog(DEMO_CONFIG)
# One converter of each kind for all examples: their validators (pydantic models) are built once.
COLUMNAR = RecordConverter(CATALOG, PREFIX)
PER_RECORD = RecordConverter(CATALOG, PREFIX, columnar=False)

# Event streams (keyed, keyless, with a sent time), tables, and a topic outside the catalog.
STREAMS = ["http_requests", "orders", "mobile_app", "searches", "http_requests_sessions", "users", "plans"]
OUTSIDE = "elsewhere.orders"

# -- field values: mostly what a producer sends, and what it gets wrong ----------------------------

good_times = st.one_of(st.integers(T0, T0 + 10**7), st.integers(1_795_000_000, 1_795_010_000))  # ms, s
bad_times = st.one_of(st.just("2026-11-23T10:00:00Z"), st.floats(1.7e9, 1.8e9), st.integers(-10**13, 10**5),
                      st.integers(2**62, 2**65), st.booleans(), st.none(), st.just("soon"))
good_labels = st.one_of(st.sampled_from(["DE", "card", "u1", "/api/cart", ""]), st.text(max_size=6))
bad_labels = st.one_of(st.integers(-5, 500), st.booleans(), st.none(), st.just("x" * 1025),  # past 1 024 characters
                       st.lists(st.integers(), max_size=2),
                       st.dictionaries(st.text(max_size=2), st.integers(), max_size=1))
good_numbers = st.one_of(st.floats(-1e6, 1e6), st.integers(-10**6, 10**6), st.integers(2**53, 2**63))
bad_numbers = st.one_of(st.just("12"), st.booleans(), st.sampled_from([float("nan"), float("inf")]),
                        st.integers(10**39, 10**45), st.just(10**400), st.lists(st.floats(), max_size=1))
undeclared = st.one_of(st.integers(), st.text(max_size=4), st.just("y" * 70_000),  # past max_string_chars
                       st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))


def event_strategy(name: str, clean: bool) -> st.SearchStrategy[dict]:
    """Events of a stream. Clean: every required field good, the declared ones good or absent,
    nothing undeclared (whole chunks of them read as columns). Otherwise now and then a wrong
    field, a null, an undeclared one, or a required one missing (the validator's reason names it)."""
    stream = CATALOG.streams[name]
    label = good_labels if clean else st.one_of(*[good_labels] * 6, bad_labels)
    number = good_numbers if clean else st.one_of(*[good_numbers] * 6, bad_numbers, st.none())
    time = good_times if clean else st.one_of(*[good_times] * 8, bad_times)
    required = {stream.time_field: time}
    for field in (stream.key_field, stream.event_id_field):
        if field:
            required[field] = label
    optional: dict[str, st.SearchStrategy] = {f: label for f in stream.string_fields if f not in required}
    optional.update({v: number for v in stream.values})
    if stream.sent_time_field:
        optional[stream.sent_time_field] = time
    if clean:
        return st.fixed_dictionaries(required, optional=optional)
    optional["note"] = undeclared
    full = st.fixed_dictionaries(required, optional=optional)
    partial = st.fixed_dictionaries({}, optional={**required, **optional})
    return st.one_of(*[full] * 4, partial)


CLEAN = {name: event_strategy(name, True) for name in STREAMS}
MESSY = {name: event_strategy(name, False) for name in STREAMS}
CLEAN[OUTSIDE], MESSY[OUTSIDE] = CLEAN["orders"], MESSY["orders"]
# A clean event with one field set to a wrong value (or an undeclared one added): a single defect
# in an otherwise clean chunk is where the columnar path must say "cannot tell".
FIELDS = {name: st.sampled_from(sorted({s.time_field, *s.string_fields, *s.values, "note"}))
          for name, s in ((n, CATALOG.streams[n]) for n in STREAMS)}
FIELDS[OUTSIDE] = FIELDS["orders"]
ANY_BAD = st.one_of(bad_labels, bad_numbers, bad_times, undeclared)
TOPICS = {name: OUTSIDE if name == OUTSIDE else f"{PREFIX}{name}" for name in CLEAN}


def encoded(event: dict, how: str) -> bytes:
    if how == "pretty":  # valid JSON over several lines: one record, never an NDJSON line
        return json.dumps(event, indent=1).encode()
    text = json.dumps(event, ensure_ascii=(how != "utf8"), separators=(",", ":") if how == "compact" else None)
    return {"padded": lambda t: " \t" + t + " \r", "newline_after": lambda t: t + "\n",
            "bom": lambda t: "\ufeff" + t}.get(how, lambda t: t)(text).encode("utf-8")


CLEAN_ENCODINGS = st.sampled_from(["plain", "compact", "utf8", "padded"])
MESSY_ENCODINGS = st.sampled_from(["plain", "compact", "utf8", "pretty", "padded", "newline_after", "bom"])
# Values that are no event, or not one JSON value, or not one line.
ODD_VALUES = st.sampled_from([
    None, b"", b"   ", b"{not json", b"null", b"[1]", b"1", b'{"time": 1795000000000}  {"time": 1}',
    b'{"time": 1795000000000, "user_id": "a\nb"}', b'{"time": 1795000000000, "user_id": "\xff"}',
    b'{"time": 1795000000000, "user_id": "a\x00"}', b'{"time": 1795000000000,\r "user_id": "u"}',
    b'{"time": 1795000000000, "user_id": "u", "user_id": "v"}', b"{" * 40 + b"}" * 40, b"\x0c{}",
    b'{"time": 1795000000000, "customer_id": "c", "amount": 1' + b"0" * 45 + b"}",
    # Two good events in one record (not one JSON value): two NDJSON lines, were it joined as is.
    b'{"time": 1795000000000, "user_id": "u"}\n{"time": 1795000000000, "user_id": "v"}',
    b'{"time": 1795000000000, "customer_id": "c"}\n{"time": 1795000000000, "customer_id": "d"}',
])
DEFECTS = st.sampled_from(["two_lines", "two_on_a_line", "newline_after", "newline_before", "pretty", "bom",
                           "big_integer", "blank"])


def defective(event: dict, other: dict, stream, defect: str) -> bytes | None:
    """A clean event's record made wrong, or odd, in its shape: what NDJSON joining must not hide."""
    text = encoded(event, "plain")
    if defect == "two_lines":  # not one JSON value, yet two good NDJSON lines
        return text + b"\n" + encoded(other, "plain")
    if defect == "two_on_a_line":
        return text + b" " + encoded(other, "plain")
    if defect == "newline_after":  # valid: whitespace around the value
        return text + b"\n"
    if defect == "newline_before":
        return b"\n " + text
    if defect == "big_integer" and stream is not None and stream.values:  # past max_int_digits
        return encoded({**event, stream.values[0]: 10**45}, "plain")
    if defect == "blank":
        return b" \t"
    return encoded(event, defect if defect in ("pretty", "bom") else "plain")


NAMES = st.sampled_from(list(CLEAN))
KEYS = st.one_of(st.none(), st.sampled_from([b"u1", b"k", b"\xff"]))
INGEST_TIMES = st.one_of(st.integers(T0, T0 + 10**6), st.integers(T0, T0 + 10**6), st.none())
PERCENT = st.integers(0, 99)
DIRT = st.sampled_from([0, 0, 3, 10, 30, 100])  # percent of messy records in a batch


@st.composite
def batches(draw) -> list[dict]:
    """1-40 records, of any topics and partitions or of one topic-partition (what a Spark task
    hands mapInArrow); mostly clean in some batches, mostly messy in others."""
    dirt = draw(DIRT)
    one = draw(st.one_of(st.none(), st.tuples(NAMES, st.integers(0, 2))))
    records = []
    for _ in range(draw(st.integers(1, 40))):
        name, partition = one if one else (draw(NAMES), draw(st.integers(0, 2)))
        if draw(PERCENT) >= dirt:
            value = encoded(draw(CLEAN[name]), draw(CLEAN_ENCODINGS))
        elif (odds := draw(PERCENT)) < 15:
            value = draw(ODD_VALUES)
        elif odds < 55:
            value = encoded({**draw(CLEAN[name]), draw(FIELDS[name]): draw(ANY_BAD)}, draw(CLEAN_ENCODINGS))
        elif odds < 80:
            value = defective(draw(CLEAN[name]), draw(CLEAN[name]), CATALOG.streams.get(name), draw(DEFECTS))
        else:
            value = encoded(draw(MESSY[name]), draw(MESSY_ENCODINGS))
        records.append({"topic": TOPICS[name], "partition": partition, "value": value, "key": draw(KEYS),
                        "ingest_time": draw(INGEST_TIMES)})
    return records


# (COLUMNAR_CHUNK, MIN_COLUMNAR_CHUNK): the shipped sizes, and small ones so that a batch of a few
# records spans several chunks and halvings.
CHUNKS = st.sampled_from([(4096, 256), (8, 2), (5, 1), (3, 1), (16, 4), (2, 1)])


def record_batch(records: list[dict]) -> pa.RecordBatch:
    offsets: dict[tuple[str, int], int] = {}
    rows = []
    for r in records:
        at = offsets[r["topic"], r["partition"]] = offsets.get((r["topic"], r["partition"]), 99) + 1
        rows.append({**r, "offset": at})
    return pa.RecordBatch.from_pylist(rows, schema=RECORD_SCHEMA)


def rows_of(converter: RecordConverter, batch: pa.RecordBatch) -> list[dict]:
    out = list(converter.convert(batch))
    assert all(b.schema == SOURCE_SCHEMA for b in out)
    return [row for b in out for row in b.to_pylist()]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(records=batches(), chunks=CHUNKS)
def test_the_columnar_conversion_gives_the_per_record_rows_and_reasons(records, chunks):
    batch = record_batch(records)
    # The converter's memory of streams whose chunks were mostly bad would send later examples'
    # records straight to the validator: each example starts afresh, to try the columnar path.
    COLUMNAR._skip.clear()
    COLUMNAR._misses.clear()
    with mock.patch.multiple(kafka_source, COLUMNAR_CHUNK=chunks[0], MIN_COLUMNAR_CHUNK=chunks[1]):
        got = rows_of(COLUMNAR, batch)
    assert got == rows_of(PER_RECORD, batch)


def valid_records(n: int, topic: str = "http_requests") -> list[dict]:
    return [{"topic": f"{PREFIX}{topic}", "partition": 3, "ingest_time": T0 + i, "key": None,
             "value": json.dumps({"time": T0 + i, "user_id": f"u{i % 7}", "endpoint": "/api/cart", "method": "GET",
                                  "status": str(200 + i % 3), "latency_ms": i / 7, "response_bytes": i}).encode()}
            for i in range(n)]


def counting(monkeypatch) -> list[int]:
    calls = [0]
    per_record = RecordConverter._from_json

    def count(self, validator, value):
        calls[0] += 1
        return per_record(self, validator, value)

    monkeypatch.setattr(RecordConverter, "_from_json", count)
    return calls


def test_a_batch_of_valid_events_takes_the_columnar_path(monkeypatch):
    calls = counting(monkeypatch)
    batch = record_batch(valid_records(10_000))
    rows = rows_of(RecordConverter(CATALOG, PREFIX), batch)
    assert calls[0] == 0  # not one record through the validator
    assert len(rows) == 10_000 and all(r["error"] is None for r in rows)
    assert [r["offset"] for r in rows] == list(range(100, 10_100))
    assert rows == rows_of(PER_RECORD, batch)


def test_one_bad_record_sends_only_a_small_part_of_its_chunk_to_the_validator(monkeypatch):
    calls = counting(monkeypatch)
    records = valid_records(10_000)
    records[5_000]["value"] = b'{"time": 1795000000000, "user_id": "u", "latency_ms": "12"}'
    batch = record_batch(records)
    rows = rows_of(RecordConverter(CATALOG, PREFIX), batch)
    assert calls[0] == kafka_source.MIN_COLUMNAR_CHUNK  # halved down from its chunk of 4 096
    assert rows[-1]["offset"] == 5_100 and rows[-1]["error"] == "latency_ms: must be a number, got a string ('12')"
    calls[0] = 0
    assert rows == rows_of(PER_RECORD, batch)


def test_tables_and_tight_json_bounds_take_the_per_record_path(monkeypatch):
    calls = counting(monkeypatch)
    users = [{"topic": f"{PREFIX}users", "partition": 0, "ingest_time": T0, "key": b"u1",
              "value": json.dumps({"time": T0, "user_id": "u1", "plan": "pro"}).encode()}] * 3
    rows_of(RecordConverter(CATALOG, PREFIX), record_batch(users))
    assert calls[0] == 3  # a table's upsert sets its `op` record by record
    assert not RecordConverter(CATALOG, PREFIX, JsonLimits(max_string_chars=100)).columnar


def test_a_stream_whose_chunks_are_mostly_not_columns_skips_the_parses_for_a_while(monkeypatch):
    parses = [0]
    columnar_events = kafka_source.columnar_events

    def count(stream, body):
        parses[0] += 1
        return columnar_events(stream, body)

    monkeypatch.setattr(kafka_source, "columnar_events", count)
    converter = RecordConverter(CATALOG, PREFIX)
    undeclared = valid_records(4096)
    for r in undeclared:  # valid events, kept with their undeclared field: not for the columnar path
        r["value"] = r["value"][:-1] + b', "note": 1}'
    batch = record_batch(undeclared)
    assert rows_of(converter, batch) == rows_of(PER_RECORD, batch)
    assert parses[0] == 3  # the chunk, then its two halves
    rows_of(converter, batch)
    assert parses[0] == 3  # the next 4 096 records of the stream went straight to the validator
    valid = record_batch(valid_records(4096))
    assert rows_of(converter, valid) == rows_of(PER_RECORD, valid)  # tried again, read as columns
    assert parses[0] == 4

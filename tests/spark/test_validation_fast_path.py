"""Property, with real Spark: the JVM's fast path for Kafka records (ingest/kafka_fast_path.py)
vouches only for records the ingest API accepts, and reads each one to exactly the row the API's
validator gives (event time, labels, numbers: int vs float, missing optional fields, extra
fields, unicode); the records it does not vouch for go to the Python validator, so the union of
both paths accepts and rejects exactly what `POST /api/v1/events` does, with the same reasons.

The events are the no-JVM parity test's (tests/api/test_validation_parity.py), written as
Kafka producers write them: ASCII-escaped or raw UTF-8, compact or indented, sometimes with a
declared key twice or a key in other case, a three-digit exponent or an array of tags."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from ingest.json_limits import JsonLimits
from ingest.kafka_fast_path import split_records
from ingest.kafka_source import RECORD_SCHEMA, RecordConverter, topics_of, validated_rows
from tests.api.test_validation_parity import FIELDS, PREFIX, STREAM, T0, an_event, anything, row_of
from tests.api.test_validation_parity import api_on_a_log  # noqa: F401 - the fixture, one app for all examples

pytestmark = pytest.mark.spark

# Text without control characters, quotes or backslashes (which JSON escapes); any other unicode.
plain_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs"), exclude_characters='"\\'))
# Besides the declared fields: keys in other case (Jackson matches names exactly, as Python does),
# arrays, unicode text and numbers at the edges of what the JVM may read.
EXTRAS = {"TIME": st.integers(T0, T0 + 10**6), "Country": st.text(max_size=4), "tags": st.lists(st.text(max_size=3),
          max_size=3), "nested": st.lists(st.lists(st.integers(), max_size=2), max_size=2),
          "note": st.text(alphabet=st.characters(codec="utf-8"), max_size=6), "label": plain_text,
          "big": st.sampled_from([1e300, 10**17, 10**18, -(10**25), 0.1 + 0.2, -0.0, 1e-7])}
with_extras = st.builds(lambda e, x: {**e, **x}, an_event, st.fixed_dictionaries({}, optional=EXTRAS))
valid_ish = st.fixed_dictionaries(
    {"time": st.integers(T0, T0 + 10**6), "customer_id": st.one_of(st.text(min_size=1, max_size=8), st.integers(-5, 5),
                                                                   st.booleans())},
    optional={**{k: v for k, v in FIELDS.items() if k not in ("time", "customer_id")}, **EXTRAS})

# Events a well-behaved producer sends: most of them should take the fast path.
clean = st.fixed_dictionaries(
    {"time": st.integers(T0, T0 + 10**6), "customer_id": plain_text.filter(bool).map(lambda t: t[:8])},
    optional={"country": plain_text.map(lambda t: t[:6]) | st.integers(0, 999),
              "payment_method": st.sampled_from(["card", "cash"]),
              "amount": st.floats(-1e6, 1e6) | st.integers(-(10**6), 10**6), "items": st.integers(0, 9) | st.none(),
              **EXTRAS})


@st.composite
def record_text(draw, raw) -> bytes:
    """One way a producer may write `raw` as a record's value."""
    text = json.dumps(raw, ensure_ascii=draw(st.booleans()), indent=draw(st.sampled_from([None, None, 1])))
    if isinstance(raw, dict) and raw and text.endswith("}") and draw(st.integers(0, 5)) == 0:
        # A declared key written twice (Python keeps the last one).
        key = draw(st.sampled_from(["time", "customer_id", "amount", "country"]))
        text = text[:-1] + f', "{key}": {json.dumps(draw(FIELDS[key]))}' + "}"
    if draw(st.integers(0, 6)) == 0:
        text = draw(st.sampled_from([" ", "\n", "\t", "\r\n"])) + text + draw(st.sampled_from(["", " ", "\n"]))
    return text.encode("utf-8")


values = st.lists(st.one_of(clean, clean, valid_ish, with_extras, anything).flatmap(record_text), min_size=1,
                  max_size=40)


def records_frame(spark, values: list[bytes]):
    return spark.createDataFrame([(PREFIX + STREAM, 0, i, T0, bytearray(v)) for i, v in enumerate(values)],
                                 "topic string, partition int, offset bigint, ingest_time bigint, value binary")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(values=values)
# Found by a fresh-clone run: a row without `amount` beside one with 0.0 (the oracle's sort failed).
@example(values=[b' {"time": 1794999600000, "customer_id": "0"}',
                 b' {"time": 1794999600000, "customer_id": "0", "amount": 0.0}'])
def test_fast_path_vouches_only_for_what_the_api_accepts_and_reads_it_alike(values, spark, api_on_a_log,
                                                                            demo_catalog):
    frame = records_frame(spark, values)
    fast, _ = split_records(frame, demo_catalog, topics_of(demo_catalog, PREFIX), JsonLimits())
    vouched = {r["offset"]: r for r in (row.asDict() for row in fast.collect())}  # one Spark job per example

    # The reference: the API's validator over every record (Python only).
    batch = pa.RecordBatch.from_pylist([{"topic": PREFIX + STREAM, "partition": 0, "offset": i, "ingest_time": T0,
                                         "value": v} for i, v in enumerate(values)], schema=RECORD_SCHEMA)
    python = sorted((r for b in RecordConverter(demo_catalog, PREFIX).convert(batch) for r in b.to_pylist()),
                    key=lambda r: r["offset"])
    event(f"vouched by the JVM: {'none' if not vouched else 'all' if len(vouched) == len(values) else 'some'}")
    for offset, row in vouched.items():
        reference = python[offset]
        assert reference["error"] is None, (values[offset], reference["error"])
        assert row == reference, values[offset]
    # The others go to Python (`where(not vouched)`): together, every record once, as Python reads it.
    both = python

    # And the API, sent the same texts as one JSON array: the same verdicts, reasons and rows.
    answer, appended = api_on_a_log.post(b"[" + b",".join(values) + b"]")
    assert answer.status_code == 200, answer.text
    assert {r["index"]: r["reason"] for r in answer.json()["rejected"]} == {
        r["offset"]: r["error"] for r in both if r["error"] is not None}
    # Sorted by repr: a row missing a value (None) beside one with 0.0 cannot be compared as tuples.
    api_rows = sorted((row_of(r) for r in appended), key=repr)
    assert api_rows == sorted((row_of(r) for r in both if r["error"] is None), key=repr)


def test_clearly_valid_records_take_the_fast_path_and_edge_cases_do_not(spark, demo_catalog):
    """Which records the JVM vouches for, spelled out: the common shapes do, anything near a
    difference between Jackson and Python's json or near a JSON limit does not."""
    t = T0 + 5
    fast_ones = [
        b'{"time": %d, "customer_id": "c1", "country": "DE", "amount": 12.5, "items": 3}' % t,
        b'{"time": %d, "customer_id": 42, "country": true, "coupon": [1, "x"], "amount": -0}' % t,
        '{"time": 1794999600, "customer_id": "ü€😀", "country": "中国"}'.encode(),  # epoch seconds, raw UTF-8
        b' \n{"time": %d, "customer_id": "c1"}\n' % t,
    ]
    python_ones = [
        b'{"time": %d, "customer_id": "c\\u00fc"}' % t,  # an escape: Python decodes it
        b'{"time": %d.0, "customer_id": "c1"}' % t,  # a float time: Python's rounding
        b'{"time": "2026-11-18T10:00:00Z", "customer_id": "c1"}',
        b'{"time": %d, "customer_id": "c1"} trailing' % t,  # Jackson would stop at the brace
        b'{"time": %d, "customer_id": "c1", "time": 5}' % t,  # a declared key twice
        b'{"time": %d, "customer_id": "c1", "x": 1e400}' % t,  # inf for Python: over a limit
        b'{"time": %d, "customer_id": "c1", "x": 123456789012345678}' % t,  # near max_int_digits
        b'{"time": %d, "customer_id": "c1", "x": {"y": 1}}' % t,  # an object: depth counted in Python
        b'{"time": %d, "customer_id": 1.5}' % t,  # a float label: refused by the API
        b'{"time": %d, "customer_id": "c1", "amount": "12"}' % t,
        b'{"time": %d, "customer_id": "c1", "amount": NaN}' % t,
        b'{"time": %d, "country": "DE"}' % t,  # no key
        b'{"time": -5, "customer_id": "c1"}',
        b"\xff" + b'{"time": %d, "customer_id": "c1"}' % t,
        b'{"time": %d, "customer_id": "' % t + b"x" * 70_000 + b'"}',
        # 700 characters but 2 100 bytes: past a label's bytes (a PostgreSQL index entry's bound)
        ('{"time": %d, "customer_id": "c1", "country": "%s"}' % (t, "中" * 700)).encode(),
        b'{"time": %d, "customer_id": "c1", "amount": 1e300}' % t,  # past the bound no sum overflows: refused
    ]
    frame = records_frame(spark, fast_ones + python_ones)
    fast, slow = split_records(frame, demo_catalog, topics_of(demo_catalog, PREFIX), JsonLimits())
    assert sorted(r["offset"] for r in fast.collect()) == list(range(len(fast_ones)))
    assert sorted(r["offset"] for r in slow.collect()) == list(range(len(fast_ones), len(fast_ones) + len(python_ones)))
    # Both paths together, as the pipeline reads them: every record once, as the API's validator reads it.
    batch = pa.RecordBatch.from_pylist([{"topic": PREFIX + STREAM, "partition": 0, "offset": i, "ingest_time": T0,
                                         "value": v} for i, v in enumerate(fast_ones + python_ones)],
                                       schema=RECORD_SCHEMA)
    python = sorted((r for b in RecordConverter(demo_catalog, PREFIX).convert(batch) for r in b.to_pylist()),
                    key=lambda r: r["offset"])
    both = validated_rows(frame, demo_catalog, PREFIX, JsonLimits(), fast_path=True).collect()
    both = sorted((r.asDict() for r in both), key=lambda r: r["offset"])
    assert both == python
    assert [r["offset"] for r in python if r["error"] is None] == [0, 1, 2, 3, 4, 5, 6, 8, 10, 11]

"""Producers that skip the API: records produced with confluent-kafka straight to a stream's
topic on a real broker, read by the running pipeline (Spark's Kafka source, 1 s trigger).
Valid ones (epoch ms, epoch seconds, RFC 3339 times; no key; extra fields) end in exact panes;
malformed ones (not JSON, a tombstone, no time, wrong types, a JSON array, nesting thousands
deep, a 900 KB value, an integer of 5000 digits, NaN) end as `invalid` dead letters with their
partition, offset and the API's own message for them. The query never fails or stalls, and
read = aggregated + dead-lettered."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest
from confluent_kafka import Producer

from aggregates.pipeline import Pipeline
from ingest.events import EventValidator
from ingest.log.records import json_to_event
from store import SqlitePaneStore
from tests.kafka_broker import client_config
from tests.log_backends import LogBackend
from tests.spark.events import T0, amounts_by_pane_and_country, stored_amounts_by_pane_and_country

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

STREAM = "orders"


def valid_records(n: int, offset: int = 0) -> list[bytes]:
    """JSON events with their time as epoch ms, epoch seconds or RFC 3339 text, and a field the
    stream does not declare."""
    out = []
    for i in range(offset, offset + n):
        t = T0 + i * 37 % 60_000
        when = (t, t / 1000, datetime.fromtimestamp(t / 1000, UTC).isoformat().replace("+00:00", "Z"))[i % 3]
        event = {"time": when, "customer_id": f"c{i % 13}", "country": ["DE", "FR"][i % 2], "payment_method": "card",
                 "amount": float(i % 50), "items": i % 4, "coupon": "none"}
        out.append(json.dumps(event).encode())
    return out


MALFORMED = [
    b"definitely not json",
    None,  # a tombstone
    b'{"customer_id": "c1", "amount": 3.0}',  # no time
    json.dumps({"time": T0, "customer_id": "c1", "amount": "12"}).encode(),  # a string where a number goes
    json.dumps({"time": T0, "customer_id": "c1", "country": {"a": 1}}).encode(),  # an object for a dimension
    json.dumps({"time": True, "customer_id": "c1"}).encode(),
    json.dumps([{"time": T0, "customer_id": "c1"}]).encode(),  # an array, not an event
    b"[" * 50_000 + b"]" * 50_000,
    json.dumps({"time": T0, "customer_id": "c1", "country": "x" * 900_000}).encode(),  # 900 KB
    b'{"time": ' + b"9" * 5000 + b', "customer_id": "c1"}',
    b'{"time": 1794999600000, "customer_id": "c1", "amount": NaN}',
    b'{"time": "yesterday", "customer_id": "c1"}',
]


def produce(bootstrap: str, topic: str, values: list[bytes | None]) -> dict[bytes | None, tuple[int, int]]:
    """Produce without a key (round-robin partitions) and wait for every ack; where each landed."""
    where: dict[int, tuple[int, int]] = {}
    producer = Producer(client_config(bootstrap, **{"message.max.bytes": 2_000_000}))
    for i, value in enumerate(values):
        producer.produce(topic, value, on_delivery=lambda err, msg, i=i: where.__setitem__(
            i, (-1, -1) if err else (msg.partition(), msg.offset())))
    assert producer.flush(30) == 0
    assert len(where) == len(values) and (-1, -1) not in where.values()
    return {i: where[i] for i in range(len(values))}


def expected_reason(validator: EventValidator, value: bytes | None) -> str:
    try:
        json_to_event(validator, value)
    except ValueError as exc:
        return str(exc)
    raise AssertionError(f"{value[:80]!r} is valid")


def test_records_produced_straight_to_the_topic_become_panes_or_invalid_dead_letters(
        tmp_path, demo_catalog, spark, kafka_broker):
    stream = demo_catalog.stream(STREAM)
    test_log = LogBackend("kafka", kafka_broker.bootstrap).new(tmp_path)
    log = test_log.open(demo_catalog)
    topic = log.topic(STREAM)
    validator = EventValidator(stream)
    store = SqlitePaneStore(tmp_path / "store.db")
    pipeline = Pipeline(spark, demo_catalog, store,
                        test_log.pipeline_config(max_records_per_batch=400, trigger_interval="1 second"))
    query = pipeline.start()
    try:
        good = valid_records(600)
        # Two waves while the query runs, malformed records mixed into both.
        first = produce(kafka_broker.bootstrap, topic, good[:300] + MALFORMED[:6])
        second = produce(kafka_broker.bootstrap, topic, MALFORMED[6:] + good[300:])
        total = len(good) + len(MALFORMED)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and query.isActive:
            progress = store.progress("main").streams.get(STREAM)
            if progress is not None and progress.events_read >= total:
                break
            time.sleep(0.5)
        assert query.isActive and query.exception() is None, query.exception()
        # The query is not stuck after the bad records: one more record still reaches a pane.
        produce(kafka_broker.bootstrap, topic, valid_records(1, offset=600))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and store.progress("main").streams[STREAM].events_read < total + 1:
            time.sleep(0.5)
    finally:
        query.stop()

    s = store.progress("main").streams[STREAM]
    assert s.events_read == total + 1 == s.events_aggregated + s.events_dead_lettered
    assert s.dead_lettered_by_reason == {"invalid": len(MALFORMED)}

    # Dead letters: exactly the malformed records, where they are, with the API's message.
    where = {v: first[300 + i] for i, v in enumerate(MALFORMED[:6])}
    where.update({v: second[i] for i, v in enumerate(MALFORMED[6:])})
    letters = {(d.letter.partition, d.letter.offset): d.letter for d in store.dead_letters(limit=100)}
    assert set(letters) == set(where.values())
    for value, place in where.items():
        letter = letters[place]
        assert letter.reason == "invalid" and letter.stream == STREAM
        assert letter.error == expected_reason(validator, value)[:500]
        assert letter.ingest_time_ms is not None  # the broker's append time
    # A JSON object gets the same message as the API's validator gives (the ingest API's reason).
    assert letters[where[MALFORMED[3]]].error == "amount: must be a number, got a string ('12')"

    # Panes: exact counts and sums over the valid records, whatever their time format.
    events = [validator.validate(json.loads(v)) for v in valid_records(601)]
    want, sums = amounts_by_pane_and_country(
        ((e.event_time_ms, e.strings["country"], e.numbers["amount"]) for e in events), stream.pane)
    by_pane, by_sum = stored_amounts_by_pane_and_country(store, STREAM)
    assert by_pane == want
    assert all(by_sum[k] == pytest.approx(v) for k, v in sums.items())
    store.close()
    log.close()

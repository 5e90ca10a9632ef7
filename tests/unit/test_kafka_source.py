"""The pure parts of the pipeline's Kafka source (no JVM, no broker): the options handed to
Spark's Kafka source, the topic -> stream offsets the store records, and the conversion of Kafka
records into source rows, where a record that bypassed the API is validated with the API's
own validator and becomes an `invalid` row with the validator's message."""

from __future__ import annotations


import pyarrow as pa
import pytest

from aggregates.eventtime import INVALID, UNPARSEABLE, dead_letter_reason
from aggregates.spark import kafka_connector_conf
from ingest.events import EventValidator
from ingest.kafka_source import (
    RECORD_SCHEMA,
    KafkaSourceConfig,
    RecordConverter,
    spark_kafka_options,
    stream_offsets,
    topics_of,
)
from ingest.log.records import event_to_json
from ingest.source_rows import SOURCE_SCHEMA

T0 = 1_794_999_600_000


def test_options_subscribe_to_the_catalogs_topics_with_the_batch_limit_and_client_settings(catalog):
    config = KafkaSourceConfig(
        "b1:9092,b2:9092", topic_prefix="sb.",
        kafka_options={"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "enable.auto.commit": False,
                       "check.crcs": True, "bootstrap.servers": "ignored:1"},
        source_options={"minPartitions": 4, "kafka.sasl.jaas.config": "x required;"})
    topics = sorted(topics_of(catalog, "sb."))
    options = spark_kafka_options(config, topics, 50_000)
    assert options["subscribe"] == ",".join(f"sb.{s}" for s in sorted(catalog.streams))
    assert options["kafka.bootstrap.servers"] == "b1:9092,b2:9092"
    assert options["maxOffsetsPerTrigger"] == "50000"
    assert options["startingOffsets"] == "earliest" and options["failOnDataLoss"] == "false"
    assert options["kafka.security.protocol"] == "SASL_SSL" and options["kafka.sasl.mechanism"] == "PLAIN"
    assert options["kafka.check.crcs"] == "true"  # booleans as Java reads them
    assert options["kafka.isolation.level"] == "read_committed"  # CDC transactions: never an aborted record
    assert "kafka.enable.auto.commit" not in options  # the connector refuses it
    assert options["minPartitions"] == "4" and options["kafka.sasl.jaas.config"] == "x required;"


def test_source_options_cannot_override_what_sketchboard_sets():
    with pytest.raises(ValueError, match="'subscribePattern' is set by Sketchboard"):
        spark_kafka_options(KafkaSourceConfig("b:1", source_options={"subscribePattern": ".*"}), ["t"], 1)


def test_offsets_logged_per_topic_are_recorded_per_stream(catalog):
    topics = topics_of(catalog, "sketchboard.")
    logged = {"sketchboard.orders": {0: 5, 1: 7}, "other.topic": {0: 1}}
    assert stream_offsets(logged, topics) == {"orders": {0: 5, 1: 7}}


def test_connector_jars_or_packages_or_a_message_saying_how_to_get_them(tmp_path):
    (tmp_path / "b.jar").write_bytes(b"")
    (tmp_path / "a.jar").write_bytes(b"")
    assert kafka_connector_conf(tmp_path) == {"spark.jars": f"{tmp_path / 'a.jar'},{tmp_path / 'b.jar'}"}
    assert kafka_connector_conf(tmp_path / "none", "g:a:1") == {"spark.jars.packages": "g:a:1"}
    with pytest.raises(FileNotFoundError, match="make jars"):
        kafka_connector_conf(tmp_path / "none")


def records(topic: str, values: list[bytes | None], partition: int = 2, first: int = 100,
            ingest: int = T0 + 5) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"topic": topic, "partition": partition, "offset": first + i, "ingest_time": ingest, "value": v}
         for i, v in enumerate(values)], schema=RECORD_SCHEMA)


def test_valid_records_become_the_same_rows_as_the_embedded_logs_and_invalid_ones_carry_the_apis_reason(catalog):
    stream = catalog.stream("orders")
    validator = EventValidator(stream)
    good = {"time": T0, "customer_id": "c1", "country": "DE", "payment_method": "card", "amount": 12.5, "items": 2}
    bad_type = {**good, "amount": "12"}
    deep = b"[" * 100_000 + b"]" * 100_000
    values = [event_to_json(stream, validator.validate(good)), b"{not json", None,
              __import__("json").dumps(bad_type).encode(), b'{"customer_id": "c1"}', deep, b"1" * 5000]
    out = pa.Table.from_batches(list(RecordConverter(catalog, "sketchboard.").convert(
        records("sketchboard.orders", values))), schema=SOURCE_SCHEMA)
    rows = sorted(out.to_pylist(), key=lambda r: r["offset"])
    assert [r["offset"] for r in rows] == list(range(100, 107))  # every record is a row
    first = rows[0]
    assert (first["stream"], first["partition"], first["event_time"], first["ingest_time"]) == ("orders", 2, T0, T0 + 5)
    assert first["error"] is None and first["error_kind"] is None
    assert first["dims"] == ["DE", "card"] and first["vals"] == [12.5, 2.0] and first["ids"] == ["c1"]
    bad = rows[1:]
    assert all(r["error_kind"] == INVALID and r["partition"] == 2 and r["ingest_time"] == T0 + 5 for r in bad)
    assert bad[0]["error"].startswith("record is not JSON")
    assert bad[1]["error"] == "record has no value (a tombstone), not a JSON event"
    with pytest.raises(ValueError) as api:
        validator.validate(bad_type)
    assert bad[2]["error"] == str(api.value) == "amount: must be a number, got a string ('12')"
    assert bad[3]["error"] == "time: required field is missing"
    assert bad[4]["error"] == "record is not JSON: nested too deeply"
    assert bad[5]["error"].startswith("record is not JSON: Exceeds the limit")


def test_records_of_topics_outside_the_catalog_are_not_rows(catalog):
    assert list(RecordConverter(catalog, "sketchboard.").convert(records("elsewhere.orders", [b"{}"]))) == []


def test_the_source_says_which_dead_letter_reason_a_bad_record_gets():
    rule = {"batch_now_ms": T0, "retention_ms": 10**9, "max_future_skew_ms": 1000}
    assert dead_letter_reason(None, T0, "amount: ...", error_kind=INVALID, **rule) == INVALID
    assert dead_letter_reason(None, None, "undecodable segment", **rule) == UNPARSEABLE
    assert dead_letter_reason(T0, None, None, **rule) == UNPARSEABLE
    assert dead_letter_reason(T0, T0, None, error_kind=None, **rule) is None


def test_a_record_whose_label_is_no_unicode_text_is_dead_lettered_not_a_poison_pill(catalog):
    """A "\\ud800" escape (a lone surrogate) in a label used to raise in the conversion, failing the
    whole batch at every replay; a NUL is refused as at the API. Both now dead-letter the record."""
    values = [b'{"time": %d, "customer_id": "c\\ud800", "country": "DE"}' % T0,
              b'{"time": %d, "customer_id": "c1", "country": "D\\u0000E"}' % T0,
              b'{"time": %d, "customer_id": "c2", "country": "DE"}' % T0]
    out = pa.Table.from_batches(list(RecordConverter(catalog, "sketchboard.").convert(
        records("sketchboard.orders", values))), schema=SOURCE_SCHEMA)
    rows = sorted(out.to_pylist(), key=lambda r: r["offset"])
    assert rows[0]["error"].startswith("customer_id: contains a lone surrogate")
    assert rows[1]["error"].startswith("country: contains a NUL character")
    assert rows[2]["error"] is None and rows[2]["ids"] == ["c2"]

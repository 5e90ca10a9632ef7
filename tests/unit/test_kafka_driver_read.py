"""Kafka read by the pipeline's own consumer (ingest/kafka_source.py `read_kafka_rows`), against the
real broker: a batch of the pipeline's own on a local master reads its range with no Spark job and
gets the rows Spark's Kafka source would give (the same RecordConverter over the same records, in
stream, partition and offset order); committed records only (read_committed, as Spark's source
reads: an aborted transaction's records never, an open one's not yet, and the log's end stops
before it); records the topic's retention deleted skipped with a warning, or failing the read with
kafka_fail_on_data_loss on, as Spark's failOnDataLoss does."""

from __future__ import annotations

import json
import logging
import time
import uuid
from pathlib import Path

import pytest

from catalog import Catalog, StreamDef
from ingest.kafka_source import KafkaDataLost, KafkaSourceConfig, read_kafka_rows
from ingest.source_rows import SOURCE_SCHEMA
from tests.kafka_broker import client_config
from tests.log_backends import TestLog
from tests.unit.test_log import T0

pytestmark = [pytest.mark.kafka]

CLICKS = StreamDef(name="clicks", key_field="user", dimensions=("page",), values=("ms",), partitions=2)
VIEWS = StreamDef(name="views", key_field="user", dimensions=("page",), partitions=1)
CATALOG = Catalog(streams={"clicks": CLICKS, "views": VIEWS})


@pytest.fixture
def prefix() -> str:
    return f"test-{uuid.uuid4().hex[:10]}."


@pytest.fixture
def logs(kafka_broker, prefix):
    """A log as the pipeline and the API open it (read_committed: the default) and one that sees
    what is written (read_uncommitted), their topics made."""
    from ingest.log.kafka import KafkaEventLog

    pipeline = KafkaEventLog(kafka_broker.bootstrap, topic_prefix=prefix, replication_factor=1)
    api = KafkaEventLog(kafka_broker.bootstrap, topic_prefix=prefix, replication_factor=1, read_committed=False)
    for stream in CATALOG.streams.values():
        pipeline.ensure_topic(stream)
    yield pipeline, api
    pipeline.close()
    api.close()


def event(i: int) -> bytes:
    return json.dumps({"time": T0 + i, "user": f"u{i % 3}", "page": f"/p{i % 2}", "ms": float(i)}).encode()


def produce(bootstrap: str, topic: str, partition: int, values: list[bytes], **options) -> None:
    from confluent_kafka import Producer

    producer = Producer(client_config(bootstrap, **options))
    for value in values:
        producer.produce(topic, value, b"u1", partition=partition)
    assert producer.flush(30) == 0


def ends(log, stream: str) -> dict[int, int]:
    return {p: o.end for p, o in log.offsets(stream).items()}


def oracle(log, prefix: str, start: dict, end: dict) -> list[dict]:
    """What Spark's source gives: every raw record of the range, fetched a partition at a time,
    through the one RecordConverter (the Spark tests' oracle, tests/log_backends.py)."""
    test_log = TestLog("kafka", Path("."), log.bootstrap_servers, prefix)
    return [r for stream in sorted(end) for partition in sorted(end[stream])
            for b in test_log.source_rows(log, CATALOG, CATALOG.stream(stream), partition,
                                          start.get(stream, {}).get(partition, 0), end[stream][partition])
            for r in b.select(SOURCE_SCHEMA.names).to_pylist()]


def test_a_range_reads_as_sparks_source_rows_in_stream_partition_and_offset_order(logs, kafka_broker, prefix,
                                                                                   monkeypatch):
    monkeypatch.setattr("ingest.log.kafka._READ_CHUNK", 2)  # the partitions' chunks interleave as they are fetched
    pipeline, _ = logs
    produce(kafka_broker.bootstrap, f"{prefix}clicks", 1, [event(i) for i in range(5)] + [b"not json"])
    produce(kafka_broker.bootstrap, f"{prefix}clicks", 0, [event(i) for i in range(5, 9)])
    produce(kafka_broker.bootstrap, f"{prefix}views", 0, [event(i) for i in range(9, 12)])
    end = {"clicks": ends(pipeline, "clicks"), "views": ends(pipeline, "views")}
    start = {"clicks": {0: 1, 1: 0}, "views": {0: 0}}
    table = read_kafka_rows(pipeline, CATALOG, KafkaSourceConfig(kafka_broker.bootstrap, prefix), start, end)
    assert table.schema == SOURCE_SCHEMA
    rows = table.to_pylist()
    assert rows == oracle(pipeline, prefix, start, end)
    assert [(r["stream"], r["partition"], r["offset"]) for r in rows if r["error"] is None] == (
        [("clicks", 0, o) for o in range(1, 4)] + [("clicks", 1, o) for o in range(5)] + [("views", 0, o) for o in range(3)])
    assert [(r["partition"], r["offset"]) for r in rows if r["error"] is not None] == [(1, 5)]  # dead-lettered, not lost


def test_only_committed_records_are_read_and_the_end_stops_before_an_open_transaction(logs, kafka_broker, prefix):
    from confluent_kafka import Producer

    pipeline, api = logs
    topic = f"{prefix}views"
    produce(kafka_broker.bootstrap, topic, 0, [event(0)])

    def transactional(values: list[bytes]) -> Producer:
        producer = Producer(client_config(kafka_broker.bootstrap, **{"transactional.id": f"t-{uuid.uuid4().hex}"}))
        producer.init_transactions(30)
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value, b"u1", partition=0)
        producer.flush(30)
        return producer

    transactional([event(1), event(2)]).commit_transaction(30)
    transactional([event(3), event(4)]).abort_transaction(30)
    produce(kafka_broker.bootstrap, topic, 0, [event(5)])
    open_one = transactional([event(6)])  # not committed yet
    try:
        committed_end, written_end = ends(pipeline, "views")[0], ends(api, "views")[0]
        assert committed_end < written_end  # the pipeline plans no batch past the last stable offset
        assert pipeline.offsets_of(["views"])["views"][0].end == committed_end  # asked at once, the same
        assert api.offsets_of(["views"])["views"][0].end == written_end
        table = read_kafka_rows(pipeline, CATALOG, KafkaSourceConfig(kafka_broker.bootstrap, prefix), {},
                                {"views": {0: committed_end}})
        assert [r["event_time"] - T0 for r in table.to_pylist()] == [0, 1, 2, 5]  # never the aborted 3 and 4
        open_one.commit_transaction(30)
        # The partition's leader writes the commit marker after the coordinator answers: the last
        # stable offset moves a moment later (a fresh clone's run asked before it had: no record).
        deadline = time.monotonic() + 30
        while ends(pipeline, "views")[0] <= committed_end + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        table = read_kafka_rows(pipeline, CATALOG, KafkaSourceConfig(kafka_broker.bootstrap, prefix),
                                {"views": {0: committed_end}}, {"views": ends(pipeline, "views")})
        assert [r["event_time"] - T0 for r in table.to_pylist()] == [6]
    finally:
        open_one.flush(1)


def test_records_deleted_by_retention_are_skipped_with_a_warning_or_fail_the_read(logs, kafka_broker, prefix, caplog):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    pipeline, _ = logs
    produce(kafka_broker.bootstrap, f"{prefix}views", 0, [event(i) for i in range(6)])
    admin = AdminClient(client_config(kafka_broker.bootstrap))
    deleted = admin.delete_records([TopicPartition(f"{prefix}views", 0, 4)])  # what retention does: the start moves
    for future in deleted.values():
        future.result(30)
    end = {"views": ends(pipeline, "views")}
    assert pipeline.offsets_of(["views"])["views"][0].start == 4 == pipeline.offsets("views")[0].start
    with caplog.at_level(logging.WARNING, logger="sketchboard.pipeline"):
        table = read_kafka_rows(pipeline, CATALOG, KafkaSourceConfig(kafka_broker.bootstrap, prefix), {}, end)
    assert [r["offset"] for r in table.to_pylist()] == [4, 5]
    assert "records 0..3 of stream 'views' partition 0 were deleted by the Kafka topic's retention" in caplog.text
    with pytest.raises(KafkaDataLost, match=r"records 1..3 .*\(kafka_fail_on_data_loss is on"):
        read_kafka_rows(pipeline, CATALOG, KafkaSourceConfig(kafka_broker.bootstrap, prefix, fail_on_data_loss=True),
                        {"views": {0: 1}}, end)


def test_a_topic_grown_outside_is_read_within_the_refresh(logs, kafka_broker, prefix, monkeypatch):
    from confluent_kafka.admin import AdminClient, NewPartitions

    pipeline, _ = logs
    assert set(pipeline.offsets_of(["views"])["views"]) == {0}
    admin = AdminClient(client_config(kafka_broker.bootstrap))
    for future in admin.create_partitions([NewPartitions(f"{prefix}views", 2)]).values():
        future.result(30)
    monkeypatch.setattr("ingest.log.kafka.PARTITIONS_REFRESH_S", 0.0)  # the count asked again at once
    deadline = time.monotonic() + 30
    while set(pipeline.offsets_of(["views"])["views"]) != {0, 1}:  # the broker's metadata catches up
        assert time.monotonic() < deadline
        time.sleep(0.2)

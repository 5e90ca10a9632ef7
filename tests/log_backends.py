"""The two logs a pipeline test runs on, behind one small interface, so each Spark integration
test is written once and parametrized over both (the `log_backend` fixture in tests/conftest.py):

- embedded: the SQLite log file under the test's folder, read by the embedded source;
- kafka: topics on the session's real Kafka broker under a prefix of the test's own, read by
  Spark's own Kafka source.

A `TestLog` opens the log, builds the PipelineConfig and the environment of a `sketchboard
pipeline` process for it, reads the source rows of an offset range (for oracles) and writes
records that bypass the API (a corrupt segment on the embedded log; malformed JSON produced
straight to the topic on Kafka)."""

from __future__ import annotations

import pytest

import shutil
import sqlite3
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa

from aggregates.pipeline import PipelineConfig
from catalog import Catalog, StreamDef
from ingest.log import EventLog, SqliteEventLog
from ingest.log.records import encode_segment, segment_schema
from ingest.source_rows import INVALID, UNPARSEABLE

SPARK_KAFKA_JARS = Path(__file__).resolve().parents[1] / "jars" / "spark-kafka"


@dataclass(frozen=True)
class TestLog:
    __test__ = False  # not a test class, whatever its name

    backend: str
    root: Path  # the test's data folder (log file, store, checkpoints)
    bootstrap: str | None = None
    prefix: str | None = None

    @property
    def kafka(self) -> bool:
        return self.backend == "kafka"

    @property
    def bad_reason(self) -> str:
        """The dead-letter reason of the records `write_bad_records` writes."""
        return INVALID if self.kafka else UNPARSEABLE

    def open(self, catalog: Catalog) -> EventLog:
        if self.kafka:
            from ingest.log.kafka import KafkaEventLog

            log: EventLog = KafkaEventLog(self.bootstrap, topic_prefix=self.prefix, replication_factor=1)
        else:
            log = SqliteEventLog(self.root / "log.db")
        for stream in catalog.streams.values():
            log.ensure_topic(stream)
        return log

    def pipeline_config(self, name: str = "main", **kwargs) -> PipelineConfig:
        config = PipelineConfig(name=name, log_path=self.root / "log.db",
                                checkpoint_dir=self.root / "checkpoints" / name, **kwargs)
        if self.kafka:
            from ingest.kafka_source import KafkaSourceConfig

            config = replace(config, kafka=KafkaSourceConfig(self.bootstrap, topic_prefix=self.prefix))
        return config

    def settings(self) -> dict[str, object]:
        """The settings of a `sketchboard` process on this log."""
        if not self.kafka:
            return {"log_backend": "embedded"}
        return {"log_backend": "kafka", "kafka_bootstrap_servers": self.bootstrap, "kafka_topic_prefix": self.prefix,
                "kafka_replication_factor": 1}

    def env(self) -> dict[str, str]:
        """The same as SKETCHBOARD_* environment variables."""
        return {f"SKETCHBOARD_{k.upper()}": str(v) for k, v in self.settings().items()}

    def same_log_in(self, root: Path) -> TestLog:
        """The same records under another data folder (a fresh pipeline over the same log)."""
        root.mkdir(parents=True, exist_ok=True)
        if not self.kafka:
            shutil.copy(self.root / "log.db", root / "log.db")
        return replace(self, root=root)

    def end_offsets(self, catalog: Catalog, checkpoint_dir: Path, batch_id: int) -> dict[str, dict[int, int]]:
        from aggregates.pipeline import batch_end_offsets

        return batch_end_offsets(self.pipeline_config(), catalog, checkpoint_dir, batch_id)

    def source_rows(self, log: EventLog, catalog: Catalog, stream: StreamDef, partition: int, start: int,
                    end: int) -> Iterator[pa.RecordBatch]:
        """The rows the pipeline's source gives for [start, end) of one partition."""
        if not self.kafka:
            from ingest.spark_source import read_slice

            yield from read_slice(log, stream, partition, start, end)
            return
        from ingest.kafka_source import RecordConverter

        records, pos = [], start  # raw records, invalid ones too, past any gap
        while pos is not None and pos < end:
            got, pos = log._fetch(log.topic(stream.name), partition, pos, end)
            records += got
        batch = pa.RecordBatch.from_pylist(
            [{"topic": log.topic(stream.name), "partition": partition, "offset": m.offset(),
              "ingest_time": m.timestamp()[1], "value": m.value()} for m in records],
            schema=_record_schema())
        yield from RecordConverter(catalog, self.prefix).convert(batch)

    def write_bad_records(self, log: EventLog, stream: StreamDef, ingest_ms: int) -> set[tuple[int, int]]:
        """Records in partition 0 that bypassed the API; returns their (partition, offset)s."""
        return _produce_malformed(self, stream) if self.kafka else _inject_bad_segments(self.root / "log.db",
                                                                                      stream, ingest_ms)


def _record_schema():
    from ingest.kafka_source import RECORD_SCHEMA

    return RECORD_SCHEMA


class LogBackend:
    def __init__(self, name: str, bootstrap: str | None = None):
        self.name = name
        self.bootstrap = bootstrap

    def new(self, root: Path) -> TestLog:
        root.mkdir(parents=True, exist_ok=True)
        prefix = f"t{uuid.uuid4().hex[:10]}." if self.name == "kafka" else None
        return TestLog(self.name, root, self.bootstrap, prefix)


def make_backend(request) -> LogBackend:
    if request.param != "kafka":
        return LogBackend("embedded")
    if not (SPARK_KAFKA_JARS / ".resolved").exists():  # as the broker's jars: missing is a failure, not a skip
        raise RuntimeError("Spark's Kafka connector is not in jars/spark-kafka: run `make jars`")
    broker = request.getfixturevalue("kafka_broker_session")
    if not broker.running:
        broker.start()
    return LogBackend("kafka", broker.bootstrap)


# Records a direct producer may send that are not events: not JSON, no event time, a value of
# the wrong type, and a huge one (a 300 KB string where a dimension goes).
MALFORMED = [
    b"not json at all {",
    b'{"endpoint": "/", "user_id": "u1", "latency_ms": 1.0}',
    b'{"time": 1794999600000, "endpoint": "/", "user_id": "u1", "latency_ms": "12"}',
    b'{"time": 1794999600000, "user_id": "u1", "endpoint": "' + b"x" * 300_000 + b'"}',
]


def _produce_malformed(log: TestLog, stream: StreamDef) -> set[tuple[int, int]]:
    from confluent_kafka import Producer

    from tests.kafka_broker import client_config

    where: list[tuple[int, int]] = []
    producer = Producer(client_config(log.bootstrap, **{"enable.idempotence": True}))
    for value in MALFORMED:
        producer.produce(f"{log.prefix}{stream.name}", value, b"u1", partition=0,
                         on_delivery=lambda err, msg: where.append((msg.partition(), msg.offset())) if err is None
                         else where.append((-1, -1)))
    assert producer.flush(30) == 0
    assert len(where) == len(MALFORMED) and (-1, -1) not in where
    return set(where)


def _inject_bad_segments(path: Path, stream: StreamDef, ingest_ms: int) -> set[tuple[int, int]]:
    """Bypassing the API: a segment of garbage bytes claiming 3 records, then a well-formed
    segment whose one record has a null event time. Returns their (partition, offset)s."""
    schema = pa.schema([pa.field(f.name, f.type) for f in segment_schema(stream)])  # nullable event time
    record = pa.RecordBatch.from_pylist(
        [{"__event_time": None, "__ingest_time": ingest_ms, "endpoint": "/", "latency_ms": 1.0}], schema=schema)
    nulled = encode_segment(record)
    with sqlite3.connect(path) as conn:
        (base,) = conn.execute("SELECT next_offset FROM partitions WHERE stream = ? AND partition = 0",
                               (stream.name,)).fetchone()
        conn.execute("INSERT INTO segments VALUES (?, 0, ?, 3, ?, 11, ?)", (stream.name, base, ingest_ms, b"not arrow!!"))
        conn.execute("INSERT INTO segments VALUES (?, 0, ?, 1, ?, ?, ?)",
                     (stream.name, base + 3, ingest_ms, len(nulled), nulled))
        conn.execute("UPDATE partitions SET next_offset = ? WHERE stream = ? AND partition = 0", (base + 4, stream.name))
    return {(0, base + k) for k in range(4)}


__all__ = ["MALFORMED", "LogBackend", "ON_BOTH_LOGS", "TestLog", "make_backend"]


# The two deployments the Spark tests run on: embedded (the log file, SQLite) and scale-out
# (Kafka, PostgreSQL). Not every pairing: each backend's own contract suite covers it alone;
# these cover the stacks. Module-scoped: a module's drained reference is shared by its tests.
ON_BOTH_STACKS = pytest.mark.parametrize(("log_backend", "store_backend"), [
    ("embedded", "sqlite"),
    pytest.param("kafka", "postgres", marks=[pytest.mark.kafka, pytest.mark.postgres]),
], indirect=True, scope="module", ids=["embedded", "scale-out"])

# Both logs on the SQLite store, for a feature whose Spark part differs by log (a reprocessing
# run's batches with chosen end offsets: the embedded source's caps, Kafka's batch reads).
ON_BOTH_LOGS = pytest.mark.parametrize(("log_backend", "store_backend"), [
    ("embedded", "sqlite"),
    pytest.param("kafka", "sqlite", marks=[pytest.mark.kafka]),
], indirect=True, scope="module", ids=["embedded", "kafka"])

# The embedded stack alone, for a feature that meets the log and the store only through the
# batch's DataFrame and its BatchCommit (patterns, views, enrichment): the Kafka source and the
# PostgreSQL store are covered by the log's and the store's own contract suites (the feature's
# store part runs on both stores there), so a second Spark run on the scale-out stack would cost
# a minute or two of the suite and test nothing new.
ON_THE_EMBEDDED_STACK = pytest.mark.parametrize(("log_backend", "store_backend"), [("embedded", "sqlite")],
                                                indirect=True, scope="module", ids=["embedded"])


def partition_weights(path: Path) -> dict[tuple[str, int], tuple[int | None, int]]:
    """Per partition of an embedded log file: (the weight the log keeps, the bytes its segments hold)
    (ingest/log/sqlite.py BYTES_COLUMN)."""
    with sqlite3.connect(path) as conn:
        return {(stream, p): (kept, summed) for stream, p, kept, summed in conn.execute(
            "SELECT p.stream, p.partition, p.bytes, (SELECT COALESCE(SUM(s.bytes), 0) FROM segments s"
            " WHERE s.stream = p.stream AND s.partition = p.partition) FROM partitions p")}

"""Kafka log backend: one topic per stream, records are JSON events, with confluent-kafka.

Why Kafka: it is the partitioned, durable, replayable log the scale-out deployment needs
(Spark executors on other hosts read it; producers may bypass the API). Why JSON records: a
service producing straight to the topic sends exactly what `POST /api/v1/events` takes, so
both kinds of record read alike (value = one JSON event, key = the stream's key field).

- Topics: `<prefix><stream>` (default prefix `sketchboard.`), created when missing with the
  stream's partition count, the configured replication factor (default: the broker's) and
  `message.timestamp.type=LogAppendTime`, so a record's timestamp is the broker's ingest time
  whatever a producer sets. An existing topic must have exactly the configured partition count
  (Kafka topics are not repartitioned behind the operator's back); an event stream's
  `CreateTime` topic is accepted with a warning (lag in seconds then trusts the producers'
  clocks), a table's is refused (TopicMismatch: its current rows rest on append times that
  never go back within a partition).
- Append: an idempotent producer with acks=all; the partition is chosen by
  `ingest.partitioner` exactly as on the embedded log; `append` returns once the broker
  acknowledged every record and raises `LogUnavailable` when any was not (see
  `EventLog.append`: not atomic across partitions). Every record is encoded and measured
  first: an event whose record (value and key) is over the producer's `message.max.bytes`
  (kafka_options; librdkafka's default 1 000 000 bytes) refuses the whole append with
  `RecordTooLarge` before anything is produced. The brokers' and the topics'
  `message.max.bytes` must be at least that plus a batch's headers (Kafka's default 1 048 588
  is); a broker that still refuses a record as too large fails the append with
  `RecordTooLarge` too (not retryable; the records acknowledged before it stay written).
- Offsets, reads and ingest times come from the broker (watermarks, a consumer assigned to
  the partition, record timestamps). Retention is the topic's own (`retention.ms`).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import pyarrow as pa
from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from catalog import StreamDef
from catalog.tables import tombstone_retention_ms
from ingest.events import Event, EventValidator
from ingest.json_limits import JsonLimits
from ingest.log.base import (
    AppendResult, EventLog, LogUnavailable, PartitionOffsets, PositionConflict, RecordTooLarge, TopicMismatch,
)
from ingest.log.kafka_positions import SourcePositions
from ingest.log.records import event_to_json, events_to_batch, json_to_event, project, with_offsets
from ingest.partitioner import assign_partitions
from ingest.tables import is_table, record_event, record_value

log = logging.getLogger(__name__)

TIMESTAMP_TYPE = "message.timestamp.type"
LOG_APPEND_TIME = "LogAppendTime"
# Options the backend sets itself: the guarantees `append` gives rest on them.
_PRODUCER_FIXED = {"enable.idempotence": True, "acks": "all"}
MESSAGE_MAX_BYTES = "message.max.bytes"
# librdkafka's default; the broker's own, 1 048 588, leaves room for a record batch's headers.
DEFAULT_MESSAGE_MAX_BYTES = 1_000_000
_READ_CHUNK = 10_000  # records fetched, and per Arrow batch yielded, at a time by a read
PARTITIONS_REFRESH_S = 10.0  # how long offsets_of trusts a topic's partition count
# A Kafka record as Spark's Kafka source gives its rows (the columns the conversion reads; the
# timestamp as epoch ms): what `KafkaEventLog.records` yields and ingest/kafka_source.py converts.
RECORD_SCHEMA = pa.schema([
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("ingest_time", pa.int64()),
    pa.field("value", pa.binary()),
    pa.field("key", pa.binary()),  # a table's tombstone is a key with a null value
])


def topic_name(prefix: str, stream: str) -> str:
    return f"{prefix}{stream}"


CLEANUP_POLICY = "cleanup.policy"


def topic_config(stream: StreamDef) -> dict[str, str]:
    """The configuration of a new topic: broker append times; a table's topic is compacted (the
    newest record per key kept, tombstones removed after the table's tombstone_retention)."""
    config = {TIMESTAMP_TYPE: LOG_APPEND_TIME}
    if is_table(stream):
        config[CLEANUP_POLICY] = "compact"
        config["delete.retention.ms"] = str(tombstone_retention_ms(stream))
    return config


def check_topic(topic: str, stream: StreamDef, partitions: int, timestamp_type: str | None) -> list[str]:
    """Judge an existing topic against its stream: raise TopicMismatch for a partition count
    other than the configured one, or a table's topic that is not LogAppendTime; return warnings
    (an event stream's CreateTime topic). Pure."""
    if partitions < stream.partitions:
        raise TopicMismatch(
            f"Kafka topic {topic!r} has {partitions} partitions, fewer than the {stream.partitions} configured for"
            f" stream {stream.name!r}: add partitions to the topic (kafka-topics.sh --alter --topic {topic}"
            f" --partitions {stream.partitions}) or configure `partitions: {partitions}`; Sketchboard does not"
            " repartition an existing topic")
    if partitions > stream.partitions:
        raise TopicMismatch(
            f"Kafka topic {topic!r} has {partitions} partitions, more than the {stream.partitions} configured for"
            f" stream {stream.name!r}: configure `partitions: {partitions}` (a stream's partition count can grow"
            " but not shrink)")
    if timestamp_type is not None and timestamp_type != LOG_APPEND_TIME and is_table(stream):
        # A table's current row of a key is its newest by append time, then offset (docs/tables.md):
        # with producers' timestamps append times can go back within a partition, and that row is
        # then not the one the broker's compaction keeps (the newest by offset), nor the versions
        # an enrichment looks up by append time the ones the log holds in that order.
        raise TopicMismatch(
            f"Kafka topic {topic!r} of table {stream.name!r} has {TIMESTAMP_TYPE}={timestamp_type}: a table's"
            f" append times must never go back within a partition, so its topic must be {LOG_APPEND_TIME}"
            f" (kafka-configs.sh --bootstrap-server <broker> --alter --entity-type topics --entity-name {topic}"
            f" --add-config {TIMESTAMP_TYPE}={LOG_APPEND_TIME})")
    if timestamp_type is not None and timestamp_type != LOG_APPEND_TIME:
        return [f"Kafka topic {topic!r} has {TIMESTAMP_TYPE}={timestamp_type}, not {LOG_APPEND_TIME}: record"
                " timestamps are what producers set, so lag in seconds trusts the producers' clocks"]
    return []


class _Delivery:
    """Delivery reports of one append: where each record landed, or why it did not."""

    def __init__(self, expected: int):
        self.expected = expected
        self.reported = 0
        self.offsets: dict[int, list[int]] = {}
        self.errors: list[str] = []
        self.too_large: list[int] = []  # the appended events whose records a broker refused as too large
        self._lock = threading.Lock()
        self.done = threading.Event()

    def __call__(self, err, msg, index: int | None = None) -> None:  # confluent-kafka's on_delivery(err, msg)
        with self._lock:
            if err is not None:
                self.errors.append(str(err))
                if index is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                    self.too_large.append(index)
            else:
                self.offsets.setdefault(msg.partition(), []).append(msg.offset())
            self.reported += 1
            if self.reported == self.expected:
                self.done.set()

    def ranges(self) -> dict[int, tuple[int | None, int]]:
        # First offset and count per partition. Records of concurrent appends (other API
        # threads or replicas) may interleave, so the count is ours, the range may hold others'.
        # An idempotent producer's retried request that the broker had already written comes
        # back as a duplicate: persisted, but without its offset (confluent-kafka gives None).
        # Then the first offset is unknown (None), never a guess; the count still holds.
        return {p: (None if None in offs else min(offs), len(offs)) for p, offs in sorted(self.offsets.items())}

    def stable_targets(self) -> dict[int, int]:
        """Per partition, the offset past the newest record whose offset is known: what a
        reader of committed records must see before the append counts as readable."""
        known = {p: [o for o in offs if o is not None] for p, offs in self.offsets.items()}
        return {p: max(offs) + 1 for p, offs in sorted(known.items()) if offs}


class KafkaEventLog(EventLog):
    def __init__(
        self,
        bootstrap_servers: str,
        *,
        topic_prefix: str = "sketchboard.",
        replication_factor: int | None = None,
        options: Mapping[str, object] | None = None,
        produce_timeout_ms: int = 10_000,
        request_timeout_s: float = 10.0,
        read_committed: bool = True,
        json_limits: JsonLimits | None = None,
    ):
        """`read_committed` (librdkafka's default, and what Spark's source reads): the log's offsets
        and reads see only committed records (ends are the partitions' last stable offsets, an
        aborted transaction's records are never read); False sees what is written (tests).
        `json_limits`: the bounds on an event's JSON (the settings' max_json_*, default
        JsonLimits()) that `read` applies to a direct producer's records, as the ingest API and
        the pipeline's Kafka source do: a record past them is no event (left out, a gap)."""
        self.bootstrap_servers = bootstrap_servers
        self.read_committed = read_committed
        self.json_limits = json_limits if json_limits is not None else JsonLimits()
        self.topic_prefix = topic_prefix
        # None: the broker's default.replication.factor (-1 asks for it, KIP-464).
        self.replication_factor = replication_factor
        self.timeout_s = request_timeout_s
        # Since when the consumer's metadata has said "unknown partition" (`_watermarks`): across
        # calls, each of which gives up after timeout_s, which may be shorter than _STALE_REFRESH_S.
        self._stale_since: float | None = None
        self.produce_timeout_ms = produce_timeout_ms
        # Security protocol, SASL, TLS files, any librdkafka option: passed to every client.
        common = {
            # librdkafka's own log lines (a broker disconnecting, retries) go to Python logging,
            # not straight to stderr.
            "logger": logging.getLogger("ingest.log.kafka.librdkafka"),
            # librdkafka backs off reconnecting up to 10 s by default: after a broker restart the
            # API would stay unavailable that much longer than the broker. 1 s is cheap on a cluster.
            "reconnect.backoff.max.ms": 1000,
            **(options or {}),
            "bootstrap.servers": bootstrap_servers,
        }
        self._common = common
        self._source_positions: SourcePositions | None = None  # made on the first CDC append
        try:  # the largest record (value and key) the producer takes: every append is checked against it
            self.max_record_bytes = int(common.get(MESSAGE_MAX_BYTES, DEFAULT_MESSAGE_MAX_BYTES))
        except (TypeError, ValueError):
            raise ValueError(f"kafka_options: {MESSAGE_MAX_BYTES} must be a whole number of bytes,"
                             f" not {common[MESSAGE_MAX_BYTES]!r}") from None
        try:
            self._make_clients(common)
        except KafkaException as exc:  # an unknown option or a bad value in the passthrough
            raise ValueError(f"kafka_options: {exc.args[0].str()}") from None
        self._read_lock = threading.Lock()  # one consumer, one assignment at a time
        self._retired: list[Consumer] = []  # consumers replaced for a stale cache (`_watermarks`), closed with the log
        self._closed = False
        self._partitions: dict[str, int] = {}  # stream -> partitions of its topic, as checked
        self._partition_counts: dict[str, tuple[int, float]] = {}  # offsets_of's: (partitions, when asked)
        self._validators: dict[str, EventValidator] = {}
        self._ingest_times: OrderedDict[tuple[str, int, int], int] = OrderedDict()
        self._round_robin = 0
        self._round_robin_lock = threading.Lock()  # appends run in the API's worker threads
        self.warnings: list[str] = []

    def _make_clients(self, common: dict) -> None:
        self._admin = AdminClient(dict(common))
        self._producer = Producer({
            # The API waits for the acks of each request: librdkafka's default 5 ms of batching
            # made a 1-event append take 7.7 ms here instead of 1.4 ms; a big request's records
            # batch anyway while they are queued (1000 events: 37 ms either way).
            "linger.ms": 0,
            # A request may hold 100 000 events: let the local queue take a whole one.
            "queue.buffering.max.messages": 1_000_000,
            **common,
            # librdkafka reports every record by this time: a broker that is down fails the append
            # after this long instead of its 5-minute default.
            "message.timeout.ms": self.produce_timeout_ms,
            **_PRODUCER_FIXED,
        })
        self._consumer = self._new_consumer(common)

    def _new_consumer(self, common: dict) -> Consumer:
        return Consumer({
            "group.id": "sketchboard-log-reader",  # required by librdkafka; never joined or committed
            "enable.auto.commit": False,
            "enable.partition.eof": True,  # a read knows when it reached the partition's end
            "fetch.wait.max.ms": 20,
            **common,
            # Not for kafka_options to change: a read starts at the first retained record when
            # retention deleted its start (`records` tells), and offsets and reads agree on
            # which records count (offsets_of asks for the same isolation).
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed" if self.read_committed else "read_uncommitted",
        })

    def topic(self, stream: str) -> str:
        return topic_name(self.topic_prefix, stream)

    # -- topics -------------------------------------------------------------------------

    def ensure_topic(self, stream: StreamDef) -> None:
        topic = self.topic(stream.name)
        partitions = self._topic_partitions(topic)
        if partitions is None:
            new = NewTopic(topic, num_partitions=stream.partitions,
                           replication_factor=self.replication_factor or -1,
                           config=topic_config(stream))
            future = self._admin.create_topics([new], request_timeout=self.timeout_s)[topic]
            try:
                future.result()
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # another replica made it: check it
                    raise self._unavailable(f"could not create Kafka topic {topic!r}", exc) from None
            partitions = self._wait_for_partitions(topic)
        timestamp_type = self._config(topic).get(TIMESTAMP_TYPE)
        for warning in check_topic(topic, stream, partitions, timestamp_type):
            if warning not in self.warnings:
                log.warning("%s", warning)
                self.warnings.append(warning)
        self._partitions[stream.name] = partitions

    def check_topics(self, streams: Iterable[StreamDef]) -> tuple[list[str], list[str]]:
        """Each stream's topic, where there is one, judged as `ensure_topic` judges it, creating
        nothing (`sketchboard check-config`): (what the API and the pipeline would refuse to
        start with, warnings). The topics are listed whole: asking a broker for one topic's
        metadata may create it where the broker auto-creates topics."""
        try:
            listed = self._admin.list_topics(timeout=self.timeout_s).topics
        except KafkaException as exc:
            raise self._unavailable("could not list the Kafka topics", exc) from None
        errors: list[str] = []
        warnings: list[str] = []
        for stream in streams:
            topic = self.topic(stream.name)
            meta = listed.get(topic)
            if meta is None:  # made as configured when the API or the pipeline starts
                continue
            if meta.error is not None:
                raise LogUnavailable(f"Kafka topic {topic!r} at {self.bootstrap_servers}: {meta.error}")
            try:
                warnings += check_topic(topic, stream, len(meta.partitions), self._config(topic).get(TIMESTAMP_TYPE))
            except TopicMismatch as exc:
                errors.append(str(exc))
        return errors, warnings

    def _topic_partitions(self, topic: str) -> int | None:
        try:
            meta = self._admin.list_topics(topic=topic, timeout=self.timeout_s).topics.get(topic)
        except KafkaException as exc:
            raise self._unavailable(f"could not read the metadata of Kafka topic {topic!r}", exc) from None
        if meta is None or (meta.error is not None and meta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            return None
        if meta.error is not None:
            raise LogUnavailable(f"Kafka topic {topic!r} at {self.bootstrap_servers}: {meta.error}")
        return len(meta.partitions)

    def _wait_for_partitions(self, topic: str) -> int:
        # A new topic's metadata (and its partitions' leaders) reaches the broker's cache
        # shortly after CreateTopics returns; producing or reading before that fails.
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            meta = self._admin.list_topics(topic=topic, timeout=self.timeout_s).topics.get(topic)
            if meta is not None and meta.error is None and meta.partitions \
                    and all(p.leader >= 0 for p in meta.partitions.values()):
                return len(meta.partitions)
            time.sleep(0.05)
        raise LogUnavailable(f"Kafka topic {topic!r} was created but its metadata did not appear within"
                             f" {self.timeout_s:g} s at {self.bootstrap_servers}")

    def _config(self, topic: str) -> dict[str, str]:
        resource = ConfigResource(ResourceType.TOPIC, topic)
        try:
            entries = self._admin.describe_configs([resource], request_timeout=self.timeout_s)[resource].result()
        except KafkaException as exc:
            raise self._unavailable(f"could not read the configuration of Kafka topic {topic!r}", exc) from None
        return {name: entry.value for name, entry in entries.items()}

    def _unavailable(self, what: str, exc: Exception) -> LogUnavailable:
        return LogUnavailable(f"{what} at {self.bootstrap_servers}: {exc}")

    # -- writing ------------------------------------------------------------------------

    def append(self, stream: StreamDef, events: Sequence[Event], ingest_time_ms: int) -> AppendResult:
        if not events:
            return AppendResult({})
        records = self._records(stream, events)
        topic, targets = self._targets(stream, events)
        return self._produce(self._producer, topic, records, targets, ingest_time_ms)

    def _records(self, stream: StreamDef, events: Sequence[Event]) -> list[tuple[bytes | None, bytes | None]]:
        """Each event's record (value, key), all made before any is produced: one over the
        producer's message.max.bytes (librdkafka would refuse it in produce(), after the
        append's earlier records were queued) refuses the whole append, nothing written."""
        records = []
        limit = self.max_record_bytes
        for index, event in enumerate(events):
            value = record_value(stream, event, event_to_json)  # a table's tombstone: null
            key = None if event.key is None else event.key.encode("utf-8")
            size = (0 if value is None else len(value)) + (0 if key is None else len(key))
            if size > limit:
                raise RecordTooLarge(index, f"the event's Kafka record is {size} bytes, over the {limit} bytes the"
                                            f" log takes as one record (the producer's {MESSAGE_MAX_BYTES})")
            records.append((value, key))
        return records

    def _targets(self, stream: StreamDef, events: Sequence[Event]) -> tuple[str, list[int]]:
        """The stream's topic and each event's partition, checked before anything is produced,
        so an append to a partition the topic lacks (KeyError) writes nothing."""
        topic = self.topic(stream.name)
        have = self._partitions.get(stream.name)
        if have is None:
            have = self._topic_partitions(topic) or 0
            self._partitions[stream.name] = have
        with self._round_robin_lock:
            targets, self._round_robin = assign_partitions([e.key for e in events], stream.partitions,
                                                           self._round_robin)
        missing = sorted({p for p in targets if p >= have})
        if missing:
            raise KeyError(f"stream {stream.name!r} has no partition {missing[0]} in the log"
                           f" (Kafka topic {topic!r} has {have})")
        return topic, targets

    def _produce(self, producer: Producer, topic: str, records: Sequence[tuple[bytes | None, bytes | None]],
                 targets: Sequence[int], ingest_time_ms: int) -> AppendResult:
        return AppendResult(self._deliver(producer, topic, records, targets, ingest_time_ms).ranges())

    def _deliver(self, producer: Producer, topic: str, records: Sequence[tuple[bytes | None, bytes | None]],
                 targets: Sequence[int], ingest_time_ms: int) -> _Delivery:
        """Produce the records (`_records`) to their partitions and wait until each is
        acknowledged or failed."""
        delivery = _Delivery(len(records))
        deadline = time.monotonic() + self.produce_timeout_ms / 1000 + self.timeout_s
        for index, ((value, key), partition) in enumerate(zip(records, targets, strict=True)):
            while True:
                try:
                    # The timestamp counts on a CreateTime topic; LogAppendTime replaces it.
                    producer.produce(topic, value, key, partition=partition, timestamp=ingest_time_ms,
                                     on_delivery=functools.partial(delivery, index=index))
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    if time.monotonic() > deadline:
                        raise LogUnavailable(f"Kafka at {self.bootstrap_servers} takes no records: the"
                                             " producer's queue stayed full") from None
                    producer.poll(0.05)
                except KafkaException as exc:  # anything else librdkafka refuses outright (a fatal producer)
                    raise self._unavailable(f"Kafka refused record {index} of {len(records)} for topic {topic!r}"
                                            + (f" ({index} were queued before it)" if index else ""), exc) from None
        # Each appending thread serves delivery callbacks until its own records are all reported;
        # librdkafka reports every record within message.timeout.ms, delivered or failed.
        while not delivery.done.is_set():
            producer.poll(0.05)
            if time.monotonic() > deadline:
                missing = delivery.expected - delivery.reported
                raise LogUnavailable(f"Kafka at {self.bootstrap_servers} did not report on {missing} of"
                                     f" {delivery.expected} records in time")
        if delivery.errors:
            failed = len(delivery.errors)
            written = len(records) - failed
            if delivery.too_large:  # the broker's or the topic's message.max.bytes is below the producer's
                index = min(delivery.too_large)
                size = sum(len(part) for part in records[index] if part is not None)
                raise RecordTooLarge(
                    index, f"Kafka at {self.bootstrap_servers} refused the event's {size}-byte record for topic"
                           f" {topic!r} as too large: the topic's or the brokers' {MESSAGE_MAX_BYTES} is below the"
                           f" producer's {self.max_record_bytes}; raise it (with room for a batch's headers)"
                           + (f" ({written} of the append's records were written)" if written else ""),
                    written)
            raise LogUnavailable(
                f"Kafka did not acknowledge {failed} of {len(records)} records for topic {topic!r} at"
                f" {self.bootstrap_servers}: {delivery.errors[0]}"
                + ("" if failed == len(records) else f" ({written} were written)"))
        return delivery

    # -- change data capture: an append and a source's position in one transaction ------

    def append_at(self, stream: StreamDef, events: Sequence[Event], ingest_time_ms: int, source: str,
                  position: str, expected: str | None, *, retry_fenced: bool = True) -> AppendResult:
        """The events and the source's new position (a record keyed by the source in the compacted
        positions topic) in one Kafka transaction: consumers reading committed records (Spark's
        source is set to, librdkafka's default) see both or neither. The transactional id is the
        source's, so a second writer of the same source fences the first (its commit fails).
        A writer fenced once (another took over, then stopped: a leadership change) tries once
        more with a new producer, after checking the position again: if the other moved it on,
        that is a PositionConflict."""
        records = self._records(stream, events)
        topic, targets = self._targets(stream, events) if events else (self.topic(stream.name), [])
        positions = self._positions()
        producer = positions.producer(source)
        current = positions.read().get(source)
        if current != expected:
            raise PositionConflict(f"source {source!r} is at {current!r} in the log, not at the expected"
                                   f" {expected!r}: another writer follows it")
        try:
            producer.begin_transaction()
            delivery = self._deliver(producer, topic, records, targets, ingest_time_ms) if events \
                else _Delivery(0)
            positions.produce(producer, source, position)
            producer.commit_transaction(self.timeout_s)
            positions.committed(source, position)
        except (KafkaException, LogUnavailable, RecordTooLarge) as exc:
            if positions.abort(source, producer, self.timeout_s):
                if isinstance(exc, RecordTooLarge):  # a broker refused it: aborted, nothing of it counts
                    raise RecordTooLarge(exc.index, exc.reason) from None
                raise (self._unavailable(f"could not append source {source!r}'s changes in a transaction", exc)
                       if isinstance(exc, KafkaException) else exc) from None
            if retry_fenced:  # the producer is gone (fenced, or fatal): a new one, the position checked again
                return self.append_at(stream, events, ingest_time_ms, source, position, expected, retry_fenced=False)
            raise PositionConflict(f"source {source!r}: another writer took over ({exc})") from None
        self._await_stable(topic, delivery.stable_targets())
        return AppendResult(delivery.ranges())

    def _await_stable(self, topic: str, targets: dict[int, int]) -> None:
        """Wait until readers of committed records see the transaction's records: its commit
        returns before the broker has written the markers that move each partition's last stable
        offset past them (milliseconds), and an append must be readable once it returned, as on
        the embedded log. Past the timeout the records stay committed; they show a moment later."""
        deadline = time.monotonic() + self.timeout_s
        for partition, end in targets.items():
            while self._watermarks(topic, partition)[1] < end and time.monotonic() < deadline:
                time.sleep(0.005)

    def source_position(self, source: str) -> str | None:
        return self._positions().read().get(source)

    def _positions(self) -> SourcePositions:
        if self._source_positions is None:
            self._source_positions = SourcePositions(self, self._common)
        return self._source_positions

    # -- reading ------------------------------------------------------------------------

    def offsets(self, stream: str) -> Mapping[int, PartitionOffsets]:
        topic = self.topic(stream)
        partitions = self._topic_partitions(topic)
        out = {}
        for p in range(partitions or 0):
            out[p] = PartitionOffsets(*self._watermarks(topic, p))
        return out

    def offsets_of(self, streams: Iterable[str]) -> dict[str, Mapping[int, PartitionOffsets]]:
        """offsets() of several streams in two ListOffsets requests (earliest, latest: the last
        stable offsets when read_committed) for all their partitions, where offsets() asks for a
        topic's metadata and then each partition's watermarks: the demo's 26 partitions took
        ~100 ms that way on a local broker, ~10 ms this way, and a pipeline asks at every trigger.
        A topic whose partitions were not checked here is asked its metadata; anything that fails
        is asked again stream by stream, with offsets()' retries and metadata refreshes."""
        from confluent_kafka import IsolationLevel
        from confluent_kafka.admin import OffsetSpec

        streams = list(streams)
        try:
            partitions = {name: self._partition_count(name) for name in streams}
            asked = [TopicPartition(self.topic(name), p) for name in streams for p in range(partitions[name])]
            if not asked:
                return {name: {} for name in streams}
            isolation = IsolationLevel.READ_COMMITTED if self.read_committed else IsolationLevel.READ_UNCOMMITTED
            found = []
            for spec in (OffsetSpec.earliest(), OffsetSpec.latest()):
                futures = self._admin.list_offsets({tp: spec for tp in asked}, isolation_level=isolation,
                                                   request_timeout=self.timeout_s)
                found.append({(tp.topic, tp.partition): future.result().offset for tp, future in futures.items()})
        except (KafkaException, LogUnavailable):
            return {name: self.offsets(name) for name in streams}
        low, high = found
        return {name: {p: PartitionOffsets(low[(self.topic(name), p)], high[(self.topic(name), p)])
                       for p in range(partitions[name])} for name in streams}

    def _partition_count(self, stream: str) -> int:
        """The stream's topic's partitions, asked again every PARTITIONS_REFRESH_S: a topic grown
        outside (`kafka-topics --alter`) is read within that, as offsets() would see it at once."""
        counted = self._partition_counts.get(stream)
        now = time.monotonic()
        if counted is None or now - counted[1] > PARTITIONS_REFRESH_S:
            counted = self._partition_counts[stream] = (self._topic_partitions(self.topic(stream)) or 0, now)
        return counted[0]

    def _watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                found = self._consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=self.timeout_s)
                self._stale_since = None
                return found
            except KafkaException as exc:
                # Right after a topic is created (or a broker restarted) its leader may not be
                # known yet: "not leader" is retriable and passes within a second. "Unknown
                # partition" is the consumer's own metadata cache, not the broker: it outlives a
                # topic growing partitions, or a broker restart that answered with a partial
                # topic, for up to metadata.max.age.ms (15 min), so it is refreshed here.
                stale = exc.args[0].code() == KafkaError._UNKNOWN_PARTITION
                if not (stale or _retriable(exc)) or time.monotonic() > deadline:
                    raise self._unavailable(f"could not read the offsets of Kafka topic {topic!r}", exc) from None
                if stale:
                    # Counted across calls: with a request timeout under _STALE_REFRESH_S, each call
                    # gave up before the consumer was made anew, and a serving loop asked for ever.
                    self._stale_since = self._stale_since or time.monotonic()
                    if time.monotonic() - self._stale_since > _STALE_REFRESH_S:
                        # Refreshed and still short (seen once after a broker restart, for more than
                        # the 10 s it had): a new consumer starts from no cache at all.
                        self._replace_consumer()
                        self._stale_since = time.monotonic()
                    else:
                        self._refresh_metadata(topic, deadline)
                time.sleep(0.05)

    def _replace_consumer(self) -> None:
        # Never under a read's assignment; the old one is closed with the log, not now: another
        # thread may be asking it for offsets at this very moment.
        with self._read_lock:
            self._retired.append(self._consumer)
            self._consumer = self._new_consumer(self._common)

    def _refresh_metadata(self, topic: str, deadline: float) -> None:
        """Ask the broker for the topic's metadata through the consumer: its answer replaces the
        consumer's cached partitions (the admin client's cache is another one)."""
        try:
            self._consumer.list_topics(topic=topic, timeout=max(0.1, deadline - time.monotonic()))
        except KafkaException:
            pass  # the broker is away: the next read says so

    def _fetch(self, topic: str, partition: int, start: int, end: int) -> tuple[list, int | None]:
        """The records with start <= offset < end (end at most the high watermark), and where the
        read goes on from: `end` once the range is read, or the offset of the first record past it
        (a gap: a compacted topic, an aborted transaction, a direct producer's records that were
        never events may leave thousands of offsets without a record), or None at the partition's
        end (nothing more there now)."""
        records = []
        if start >= end:  # nothing to wait for (a consume of 0 records would wait out the deadline)
            return records, end
        deadline = time.monotonic() + self.timeout_s
        with self._read_lock:
            self._consumer.assign([TopicPartition(topic, partition, start)])
            try:
                while time.monotonic() < deadline:
                    # Returns once it has them all, else after the timeout: a range that holds fewer
                    # (a transaction's markers, a start retention deleted) waits that out once more
                    # before the end-of-partition event, so it is short.
                    for msg in self._consumer.consume(num_messages=min(end - start, 10_000), timeout=0.05):
                        error = msg.error()
                        if error is not None:
                            if error.code() == KafkaError._PARTITION_EOF:
                                return records, None  # no more (retention or a compaction gap left it short)
                            raise LogUnavailable(f"reading Kafka topic {topic!r} partition {partition}: {error}")
                        if msg.offset() >= end:
                            return records, msg.offset()  # a gap up to the range's end, and maybe past it
                        records.append(msg)
                        if msg.offset() == end - 1:
                            return records, end
            finally:
                self._consumer.unassign()
        raise LogUnavailable(f"reading Kafka topic {topic!r} partition {partition} [{start}, {end}) at"
                             f" {self.bootstrap_servers} did not finish within {self.timeout_s:g} s")

    def read(self, stream: StreamDef, partition: int, start: int, end: int) -> Iterator[pa.RecordBatch]:
        topic = self.topic(stream.name)
        if partition >= (self._partitions.get(stream.name) or self._topic_partitions(topic) or 0):
            return
        low, high = self._watermarks(topic, partition)
        lo, hi = max(start, low), min(end, high)
        if lo >= hi:
            return
        validator = self._validators.get(stream.name)
        if validator is None or validator.stream != stream:  # a definition read before, or a new one
            validator = self._validators[stream.name] = EventValidator(stream)
        pos = lo
        while pos < hi:
            # A chunk at a time, the consumer's lock held only while fetching it: memory stays
            # bounded on a long range, and offsets()/ingest_time_ms() are not blocked meanwhile.
            # A chunk may hold no record at all (a gap of a chunk or more: a compacted table's topic,
            # an aborted transaction): the read goes on from where the fetch stopped, up to hi or
            # the partition's end, never taking an empty chunk for the end.
            records, next_pos = self._fetch(topic, partition, pos, min(hi, pos + _READ_CHUNK))
            offsets, events, times = [], [], []
            for msg in records:
                try:
                    event = record_event(stream, validator, msg.key(), msg.value(), _timestamp(msg),
                                         self._from_json)
                except ValueError:
                    continue  # not an event under this definition: left out (the pipeline dead-letters it)
                offsets.append(msg.offset())
                events.append(event)
                times.append(_timestamp(msg))
            if events:
                yield with_offsets(offsets, project(events_to_batch(stream, events, times), stream))
            if next_pos is None:  # the partition's end
                return
            pos = next_pos

    def _from_json(self, validator: EventValidator, value: bytes | None) -> Event:
        # Bounded as the pipeline's RecordConverter bounds it: a record read here is an event
        # exactly when the pipeline takes it (not one it dead-letters, nor a NaN written back
        # into `__extra` as JSON no reader parses).
        return json_to_event(validator, value, self.json_limits)

    def records(self, ranges: Mapping[tuple[str, int], tuple[int, int]],
                lost: Callable[[str, int, int, int], None] | None = None) -> dict[tuple[str, int], list[pa.RecordBatch]]:
        """Per (stream, partition) of `ranges`, the records with start <= offset < end as they are
        (RECORD_SCHEMA), in offset order, in batches of at most _READ_CHUNK: what Spark's Kafka
        source reads of the ranges. One assignment of all the partitions, so their fetches run at
        once: a partition at a time paid a fetch round each (~20 ms on a local broker, most of a
        small batch's read). Records the topic's retention deleted are not there:
        `lost(stream, partition, start, first_retained)` is told (first_retained at most the
        range's end), after the read. Records before a range's start (a consumer sent back to the
        log's start: the range is past the partition's end) are not taken. A read that gets no
        record for the request timeout fails with LogUnavailable."""
        out: dict[tuple[str, int], list[pa.RecordBatch]] = {key: [] for key in ranges}
        pending = {(self.topic(stream), p): (stream, lo, hi) for (stream, p), (lo, hi) in ranges.items() if hi > lo}
        if not pending:
            return out
        held: dict[tuple[str, int], list] = {key: [] for key in pending}
        first: set[tuple[str, int]] = set()
        paused: list[TopicPartition] = []
        got = dict.fromkeys(pending, 0)  # records taken per partition

        to_check: list[tuple[tuple[str, int], str, int, int]] = []  # partitions whose start to ask, after the read

        def done(key: tuple[str, int]) -> None:
            flush(key)
            stream, lo, hi = pending.pop(key)
            if key not in first:  # not one record: all deleted by retention, or no data (markers, aborted)
                to_check.append((key, stream, lo, hi))
            paused.append(TopicPartition(*key))
            self._consumer.pause(paused[-1:])  # nothing fetched past its end meanwhile

        def flush(key: tuple[str, int]) -> None:
            if held[key]:
                out[(pending[key][0], key[1])].append(_record_batch(key, held[key]))
                held[key] = []

        with self._read_lock:
            self._consumer.assign([TopicPartition(t, p, lo) for (t, p), (_, lo, _) in pending.items()])
            try:
                deadline = time.monotonic() + self.timeout_s
                while pending:
                    if time.monotonic() > deadline:
                        raise LogUnavailable(
                            f"reading Kafka topics {sorted({t for t, _ in pending})} at {self.bootstrap_servers}: no"
                            f" record for {self.timeout_s:g} s with {len(pending)} partitions not read to their end")
                    # Returns once it has as many as the ranges have left, else after the timeout: short,
                    # as a range may hold fewer (a transaction's markers) and its end-of-partition event
                    # then ends it. (Asking for more than are left waited the timeout out every call.)
                    left = sum(hi - lo - got[key] for key, (_, lo, hi) in pending.items())
                    for msg in self._consumer.consume(num_messages=max(1, min(_READ_CHUNK, left)), timeout=0.05):
                        key = (msg.topic(), msg.partition())
                        if key not in pending:
                            continue  # a partition read to its end already
                        deadline = time.monotonic() + self.timeout_s
                        error = msg.error()
                        if error is not None:
                            if error.code() == KafkaError._PARTITION_EOF:
                                done(key)
                                continue
                            raise LogUnavailable(f"reading Kafka topic {key[0]!r} partition {key[1]}: {error}")
                        stream, lo, hi = pending[key]
                        offset = msg.offset()
                        if offset < lo:  # the consumer went back to the log's start: the range is past its end
                            continue
                        if key not in first:
                            first.add(key)
                            if offset > lo:  # not the start's record: deleted by retention, or no data
                                to_check.append((key, stream, lo, hi))
                        if offset >= hi:
                            done(key)
                            continue
                        held[key].append(msg)
                        got[key] += 1
                        if offset == hi - 1:
                            done(key)
                        elif len(held[key]) >= _READ_CHUNK:
                            flush(key)
            finally:
                if paused:  # a pause could outlive the assignment: the next read of the partition would hang
                    self._consumer.resume(paused)
                self._consumer.unassign()
        # Asked outside the read lock: a stale partition there replaces the consumer, under that lock.
        for key, stream, lo, hi in to_check:
            self._check_start(key, stream, lo, hi, lost)
        return out

    def _check_start(self, key: tuple[str, int], stream: str, start: int, end: int,
                     lost: Callable[[str, int, int, int], None] | None) -> None:
        """Tell `lost` which of [start, end) retention deleted, if any (the partition's start is past start)."""
        low, _ = self._watermarks(*key)
        if low > start and lost is not None:
            lost(stream, key[1], start, min(low, end))

    def ingest_time_ms(self, stream: str, partition: int, offset: int) -> int | None:
        # A record's timestamp never changes: remember the few the lag sampler keeps asking for.
        key = (stream, partition, offset)
        if key in self._ingest_times:
            self._ingest_times.move_to_end(key)
            return self._ingest_times[key]
        records, _ = self._fetch(self.topic(stream), partition, offset, offset + 1)
        if not records or records[0].offset() != offset:
            return None
        at = _timestamp(records[0])
        if at is not None:
            self._ingest_times[key] = at
            if len(self._ingest_times) > 4096:
                self._ingest_times.popitem(last=False)
        return at

    def first_appended_after(self, stream: str, starts: Mapping[int, int], cut_ms: int) -> dict[int, int | None]:
        # The broker's time index answers for every partition in one request: the earliest offset
        # whose timestamp (LogAppendTime) is at or after cut + 1 ms; -1 when there is none.
        if not starts:
            return {}
        topic = self.topic(stream)
        asked = [TopicPartition(topic, p, cut_ms + 1) for p in sorted(starts)]
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                found = self._consumer.offsets_for_times(asked, timeout=self.timeout_s)
                break
            except KafkaException as exc:
                if not _retriable(exc) or time.monotonic() > deadline:
                    raise self._unavailable(f"could not find offsets by time in Kafka topic {topic!r}", exc) from None
                time.sleep(0.05)
        out: dict[int, int | None] = {}
        for tp in found:
            if tp.error is not None:
                raise LogUnavailable(f"finding offsets by time in Kafka topic {topic!r} partition {tp.partition}:"
                                     f" {tp.error}")
            out[tp.partition] = None if tp.offset < 0 else max(starts[tp.partition], tp.offset)
        return out

    def apply_retention(self, now_ms: int, max_age_ms: int, max_bytes_per_partition: int) -> int:
        return 0  # the topic's retention.ms / retention.bytes apply, enforced by the brokers

    def close(self) -> None:
        with self._read_lock:
            if self._closed:  # closing twice is harmless, as on the embedded log
                return
            self._closed = True
            self._producer.flush(self.timeout_s)
            for consumer in [*self._retired, self._consumer]:
                consumer.close()
            if self._source_positions is not None:
                self._source_positions.close()


# librdkafka does not flag these as retriable on watermark queries, yet they pass once the
# partition's leader is known.
_LEADER_ERRORS = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                  KafkaError.UNKNOWN_TOPIC_OR_PART}


_STALE_REFRESH_S = 2.0  # "Unknown partition" this long after refreshing: the consumer is made anew


def _record_batch(key: tuple[str, int], records: list) -> pa.RecordBatch:
    topic, partition = key
    return pa.record_batch([
        pa.array([topic] * len(records), pa.string()),
        pa.array([partition] * len(records), pa.int32()),
        pa.array([m.offset() for m in records], pa.int64()),
        pa.array([_timestamp(m) for m in records], pa.int64()),
        pa.array([m.value() for m in records], pa.binary()),
        pa.array([m.key() for m in records], pa.binary()),
    ], schema=RECORD_SCHEMA)


def _retriable(exc: KafkaException) -> bool:
    error = exc.args[0]
    return error.retriable() or error.code() in _LEADER_ERRORS


def _timestamp(msg) -> int | None:
    kind, at = msg.timestamp()
    return None if kind == TIMESTAMP_NOT_AVAILABLE or at < 0 else at


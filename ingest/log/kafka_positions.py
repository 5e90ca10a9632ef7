"""Where change data capture sources stand, on the Kafka log: one compacted topic
(`<prefix>__source_positions`, one partition) keyed by source, written in the same Kafka
transaction as the source's records (KafkaEventLog.append_at), the way Kafka Connect keeps its
source connectors' offsets. A transactional producer per source: its transactional id fences an
older writer of the same source (after a failover, the old one's commit fails), and readers
that read committed records see a source's changes and its position together or not at all.

The topic is read incrementally: the newest position per source is kept in memory and only the
records since the last read are fetched (the topic grows by one record per append until the
broker compacts it)."""

from __future__ import annotations

import threading
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

POSITIONS_TOPIC = "__source_positions"
# Compacted: only the newest position per source matters; small segments let the cleaner run.
SETTLE_S = 2.0  # how long a read waits for committed transactions' markers
TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.ms": "3600000", "min.cleanable.dirty.ratio": "0.1"}


class SourcePositions:
    def __init__(self, log, common: dict):
        self.log = log
        self.topic = f"{log.topic_prefix}{POSITIONS_TOPIC}"
        self._common = common
        self._lock = threading.Lock()
        self._producers: dict[str, Producer] = {}
        self._positions: dict[str, str] = {}
        self._next = 0  # the first offset not read yet
        self._ensure_topic()
        self._consumer = Consumer({
            "group.id": "sketchboard-source-positions",  # never joined or committed
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 20,
            **common,
            # Not for kafka_options to change: a position whose transaction aborted never counts.
            "isolation.level": "read_committed",
        })

    def _ensure_topic(self) -> None:
        if self.log._topic_partitions(self.topic) is not None:
            return
        new = NewTopic(self.topic, num_partitions=1, replication_factor=self.log.replication_factor or -1,
                       config=TOPIC_CONFIG)
        try:
            self.log._admin.create_topics([new], request_timeout=self.log.timeout_s)[self.topic].result()
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise self.log._unavailable(f"could not create Kafka topic {self.topic!r}", exc) from None
        self.log._wait_for_partitions(self.topic)

    def producer(self, source: str) -> Producer:
        """The source's transactional producer (made, and its older instances fenced, once)."""
        with self._lock:
            producer = self._producers.get(source)
            if producer is None:
                producer = Producer({
                    "linger.ms": 0,
                    "queue.buffering.max.messages": 1_000_000,
                    **self._common,
                    "message.timeout.ms": self.log.produce_timeout_ms,
                    "transactional.id": f"{self.log.topic_prefix}cdc.{source}",
                    "enable.idempotence": True, "acks": "all",
                })
                try:
                    producer.init_transactions(self.log.timeout_s)
                except KafkaException as exc:
                    raise self.log._unavailable(f"could not start source {source!r}'s transactions", exc) from None
                self._producers[source] = producer
            return producer

    def produce(self, producer: Producer, source: str, position: str) -> None:
        producer.produce(self.topic, position.encode("utf-8"), source.encode("utf-8"), partition=0)

    def abort(self, source: str, producer: Producer, timeout_s: float) -> bool:
        """Abort the open transaction; True when the producer can go on. One that cannot (fenced
        by a newer writer, or a fatal error) is dropped: the next append makes a new one."""
        try:
            producer.abort_transaction(timeout_s)
            return True
        except KafkaException:
            with self._lock:
                self._producers.pop(source, None)
            return False

    def read(self) -> dict[str, str]:
        """The newest committed position of every source. A transaction's commit returns before
        the broker has written its markers, so the last stable offset may stay a moment short of
        the high watermark: read again until it reaches it (or SETTLE_S passed: another writer's
        transaction may be open), so a writer reads its own committed position back."""
        with self._lock:
            settle = time.monotonic() + SETTLE_S
            while True:
                # The log's own offsets request: its retries (a leader not known yet), its refresh of
                # a stale metadata cache, and LogUnavailable when the brokers cannot be reached.
                low, high = self.log._watermarks(self.topic, 0)
                self._next = max(self._next, low)
                if self._next >= high:
                    return dict(self._positions)
                stable = self._read_from(self._next)
                if stable >= high or time.monotonic() > settle:
                    return dict(self._positions)
                time.sleep(0.02)

    def _read_from(self, start: int) -> int:
        """Read the committed records from `start` up to the last stable offset, which it returns."""
        self._consumer.assign([TopicPartition(self.topic, 0, start)])
        deadline = time.monotonic() + self.log.timeout_s
        try:
            while time.monotonic() < deadline:
                for msg in self._consumer.consume(num_messages=10_000, timeout=0.5):
                    error = msg.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:  # at the last stable offset
                            self._next = max(self._next, msg.offset())
                            return msg.offset()
                        raise self.log._unavailable(f"reading Kafka topic {self.topic!r}", KafkaException(error))
                    self._next = msg.offset() + 1
                    if msg.value() is None:
                        self._positions.pop(msg.key().decode("utf-8"), None)
                    else:
                        self._positions[msg.key().decode("utf-8")] = msg.value().decode("utf-8")
        finally:
            self._consumer.unassign()
        raise self.log._unavailable(f"reading Kafka topic {self.topic!r}",
                                    TimeoutError(f"not done within {self.log.timeout_s:g} s"))

    def committed(self, source: str, position: str) -> None:
        """The writer's own commit, known before its markers are readable."""
        with self._lock:
            self._positions[source] = position

    def close(self) -> None:
        with self._lock:
            for producer in self._producers.values():
                producer.flush(self.log.timeout_s)
            self._producers.clear()
            self._consumer.close()

"""A pipeline's committed offsets copied to a Kafka consumer group, for the tools that watch
consumer groups (Burrow, kafka-lag-exporter, kafka-consumer-groups.sh).

Only a copy: the pipeline's offsets live in its store (committed with its panes, exactly once)
and in Spark's checkpoint; the group is never read back. The copy is made with the admin API
(AlterConsumerGroupOffsets) on a group that has no members, so nothing joins or rebalances;
Kafka refuses it while some other client is a member of the group (a misconfigured group id):
the caller logs and counts that, the batch stands."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from ingest.log.kafka import topic_name

DEFAULT_GROUP_ID = "sketchboard-{pipeline}"


def group_id_for(template: str, pipeline: str) -> str:
    """The group of a pipeline: the template with `{pipeline}` replaced by its name."""
    group = template.replace("{pipeline}", pipeline)
    if not group:
        raise ValueError("the Kafka consumer group id is empty")
    return group


class GroupOffsetCommitter:
    def __init__(self, bootstrap_servers: str, group_id: str, *, topic_prefix: str = "sketchboard.",
                 options: Mapping[str, object] | None = None, timeout_s: float = 10.0):
        self.group_id = group_id
        self.topic_prefix = topic_prefix
        self.timeout_s = timeout_s
        self.what = f"copying offsets to Kafka consumer group {group_id!r}"  # for the pipeline's log line
        config = {k: v for k, v in (options or {}).items() if k not in ("acks", "enable.idempotence")}
        # As the log's clients (ingest/log/kafka.py): librdkafka's lines (a broker refusing
        # connections, twice a second while it is down) to Python logging, not straight to stderr.
        self._admin = AdminClient({"logger": logging.getLogger("ingest.log.kafka.librdkafka"),
                                   "reconnect.backoff.max.ms": 1000, **config, "bootstrap.servers": bootstrap_servers})

    def commit(self, end_offsets: Mapping[str, Mapping[int, int]]) -> None:
        """Set the group's offsets (next offset to read, per topic partition); KafkaException
        with the broker's reason when the group or any partition refused."""
        partitions = [TopicPartition(topic_name(self.topic_prefix, stream), int(p), int(end))
                      for stream, parts in sorted(end_offsets.items()) for p, end in sorted(parts.items())]
        if not partitions:
            return
        deadline = time.monotonic() + self.timeout_s
        while True:
            futures = self._admin.alter_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(self.group_id, partitions)], request_timeout=self.timeout_s)
            try:
                result = futures[self.group_id].result(timeout=self.timeout_s + 5)
                break
            except KafkaException as exc:
                # A coordinator moving or loading its state (a fresh or restarted cluster) says so
                # with a retriable error: asked again within the timeout, as a consumer's commit is.
                if not _retriable(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        failed = [f"{tp.topic}[{tp.partition}]: {tp.error}" for tp in result.topic_partitions or [] if tp.error]
        if failed:
            raise KafkaException(f"group {self.group_id!r} refused offsets: {'; '.join(failed)}")

    def committed(self) -> dict[str, dict[int, int]]:
        """The group's offsets per stream (topics under the prefix), as outside tools see them."""
        futures = self._admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(self.group_id)],
                                                          request_timeout=self.timeout_s)
        result = futures[self.group_id].result(timeout=self.timeout_s + 5)
        out: dict[str, dict[int, int]] = {}
        for tp in result.topic_partitions or []:
            if tp.topic.startswith(self.topic_prefix) and tp.offset >= 0:
                out.setdefault(tp.topic[len(self.topic_prefix):], {})[tp.partition] = tp.offset
        return out


def _retriable(exc: KafkaException) -> bool:
    error = exc.args[0] if exc.args else None
    return bool(getattr(error, "retriable", lambda: False)())

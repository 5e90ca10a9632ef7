"""Spark's Kafka source's offsets as JSON text, byte for byte as Spark writes them.

A pipeline that drives its own batches on Kafka (aggregates/bounded_batches.py) writes their end
offsets to the query's Spark offset log, so that Spark's query can resume after them. Spark then
compares the offsets it logged last with the ones its source finds now to decide whether a batch
has new data (MicroBatchExecution `isNewDataAvailable`: `committed != available`), and an offset's
equality is its JSON's (`Offset.equals` compares `json()` as text; what it read back from the log
is a `SerializedOffset` of our text). Offsets written in any other order than Spark's own make it
run one extra batch with identical offsets and no records after ours.

Spark's order (spark-sql-kafka-0-10 `JsonUtils.partitionOffsets`): the topic-partitions sorted by
(topic, partition) are put one by one into a Scala 2.13 `mutable.HashMap[String, HashMap[Int,
Long]]` (the outer map written once per partition), and Jackson writes each map in its iteration
order. That order is the hash table's: by bucket (the key's hash, improved as `h ^ (h >>> 16)`,
masked by the table's length), within a bucket by that hash as a signed int, ties in insertion
order. The table starts at 16 buckets and doubles whenever a put finds `size + 1 >= 0.75 *
length` (checked before it knows whether the key is new). A String's hash is Java's
`String.hashCode` over UTF-16 code units; an Int's is the int. All of it pure, replayed here."""

from __future__ import annotations

import json
from collections.abc import Hashable, Iterable, Mapping

_INITIAL_BUCKETS = 16
_LOAD_FACTOR = 0.75


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def java_string_hash(text: str) -> int:
    """Java's `String.hashCode` (and Scala's `##` of a String): s[0]*31^(n-1) + ... over UTF-16
    code units, in 32-bit two's complement."""
    h = 0
    units = text.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return _int32(h)


def _improved(h: int) -> int:
    """Scala 2.13 mutable.HashMap's `improveHash`: h ^ (h >>> 16), as a signed int."""
    h &= 0xFFFFFFFF
    return _int32(h ^ (h >> 16))


def scala_hash_map_order(puts: Iterable[Hashable], hash_of) -> list:
    """The keys of a Scala 2.13 `mutable.HashMap` in its iteration order, after `puts` (keys in
    the order they were put, a key put again being an update), `hash_of` a key's `##`."""
    buckets, size, first_put = _INITIAL_BUCKETS, 0, {}
    threshold = int(buckets * _LOAD_FACTOR)
    for key in puts:
        if size + 1 >= threshold:  # put0 grows the table before looking the key up
            buckets *= 2
            threshold = int(buckets * _LOAD_FACTOR)
        if key not in first_put:
            first_put[key] = len(first_put)
            size += 1

    def position(key) -> tuple[int, int, int]:
        h = _improved(hash_of(key))
        return h & (buckets - 1), h, first_put[key]

    return sorted(first_put, key=position)


def spark_offsets_json(offsets: Mapping[str, Mapping[int, int]]) -> str:
    """{topic: {partition: offset}} (partitions as ints or their JSON strings) as Spark's Kafka
    source writes it (`KafkaSourceOffset.json`)."""
    by_topic = {topic: {int(p): int(o) for p, o in parts.items()} for topic, parts in offsets.items()}
    parts = sorted((topic, p) for topic, by_partition in by_topic.items() for p in by_partition)
    topics = scala_hash_map_order((topic for topic, _ in parts), java_string_hash)
    out = []
    for topic in topics:
        partitions = scala_hash_map_order(sorted(by_topic[topic]), lambda p: p)
        body = ",".join(f'"{p}":{by_topic[topic][p]}' for p in partitions)
        out.append(f"{json.dumps(topic)}:{{{body}}}")
    return "{" + ",".join(out) + "}"

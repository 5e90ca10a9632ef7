"""The durable partitioned event log, as every backend (embedded SQLite, Kafka) offers it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from catalog import StreamDef
from ingest.events import Event


@dataclass(frozen=True)
class AppendResult:
    """Where an append landed: per partition, the first offset and how many records. The first
    offset is None where the log acknowledged a record without saying where it landed (a Kafka
    producer's retry that the broker had already written)."""

    ranges: dict[int, tuple[int | None, int]]

    @property
    def count(self) -> int:
        return sum(n for _, n in self.ranges.values())


class TopicMismatch(ValueError):
    """The log's existing partitions (a Kafka topic made by someone else, an older embedded
    log) do not fit the stream's definition; the message says what to change."""


class RecordTooLarge(ValueError):
    """An event whose record is over what the log stores as one record (Kafka: the producer's
    `message.max.bytes`, 1 000 000 bytes by default): the append is refused before anything is
    written, so retrying it can never succeed. `index`: the event's place in the append. The
    ingest API answers 413 naming the event. `written`: records of the append the log had
    already written (0, unless a broker whose limit is below the producer's refused the record
    after others of the append had been acknowledged)."""

    def __init__(self, index: int, reason: str, written: int = 0):
        super().__init__(reason)
        self.index = index
        self.reason = reason
        self.written = written


class LogUnavailable(RuntimeError):
    """The log's backend did not answer or refused the request (a Kafka broker down, a
    timeout). The ingest API answers 503 with this message. An append that raised it may have
    written part of its events on Kafka (see `EventLog.append`)."""


class PositionConflict(RuntimeError):
    """`append_at` found another position than the one its writer expected: another writer
    (a second follower of the same source) moved on; nothing was written."""


@dataclass(frozen=True)
class PartitionOffsets:
    start: int  # earliest retained offset
    end: int  # next offset to be written


class EventLog(ABC):
    """Append-only, partitioned by key, offsets per partition, readable from any retained offset."""

    @abstractmethod
    def ensure_topic(self, stream: StreamDef) -> None:
        """Create the stream's partitions if needed. A partition count may only grow: fewer
        configured partitions than the log has is a ValueError. The embedded log grows its
        partitions; Kafka does not repartition an existing topic (a ValueError too)."""

    @abstractmethod
    def append(self, stream: StreamDef, events: Sequence[Event], ingest_time_ms: int) -> AppendResult:
        """Append; return only once every event is durably written. An event's partition is
        `partition_for(key)` (keyless ones round-robin). What the log can check beforehand (a
        partition it lacks: KeyError; an event over its per-record size limit: RecordTooLarge)
        fails before anything is written. The embedded log is
        atomic: on any error nothing is written. Kafka is not atomic across partitions: on
        `LogUnavailable` some events may have been written, so a client retrying the request
        may duplicate them (never the other way round: nothing is reported written that was
        not acknowledged)."""

    def append_columns(self, stream: StreamDef, columns: pa.Table, ingest_time_ms: int) -> AppendResult:
        """`append` for events already validated as columns (ingest/columnar.py), with the same
        partitions and guarantees. This default turns the rows into events; a backend that can
        write columns as they are (the embedded log) does so."""
        return self.append(stream, events_from_columns(stream, columns), ingest_time_ms)

    def append_column_groups(self, stream: StreamDef, tables: Sequence[pa.Table],
                             ingest_time_ms: int) -> list[AppendResult]:
        """`append_columns` of each table, one after another, at one ingest time: each table's
        result, with the same partitions and offsets. The ingest workers append the bodies that
        waited for them this way (a group commit). This default appends them one at a time (a
        failure leaves the ones before it written); the embedded log writes all or none, in one
        transaction."""
        return [self.append_columns(stream, table, ingest_time_ms) for table in tables]

    @abstractmethod
    def offsets(self, stream: str) -> Mapping[int, PartitionOffsets]:
        """Start and end offsets of each partition of a stream."""

    def offsets_of(self, streams: Iterable[str]) -> dict[str, Mapping[int, PartitionOffsets]]:
        """offsets() of each of `streams`, as of about one instant: what a pipeline asks at each
        trigger. A backend that can answer for all of them at once does (Kafka: two requests)."""
        return {name: self.offsets(name) for name in streams}

    @abstractmethod
    def read(self, stream: StreamDef, partition: int, start: int, end: int) -> Iterator[pa.RecordBatch]:
        """Records with start <= offset < end (clamped to what is retained), projected onto
        the stream's current definition, with an offset column first. Offsets may have gaps
        where a backend holds records that are not events under that definition (Kafka:
        a direct producer's invalid record)."""

    @abstractmethod
    def apply_retention(self, now_ms: int, max_age_ms: int, max_bytes_per_partition: int) -> int:
        """Drop whole segments older than max_age or beyond the size budget; return records dropped.
        (Kafka: the topic's own retention applies; this drops nothing.)"""

    def compact(self, now_ms: int, read_through: Mapping[str, Mapping[int, int]] | None = None) -> int:
        """One compaction pass over the changelog tables' partitions (kind: table): the newest
        record per key stays, older ones and expired tombstones go, offsets never change; return
        the records dropped. `read_through`: the pipeline's committed offsets per stream and
        partition; a tombstone at or past them stays, however old. (Kafka: the broker compacts a
        table's topic, cleanup.policy=compact, by delete.retention.ms alone.)"""
        return 0

    def append_at(self, stream: StreamDef, events: Sequence[Event], ingest_time_ms: int, source: str,
                  position: str, expected: str | None) -> AppendResult:
        """`append`, and record that the external `source` (change data capture: ingest/cdc/) has
        reached `position`, atomically: both or neither. `expected`: the position this writer read
        before (None: none yet); another one there means another writer moved on, and nothing is
        written (PositionConflict). Only a log that can do both in one transaction offers it."""
        raise NotImplementedError(f"the {type(self).__name__} cannot record a source's position with an append"
                                  " atomically: change data capture needs the embedded log (log_backend: sqlite)")

    def source_position(self, source: str) -> str | None:
        """The position `append_at` recorded last for `source` (None: never)."""
        return None

    def ingest_time_ms(self, stream: str, partition: int, offset: int) -> int | None:
        """When the record at this offset was appended (epoch ms), or None where the backend
        cannot tell cheaply or the offset is not retained. Used for lag in seconds
        (Kafka: the record's timestamp, the broker's append time on a LogAppendTime topic)."""
        return None

    def first_appended_after(self, stream: str, starts: Mapping[int, int], cut_ms: int) -> dict[int, int | None]:
        """For each partition of `starts` ({partition: offset}), the first offset at or after its
        start whose record was appended after `cut_ms` (epoch ms; a partition's append times taken
        as they rise), or None when every record from there on was appended at or before it: where a
        batch cut at that append time ends (ingest/append_cut.py)."""
        raise NotImplementedError(f"the {type(self).__name__} cannot find records by their append time")

    @abstractmethod
    def close(self) -> None: ...


def events_from_columns(stream: StreamDef, columns: pa.Table) -> list[Event]:
    """The events of a columnar body, as the per-event validator would have made them."""
    times = columns.column(stream.time_field).to_pylist()
    strings = {name: columns.column(name).to_pylist() for name in stream.string_fields}
    numbers = {name: columns.column(name).to_pylist() for name in stream.values}
    events = []
    for i, time_ms in enumerate(times):
        labels = {name: values[i] for name, values in strings.items()}
        events.append(Event(event_time_ms=time_ms, key=labels.get(stream.key_field) if stream.key_field else None,
                            strings=labels, numbers={name: values[i] for name, values in numbers.items()}))
    return events

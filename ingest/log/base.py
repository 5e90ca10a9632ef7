"""The durable partitioned event log, as every backend (embedded SQLite, later Kafka) offers it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from catalog import StreamDef
from ingest.events import Event


@dataclass(frozen=True)
class AppendResult:
    """Where an append landed: per partition, the first offset and how many records."""

    ranges: dict[int, tuple[int, int]]

    @property
    def count(self) -> int:
        return sum(n for _, n in self.ranges.values())


@dataclass(frozen=True)
class PartitionOffsets:
    start: int  # earliest retained offset
    end: int  # next offset to be written


class EventLog(ABC):
    """Append-only, partitioned by key, offsets per partition, readable from any retained offset."""

    @abstractmethod
    def ensure_topic(self, stream: StreamDef) -> None:
        """Create the stream's partitions if needed (a partition count may only grow)."""

    @abstractmethod
    def append(self, stream: StreamDef, events: Sequence[Event], ingest_time_ms: int) -> AppendResult:
        """Append atomically: all events are written, or none are."""

    @abstractmethod
    def offsets(self, stream: str) -> Mapping[int, PartitionOffsets]:
        """Start and end offsets of each partition of a stream."""

    @abstractmethod
    def read(self, stream: StreamDef, partition: int, start: int, end: int) -> Iterator[pa.RecordBatch]:
        """Records with start <= offset < end (clamped to what is retained), projected onto
        the stream's current definition, with an offset column first."""

    @abstractmethod
    def apply_retention(self, now_ms: int, max_age_ms: int, max_bytes_per_partition: int) -> int:
        """Drop whole segments older than max_age or beyond the size budget; return records dropped."""

    def ingest_time_ms(self, stream: str, partition: int, offset: int) -> int | None:
        """When the record at this offset was appended (epoch ms), or None where the backend
        cannot tell cheaply or the offset is not retained. Used for lag in seconds."""
        return None

    @abstractmethod
    def close(self) -> None: ...

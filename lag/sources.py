"""Where lag samples come from: the log's end offsets (a `LagSource`, one per log backend)
and the pipeline's committed offsets (the store's `pipeline_offsets`, written in the same
transaction as each batch, so they are exactly what the store holds).

A backend plugs in by implementing `LagSource`: the embedded log knows each record's
ingest time (`ingest_time_ms`); the Kafka log answers end offsets from the brokers' watermarks
and the ingest time from the record's timestamp (the broker's append time on the LogAppendTime
topics Sketchboard creates). A backend answering None for ingest times gets lag in seconds
interpolated from the sampler's own (offset, time) samples, as kafka-lag-exporter does.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ingest.log.base import EventLog, PartitionOffsets


@runtime_checkable
class LagSource(Protocol):
    def end_offsets(self, stream: str) -> Mapping[int, PartitionOffsets]:
        """Start (earliest retained) and end (next to be written) offset per partition."""

    def ingest_time_ms(self, stream: str, partition: int, offset: int) -> int | None:
        """When the record at `offset` was appended, or None when the backend cannot tell."""


class EventLogLagSource:
    """Any `EventLog` (the embedded log and Kafka answer ingest times exactly)."""

    def __init__(self, log: EventLog):
        self.log = log

    def end_offsets(self, stream: str) -> Mapping[int, PartitionOffsets]:
        return self.log.offsets(stream)

    def ingest_time_ms(self, stream: str, partition: int, offset: int) -> int | None:
        return self.log.ingest_time_ms(stream, partition, offset)


@dataclass(frozen=True)
class Committed:
    offsets: Mapping[str, Mapping[int, int]]  # stream -> partition -> end offset (exclusive)
    last_commit_ms: int | None


class CommittedReader(Protocol):
    def committed(self) -> Committed: ...


def with_start(committed: Mapping[str, Mapping[int, int]],
               start: Mapping[str, Mapping[int, int]]) -> dict[str, dict[int, int]]:
    """Committed offsets, and where a partition has none yet, where the pipeline's first run
    started (its pinned start): a pipeline started from the log's end that has read nothing new
    is caught up there, not behind by the whole log before its start."""
    out = {stream: dict(parts) for stream, parts in start.items()}
    for stream, parts in committed.items():
        out.setdefault(stream, {}).update(parts)
    return out


class StoreCommitted:
    """The committed offsets of a pipeline from the pane store (`PaneStore.progress`); before it
    commits a partition, its recorded start there (`registry`: store.consumers.ConsumerRegistry)."""

    def __init__(self, store, pipeline: str, registry=None):
        self.store = store
        self.pipeline = pipeline
        self.registry = registry

    def committed(self) -> Committed:
        progress = self.store.progress(self.pipeline, row_counts=False)
        start = self.registry.starts(self.pipeline) if self.registry is not None else {}
        return Committed(with_start(progress.end_offsets, start), progress.last_commit_ms)


class OffsetTimeTable:
    """kafka-lag-exporter's interpolation for backends without ingest times: remember when the
    log end was at which offset (one point per sample, bounded), and estimate when the record
    at an offset was written by linear interpolation between the two points around it.

    Pure: the times are the sample times given to `add`."""

    def __init__(self, capacity: int = 64):
        self.points: deque[tuple[int, int]] = deque(maxlen=capacity)  # (log end offset, at_ms), rising

    def add(self, log_end: int, at_ms: int) -> None:
        if self.points and log_end <= self.points[-1][0]:
            # No new records since the last point: keep the earliest time the end was there.
            if log_end < self.points[-1][0]:  # the log went back (replaced): start over
                self.points.clear()
                self.points.append((log_end, at_ms))
            return
        self.points.append((log_end, at_ms))

    def written_at_ms(self, offset: int) -> int | None:
        """Estimated time the record at `offset` was written; None with no points. Past the
        oldest point it is the oldest point's time (a lower bound on the lag)."""
        if not self.points:
            return None
        offsets = [p[0] for p in self.points]
        # The record at `offset` exists once the end passed it: find the first end > offset.
        i = bisect.bisect_right(offsets, offset)
        if i == 0:
            return self.points[0][1]
        if i == len(offsets):
            return self.points[-1][1]  # not written yet as far as we know: no lag in time
        (o0, t0), (o1, t1) = self.points[i - 1], self.points[i]
        return round(t0 + (offset - o0 + 1) / (o1 - o0) * (t1 - t0))

    def lag_ms(self, position: int, log_end: int, now_ms: int) -> int | None:
        if position >= log_end:
            return 0
        written = self.written_at_ms(position)
        return None if written is None else max(0, now_ms - written)


class RegistryCommitted:
    """The committed offsets of a named pipeline other than the serving one, as it copies them
    into the consumer registry after each commit (store/consumers.py); before it commits a
    partition, its recorded start there."""

    def __init__(self, registry, pipeline: str):
        self.registry = registry
        self.pipeline = pipeline

    def committed(self) -> Committed:
        last = next((c.last_commit_ms for c in self.registry.consumers() if c.pipeline == self.pipeline), None)
        return Committed(with_start(self.registry.offsets(self.pipeline), self.registry.starts(self.pipeline)), last)


def registry_committed(registry) -> dict[str, Committed]:
    """`RegistryCommitted(registry, name).committed()` of every consumer in the registry, in three
    queries for them all: the sampler reads every consumer each round, and three queries per
    consumer (one listing them all, to find its commit time) made a round at 400 consumers cost
    most of a second."""
    consumers = registry.consumers()
    offsets, starts = registry.all_offsets(), registry.all_starts()
    return {c.pipeline: Committed(with_start(offsets.get(c.pipeline, {}), starts.get(c.pipeline, {})),
                                  c.last_commit_ms) for c in consumers}


@dataclass(frozen=True)
class ReadCommitted:
    """A `CommittedReader` of offsets already read (`registry_committed`'s, for this round)."""

    read: Committed

    def committed(self) -> Committed:
        return self.read

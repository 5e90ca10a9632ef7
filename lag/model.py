"""Lag samples and statuses. A leaf module: plain dataclasses, no I/O, no project imports."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class LagStatus(str, Enum):
    """Burrow's partition statuses, plus ERR for "cannot be evaluated"."""

    OK = "OK"
    WARN = "WARN"  # lag growing while the pipeline moves
    STALL = "STALL"  # committed offset not moving while lag > 0, though the pipeline commits
    STOP = "STOP"  # no commits for longer than the window while lag > 0
    REWIND = "REWIND"  # committed offset went backwards
    ERR = "ERR"  # the samples cannot be evaluated

    @property
    def severity(self) -> int:
        """Roll-ups show the worst: OK < WARN < STALL < STOP < REWIND < ERR."""
        return _SEVERITY[self]


_SEVERITY = {s: i for i, s in enumerate(LagStatus)}


@dataclass(frozen=True)
class LagSample:
    """One partition at one instant: the log's offsets and the pipeline's committed offset.

    committed is the pipeline's stored end offset (exclusive) for the partition, None before
    its first commit; last_commit_ms is when the pipeline last committed any batch (None:
    never). lag_ms is the age of the oldest record not yet processed (0 when caught up, None
    when unknown)."""

    pipeline: str
    stream: str
    partition: int
    at_ms: int
    log_start: int
    log_end: int
    committed: int | None
    last_commit_ms: int | None = None
    lag_ms: int | None = None

    @property
    def position(self) -> int:
        """The next offset the pipeline will read: its committed offset, or the log start
        when it has none or retention dropped records it never read."""
        return max(self.log_start, self.committed if self.committed is not None else self.log_start)

    @property
    def lag_events(self) -> int:
        return max(0, self.log_end - self.position)

    @property
    def lag_seconds(self) -> float | None:
        return None if self.lag_ms is None else round(self.lag_ms / 1000, 3)


@dataclass(frozen=True)
class Verdict:
    status: LagStatus
    reason: str


@dataclass(frozen=True)
class PartitionLag:
    stream: str
    partition: int
    verdict: Verdict
    latest: LagSample | None  # the newest sample, None when there is none

    @property
    def lag_events(self) -> int:
        return self.latest.lag_events if self.latest else 0

    @property
    def lag_seconds(self) -> float | None:
        return self.latest.lag_seconds if self.latest else None

    def to_json(self) -> dict:
        s = self.latest
        return {
            "log_end": s.log_end if s else None,
            "committed": s.committed if s else None,
            "lag_events": self.lag_events,
            "lag_seconds": self.lag_seconds,
            "status": self.verdict.status.value,
            "reason": self.verdict.reason,
        }


@dataclass(frozen=True)
class StreamLag:
    stream: str
    verdict: Verdict
    partitions: dict[int, PartitionLag] = field(default_factory=dict)

    @property
    def lag_events(self) -> int:
        return sum(p.lag_events for p in self.partitions.values())

    @property
    def lag_seconds(self) -> float | None:
        """The oldest unprocessed record of the stream: the largest partition lag in seconds."""
        return _max_or_none(p.lag_seconds for p in self.partitions.values())

    def to_json(self) -> dict:
        return {
            "status": self.verdict.status.value,
            "reason": self.verdict.reason,
            "lag_events": self.lag_events,
            "lag_seconds": self.lag_seconds,
            "partitions": {str(p): part.to_json() for p, part in sorted(self.partitions.items())},
        }


@dataclass(frozen=True)
class PipelineLag:
    pipeline: str
    at_ms: int
    verdict: Verdict
    streams: dict[str, StreamLag] = field(default_factory=dict)

    @property
    def lag_events(self) -> int:
        return sum(s.lag_events for s in self.streams.values())

    @property
    def lag_seconds(self) -> float | None:
        return _max_or_none(s.lag_seconds for s in self.streams.values())

    def to_message(self) -> dict:
        """The websocket `lag` message of coordination.md (also the body of GET /api/v1/lag)."""
        return {
            "type": "lag",
            "at_ms": self.at_ms,
            "pipeline": self.pipeline,
            "status": self.verdict.status.value,
            "reason": self.verdict.reason,
            "lag_events": self.lag_events,
            "lag_seconds": self.lag_seconds,
            "streams": {name: s.to_json() for name, s in sorted(self.streams.items())},
        }


def _max_or_none(values) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None

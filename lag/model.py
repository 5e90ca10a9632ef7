"""Lag verdicts and reports per partition, stream and pipeline: plain dataclasses, no I/O.
The samples and statuses they are built from live with the sample store (store/lag.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from store.lag import LagSample, LagStatus


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
        """The websocket `lag` message (also the body of GET /api/v1/lag)."""
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

"""What the matcher reads (an event of one key) and what it writes (a match)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class PatternEvent:
    """One event of a pattern's stream, by its place in the log and its event time (epoch ms)."""

    stream: str
    partition: int
    offset: int
    time: int
    key: str
    fields: Mapping[str, Any] = field(default_factory=dict)

    @property
    def order(self) -> tuple[int, str, int, int]:
        """The order events of one key are matched in: event time, ties broken by their place in
        the log, so a replay matches the same way."""
        return (self.time, self.stream, self.partition, self.offset)


@dataclass(frozen=True)
class MatchedEvent:
    step: str
    stream: str
    partition: int
    offset: int
    time: int

    def to_json(self) -> dict:
        return {"step": self.step, "stream": self.stream, "partition": self.partition, "offset": self.offset,
                "time": self.time}


@dataclass(frozen=True)
class Match:
    """A complete match: its events in order, each with the step it matched, and its measures.
    decided_at: the event time at which it was decided (its last event's, or for an absence
    pattern the deadline the watermark passed)."""

    pattern: str
    key: str
    events: tuple[MatchedEvent, ...]
    measures: dict[str, float | int]
    decided_at: int
    # The match's dimensions (the plan's, read from the first event of their step; absent when
    # that step took none or the event had no value), and whether it was published flagged late
    # (a late event brought it: the pipeline sets it, the matcher decides in order only).
    dims: Mapping[str, str] = field(default_factory=dict)
    late: bool = False

    def by_step(self) -> dict[str, list[MatchedEvent]]:
        out: dict[str, list[MatchedEvent]] = {}
        for event in self.events:
            out.setdefault(event.step, []).append(event)
        return out

    def to_json(self) -> dict:
        return {"pattern": self.pattern, "key": self.key, "events": [e.to_json() for e in self.events],
                "measures": dict(self.measures), "decided_at": self.decided_at, "dims": dict(self.dims),
                "late": self.late}

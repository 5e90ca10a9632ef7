"""What evaluating a rule's query yields, before any state is applied; and what the
evaluator needs to read (`AlertData`). Pure types, no I/O."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Sample:
    """One instance's reading: `condition` None means this instance has no data."""

    group: dict[str, str]  # labels the instance adds to the rule's (group-by dimensions, stream)
    value: float | str | None
    condition: bool | None
    window_start_ms: int | None = None
    window_end_ms: int | None = None
    revision: int | None = None  # highest pane revision in the window the value came from
    reason: str | None = None  # why there is no data, or what the value is
    details: dict[str, str] = field(default_factory=dict)  # annotations the data adds (a match's events)
    # The data withdrew what fired the instance (a retracted match): it resolves at once, whatever
    # keep_firing_for says, and is not deleted (its firing stays in the history).
    withdrawn: bool = False

    def __post_init__(self) -> None:
        # A value past a double (a trend's ratio of 1e290 to 1e-300) cannot be stored or answered
        # as JSON (a 500 for the listing and a broken alerts feed): no data, with the reason.
        if isinstance(self.value, float) and not math.isfinite(self.value):
            object.__setattr__(self, "reason", f"the value is {self.value}, not a finite number")
            object.__setattr__(self, "value", None)
            object.__setattr__(self, "condition", None)


@dataclass(frozen=True)
class Outcome:
    """All samples of one evaluation; or the rule as a whole has no data, or failed."""

    samples: list[Sample] = field(default_factory=list)
    no_data: str | None = None
    error: str | None = None
    cursor: int | None = None  # pattern rules: the last match id read (None: unchanged)
    # The metric window this evaluation read (threshold and trend rules, once they chose one):
    # what an instance without a sample of its own (its group gone, the whole rule without data)
    # was decided on, so its history entry names it and counts the corrections to it.
    window_start_ms: int | None = None
    window_end_ms: int | None = None

    @classmethod
    def nodata(cls, reason: str, window: tuple[int, int] | None = None) -> Outcome:
        start, end = window if window is not None else (None, None)
        return cls(no_data=reason, window_start_ms=start, window_end_ms=end)

    @classmethod
    def failed(cls, reason: str) -> Outcome:
        return cls(error=reason)


@dataclass(frozen=True)
class WindowValue:
    group: dict[str, str]
    value: float | None  # None: the stat is undefined (e.g. p99 of no events)
    revision: int  # highest pane revision in the window


@dataclass(frozen=True)
class PatternMatch:
    """One stored match of a pattern, as a `pattern` rule reads it."""

    id: int  # ascending in the order matches were committed
    key: str
    decided_at_ms: int
    events: list[dict]  # {step, stream, partition, offset, time}
    measures: dict
    late: bool = False
    retracts: int | None = None  # a retraction: the id of the match a late event broke
    dims: dict = field(default_factory=dict)  # the match's dimensions (those of <pattern>_matches)


@dataclass(frozen=True)
class StreamLagView:
    status: str  # OK, WARN, STALL, STOP, REWIND, ERR
    reason: str
    lag_seconds: float | None


class AlertData(Protocol):
    """What rules read; the store-backed implementation is alerts.source.StoreAlertData."""

    def watermark(self, stream: str) -> int | None: ...

    def window_values(self, metric: str, stat: str, start_ms: int, end_ms: int,
                      group_by: Sequence[str], filters: Mapping[str, str], *, now_ms: int) -> list[WindowValue]:
        """The stat over the one window [start_ms, end_ms), one value per group with events, read
        from rows retention keeps at now_ms as a REST query is; an error (raised) where retention
        has dropped rows the window needs."""

    def last_seen(self, stream: str, start_ms: int, end_ms: int, group_by: Sequence[str],
                  filters: Mapping[str, str]) -> dict[tuple[str, ...], int]:
        """Per group (values in group_by order): the end of its newest pane with events in the range."""

    def lag(self) -> dict[str, StreamLagView] | None:
        """Consumer lag per stream; None where lag is not monitored in this process."""

    def dead_letter_counts(self, start_ms: int, end_ms: int) -> dict[str, int]:
        """Dead letters per stream written in [start_ms, end_ms)."""

    def pattern_matches(self, pattern: str, after_id: int, limit: int) -> list[PatternMatch]:
        """The pattern's matches with an id above `after_id`, by id, at most `limit`."""

    def newest_match_id(self, pattern: str) -> int | None:
        """The id of the pattern's newest match; None when it has none."""

    def corrections_after(self, stream: str, start_ms: int, end_ms: int, after_ms: int,
                          dims: Mapping[str, str] | None = None) -> int:
        """Corrections published after `after_ms` to panes of the stream starting in [start_ms, end_ms)
        whose dimensions have the values `dims` gives (those of the rule's filters and the entry's group)."""

"""Alert states and what one evaluation hands to notifiers: the vocabulary shared by the
evaluator, the store, the API, the websocket feed and the notifiers (no I/O here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class AlertState(str, Enum):
    """Grafana's alert instance states, spelled in lower case. Normal -> Pending -> Firing ->
    Resolved (for one evaluation, then Normal); NoData and Error are states of their own so
    that missing or broken data never reads as Normal."""

    NORMAL = "normal"
    PENDING = "pending"
    FIRING = "firing"
    RESOLVED = "resolved"
    NODATA = "nodata"
    ERROR = "error"

    @property
    def active(self) -> bool:
        """Listed under "active" in GET /api/v1/alerts."""
        return self in (AlertState.PENDING, AlertState.FIRING, AlertState.NODATA, AlertState.ERROR)

    @property
    def notifies_firing(self) -> bool:
        """Sent to notifiers as status "firing" (an alert a human should look at)."""
        return self in (AlertState.FIRING, AlertState.NODATA, AlertState.ERROR)


@dataclass(frozen=True)
class Notice:
    """One alert instance as notifiers see it after an evaluation (Alertmanager's alert):
    `status` "firing" while the instance is firing/nodata/error, "resolved" once, on the
    evaluation where it stopped. `ends_at_ms` is set on resolved notices only."""

    rule: str
    fingerprint: str  # stable id of (rule, labels)
    status: str  # "firing" | "resolved"
    state: AlertState  # firing, nodata or error while firing; the new state when resolved
    labels: dict[str, str]  # alertname=<rule>, the rule's labels, the group's dimensions
    annotations: dict[str, str]  # templated with the value
    starts_at_ms: int
    ends_at_ms: int | None = None
    value: float | None = None


@dataclass(frozen=True)
class RuleNotices:
    """What one evaluation of one rule hands to the notifiers: every instance firing now plus
    those resolved by this evaluation (a notifier groups them into one message per rule and
    deduplicates repeats). `silenced`: the rule is silenced; notify nothing, remember nothing."""

    rule: str
    at_ms: int
    notices: list[Notice] = field(default_factory=list)
    silenced: bool = False

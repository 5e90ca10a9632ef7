"""The state machine of one alert instance, Prometheus' and Grafana's semantics. Pure.

    condition true:   Normal/Resolved/NoData/Error -> Pending (-> Firing at once when `for` is 0)
                      Pending -> Firing once it has been pending for `for`
    condition false:  Pending -> Normal; Firing -> Resolved, unless it was true less than
                      `keep_firing_for` ago (then it keeps firing); Resolved/NoData/Error -> Normal
    no data / error:  -> NoData / Error at once (or read as true, with no_data_state/error_state "firing")

A NoData/Error spell that follows Firing is still the same incident (the receiver has been
told "firing" throughout: NoData and Error notify as firing). It keeps `fired_at_ms` and
`active_since_ms`, and when the data comes back the instance continues as if it had stayed
Firing: true -> Firing again (no new `for`, no resolution, no new notice), false -> Resolved
or kept firing per `keep_firing_for`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum

from alerts.states import AlertState


class Reading(str, Enum):
    TRUE = "true"
    FALSE = "false"
    NODATA = "nodata"
    ERROR = "error"


@dataclass(frozen=True)
class Instance:
    """One alert instance (a rule and one set of labels) as stored between evaluations."""

    rule: str
    fingerprint: str
    labels: dict[str, str]
    state: AlertState
    last_eval_ms: int
    active_since_ms: int | None = None  # when the current pending/firing/nodata/error spell began
    fired_at_ms: int | None = None
    last_true_ms: int | None = None  # the last evaluation with the condition true (keep_firing_for)
    value: float | str | None = None
    annotations: dict[str, str] = field(default_factory=dict)
    window_start_ms: int | None = None
    window_end_ms: int | None = None
    revision: int | None = None
    reason: str | None = None
    details: dict[str, str] = field(default_factory=dict)  # annotations from the data (a match's events)


def step(prev: Instance | None, reading: Reading, *, rule: str, fingerprint: str, labels: dict[str, str],
         now_ms: int, for_ms: int, keep_firing_for_ms: int) -> Instance:
    """The instance after one evaluation (value, window and annotations are set by the caller)."""
    was = prev.state if prev is not None else AlertState.NORMAL
    base = prev if prev is not None else Instance(rule, fingerprint, labels, AlertState.NORMAL, now_ms)
    base = replace(base, labels=labels, last_eval_ms=now_ms)

    fired = _has_fired(prev)
    if reading in (Reading.NODATA, Reading.ERROR):
        target = AlertState.NODATA if reading is Reading.NODATA else AlertState.ERROR
        if fired:  # the receiver still knows it as firing: the same incident goes on
            return replace(base, state=target)
        since = base.active_since_ms if was is target else now_ms
        return replace(base, state=target, active_since_ms=since, fired_at_ms=None)

    if reading is Reading.TRUE:
        if fired:
            return replace(base, state=AlertState.FIRING, last_true_ms=now_ms)
        since = base.active_since_ms if was is AlertState.PENDING else now_ms
        if now_ms - since >= for_ms:
            return replace(base, state=AlertState.FIRING, active_since_ms=since, fired_at_ms=now_ms,
                           last_true_ms=now_ms)
        return replace(base, state=AlertState.PENDING, active_since_ms=since, fired_at_ms=None, last_true_ms=now_ms)

    # The condition is false (or the instance's series is gone).
    if fired:
        if keep_firing_for_ms and base.last_true_ms is not None and now_ms - base.last_true_ms < keep_firing_for_ms:
            return replace(base, state=AlertState.FIRING)
        return replace(base, state=AlertState.RESOLVED)
    return replace(base, state=AlertState.NORMAL, active_since_ms=None, fired_at_ms=None)


def _has_fired(prev: Instance | None) -> bool:
    """Firing, or in a NoData/Error spell that interrupted firing (a gap in the data is not
    a resolution: the spell ends only on a false condition, after `keep_firing_for`)."""
    if prev is None:
        return False
    if prev.state is AlertState.FIRING:
        return True
    return prev.state in (AlertState.NODATA, AlertState.ERROR) and prev.fired_at_ms is not None

"""What a notifier sends for one rule's evaluation, given what it last delivered: Alertmanager's
grouping and deduplication as pure functions (no clock, no I/O), so that they can be tested
with plain numbers and so that the webhook's worker thread only does the sending.

A rule's instances form one group and one message. Per group the notifier remembers the
firing notices it last delivered and when (`GroupMemory`). `plan()` decides:

- send when the set of (fingerprint, status) differs from what was last delivered: a new
  instance fires, or a delivered one resolved; the message carries the whole group;
- send again when `repeat_interval_s` has passed and something still fires;
- a resolved notice goes out only if its firing went out (else the receiver never heard of
  it), and is then forgotten;
- an instance whose firing was delivered but that is neither firing nor resolved now (it
  resolved while the rule was silenced, or its resolution was coalesced away) is sent as
  resolved, so the receiver's incident closes;
- a silenced evaluation sends nothing and changes nothing remembered.

The caller updates its memory to `Plan.remember` only once the send succeeded: a failed
delivery leaves the old memory, so the next evaluation plans the same message again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from enum import Enum

from alerts.states import AlertState, Notice, RuleNotices

FIRING = "firing"
RESOLVED = "resolved"


@dataclass(frozen=True)
class GroupMemory:
    """One rule's last delivered message: its firing notices by fingerprint, and when."""

    firing: Mapping[str, Notice]
    sent_at: float  # the notifier's clock (seconds)


class Why(str, Enum):
    """Why a plan sends or not (logs and counters)."""

    NEW = "new"  # something fires that the receiver has not been told about
    RESOLVED = "resolved"  # an instance the receiver knows as firing stopped
    REPEAT = "repeat"  # unchanged, but repeat_interval passed while firing
    DUPLICATE = "duplicate"  # unchanged since the last delivery: nothing to send
    QUIET = "quiet"  # nothing fires and nothing the receiver knows resolved
    SILENCED = "silenced"


@dataclass(frozen=True)
class Plan:
    """The message to send for one rule (`alerts` empty: send nothing), and the group memory
    to keep once it is delivered (None: forget the group)."""

    rule: str
    why: Why
    alerts: tuple[Notice, ...] = ()
    remember: GroupMemory | None = None

    @property
    def send(self) -> bool:
        return bool(self.alerts)


def plan(batch: RuleNotices, last: GroupMemory | None, now: float, repeat_interval_s: float) -> Plan:
    """Decide what to send for `batch`, given `last` (what was last delivered for this rule,
    None if nothing is remembered) at time `now` (same clock as `GroupMemory.sent_at`)."""
    if batch.silenced:
        return Plan(batch.rule, Why.SILENCED, remember=last)

    known = dict(last.firing) if last is not None else {}
    firing = {n.fingerprint: n for n in batch.notices if n.status == FIRING}
    # A resolved notice whose fingerprint fires again in the same batch is stale (coalesced).
    resolved = {n.fingerprint: _ended(n, batch.at_ms) for n in batch.notices
                if n.status == RESOLVED and n.fingerprint in known and n.fingerprint not in firing}
    for fp, was in known.items():
        if fp not in firing and fp not in resolved:
            resolved[fp] = _vanished(was, batch.at_ms)

    remember = GroupMemory(firing, now) if firing else None
    alerts = (*_ordered(firing), *_ordered(resolved))
    if firing.keys() - known.keys():
        return Plan(batch.rule, Why.NEW, alerts, remember)
    if resolved:
        return Plan(batch.rule, Why.RESOLVED, alerts, remember)
    if not firing:
        return Plan(batch.rule, Why.QUIET, remember=last)
    if last is not None and now - last.sent_at >= repeat_interval_s:
        return Plan(batch.rule, Why.REPEAT, alerts, remember)
    return Plan(batch.rule, Why.DUPLICATE, remember=last)


def memory_json(memory: GroupMemory) -> dict:
    """What a notifier keeps across restarts (store/alerts.py saves it as a JSON document)."""
    return {"sent_at": memory.sent_at,
            "firing": {fp: {**asdict(n), "state": n.state.value} for fp, n in memory.firing.items()}}


def memory_from_json(data: Mapping) -> GroupMemory:
    firing = {fp: Notice(**{**n, "state": AlertState(n["state"])}) for fp, n in data["firing"].items()}
    return GroupMemory(firing, float(data["sent_at"]))


def coalesce(older: RuleNotices, newer: RuleNotices) -> RuleNotices:
    """One batch standing for two evaluations of a rule that queued up before either was sent:
    the newer wins, but the older's resolved notices for instances the newer does not mention
    are kept (a resolution is reported once only, and dropping it would lose its end time)."""
    mentioned = {n.fingerprint for n in newer.notices}
    carried = [n for n in older.notices if n.status == RESOLVED and n.fingerprint not in mentioned]
    if not carried:
        return newer
    return replace(newer, notices=[*newer.notices, *carried])


def with_undelivered(batch: RuleNotices, last: GroupMemory | None,
                     undelivered: Mapping[str, Notice]) -> list[RuleNotices]:
    """The batches to plan, in order, for `batch`, given the resolved notices of an earlier message
    that was given up on (`undelivered`, by fingerprint). They go with `batch` for instances it does
    not report firing, so that a resolution keeps its end time rather than taking this evaluation's
    (and it wins over a resolved notice of the same instance in `batch`, which is later). An
    instance that fires again meanwhile, as a new incident (another startsAt than the resolution's),
    is first resolved, in a message of its own (one message holds one status per instance), and
    then sent as firing by planning `batch`. (A startsAt that changes without a resolution, as when
    a nodata spell turns into firing, stays one incident to the receiver, as before.)"""
    firing = {n.fingerprint: n for n in batch.notices if n.status == FIRING}
    carried = {fp: n for fp, n in undelivered.items() if fp not in firing}
    merged = batch if not carried else replace(
        batch, notices=[*(n for n in batch.notices if n.fingerprint not in carried), *carried.values()])
    known = last.firing if last is not None else {}
    ends = {fp: n for fp, n in undelivered.items()
            if fp in firing and fp in known and n.starts_at_ms != firing[fp].starts_at_ms}
    if batch.silenced or not ends:
        return [merged]
    first = replace(merged, notices=[*(n for n in merged.notices if n.fingerprint not in ends), *ends.values()])
    return [first, merged]


def _ended(n: Notice, at_ms: int) -> Notice:
    # A resolved notice should carry its end; if one does not, it ended at this evaluation.
    return n if n.ends_at_ms is not None else replace(n, ends_at_ms=at_ms)


def _vanished(was: Notice, at_ms: int) -> Notice:
    return replace(was, status=RESOLVED, state=AlertState.RESOLVED, ends_at_ms=at_ms)


def _ordered(notices: Mapping[str, Notice]) -> list[Notice]:
    # Stable order so that identical groups give identical bodies.
    return sorted(notices.values(), key=lambda n: (n.starts_at_ms, n.fingerprint))

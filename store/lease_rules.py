"""Who leads: the decisions of a lease that several API replicas contend for, as pure logic
(time injected, no I/O). The lease row (store/lease.py) holds a holder, a version that every
write bumps, and an epoch that every change of holder bumps; writes are compare-and-set on
the version, so of two replicas deciding at once only one wins.

Expiry is judged on each replica's own monotonic clock, never by comparing timestamps from
different machines (as Kubernetes' leader election does): a follower takes over only when it
has seen the row unchanged for a whole `ttl`, counted from when *it* first saw that version;
the holder counts its leadership from *before* its last successful write, and gives it up a
`margin` before that ttl is out (as Kubernetes' renew deadline comes before its lease
duration). The holder's write committed before any follower could see it, so the holder stops
leading before any follower may start: at most one leader at a time, whatever the wall clocks
say, as long as clocks run at the same rate; the margin is the time the holder's own threads
have to stop its work (a thread of a loaded machine wakes late) before a follower may start it.

A clock that goes backwards (it should not: callers pass time.monotonic) is met
conservatively: a follower restarts its wait, a holder stops leading until its next write.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from enum import Enum

# A holder is `<replica id>/<nonce>`: the nonce is new in every process, so two processes given
# the same replica id (a copied SKETCHBOARD_REPLICA_ID, `docker compose up --scale`) are two
# holders, and a restarted process is a new one. A row written before nonces (a rolling upgrade)
# holds the replica id alone.
_NONCE = re.compile(r"/[0-9a-f]{12}\Z")


def new_holder(replica: str) -> str:
    """This process's holder name: its replica id and a nonce of its own."""
    return f"{replica}/{secrets.token_hex(6)}"


def replica_of(holder: str | None) -> str | None:
    """The replica id of a holder (a row of the old format is its replica id already)."""
    if holder is None or _NONCE.search(holder) is None:
        return holder
    return holder[:-13]


@dataclass(frozen=True)
class LeaseRecord:
    """The stored row: holder None when nobody holds it (never taken, or released)."""

    holder: str | None
    version: int = 0
    epoch: int = 0


class Action(str, Enum):
    RENEW = "renew"  # I hold it: write again to keep it
    ACQUIRE = "acquire"  # free or expired: write myself in (a new epoch)
    FOLLOW = "follow"  # someone else holds it and it has not expired for me


@dataclass(frozen=True)
class Step:
    action: Action
    write: LeaseRecord | None  # the row to compare-and-set over the one read (None: write nothing)
    started: float  # the time the decision was made (a write's leadership counts from here)


class LeaseTracker:
    """One replica's view of the lease. Call `step(read_record, now)` each renew interval,
    perform `Step.write` as a compare-and-set against the record read, then `done(step, won)`;
    `leading(now)` says whether this replica may act as the leader right now."""

    def __init__(self, me: str, ttl: float, margin: float = 0.0):
        if ttl <= 0:
            raise ValueError(f"lease ttl must be positive, got {ttl}")
        if not 0 <= margin < ttl:
            raise ValueError(f"lease margin must be in [0, ttl = {ttl}), got {margin}")
        self.me = me
        self.ttl = ttl
        self.margin = margin  # the holder leads until ttl - margin after its write's start; followers wait ttl
        self.record: LeaseRecord | None = None  # the last record read or written
        self._seen_at: float | None = None  # when this version was first seen (followers' expiry clock)
        self._led_from: float | None = None  # start of the step whose write is the holder's latest
        self._last_now: float | None = None

    def step(self, record: LeaseRecord, now: float) -> Step:
        if self._last_now is not None and now < self._last_now:
            self._led_from = None  # the clock went back: lead again only after a fresh write
            self._seen_at = now  # and wait a whole ttl again before taking over
        self._last_now = now
        if self.record is None or (record.holder, record.version) != (self.record.holder, self.record.version):
            self.record, self._seen_at = record, now
        if record.holder == self.me:
            # Mine (a renewal, or my own row after my leadership lapsed: nobody wrote it since, so nobody led).
            return Step(Action.RENEW, LeaseRecord(self.me, record.version + 1, record.epoch), now)
        self._led_from = None  # someone else's or nobody's: I do not lead
        expired = record.holder is None or now - self._seen_at >= self.ttl
        if expired:
            return Step(Action.ACQUIRE, LeaseRecord(self.me, record.version + 1, record.epoch + 1), now)
        return Step(Action.FOLLOW, None, now)

    def done(self, step: Step, won: bool) -> None:
        """The compare-and-set of `step.write` succeeded (won) or found the row changed."""
        if step.write is None:
            return
        if won:
            self.record, self._seen_at, self._led_from = step.write, step.started, step.started
        else:
            self._led_from = None  # someone else wrote first; the next step reads who

    def leading(self, now: float) -> bool:
        return self._led_from is not None and self._led_from <= now < self._led_from + self.ttl - self.margin

    def leader_until(self) -> float | None:
        """Until when this replica leads without another successful write (None: it does not)."""
        return None if self._led_from is None else self._led_from + self.ttl - self.margin

    def release(self) -> LeaseRecord | None:
        """The row to write (compare-and-set) to hand the lease over at once on shutdown, when mine."""
        self._led_from = None
        if self.record is None or self.record.holder != self.me:
            return None
        return LeaseRecord(None, self.record.version + 1, self.record.epoch)

"""The leader lease several API replicas share: a row per lease name beside the panes (the
store's SQLite file with its own connection, or the PostgreSQL store's schema:
store.connection.Db), and the thread that keeps it.

Why a lease row rather than a PostgreSQL advisory lock: one implementation serves both
backends (several API processes may share one SQLite file too); the row is what an operator
reads to see who leads; it is per store schema (advisory-lock keys are per database, shared
by every schema in it); and the holder learns it lost the lease from its own clock, without
needing a connection that stays open (an advisory lock held by a session the network cut
stays held until the server notices, often minutes). Decisions are store/lease_rules.py's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from store.connection import Db, SideStore
from store.lease_rules import Action, LeaseRecord, LeaseTracker, new_holder, replica_of

log = logging.getLogger("sketchboard.lease")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY,
    holder TEXT,                     -- NULL: nobody (never taken, or released)
    version INTEGER NOT NULL,        -- bumped by every write: writes compare-and-set on it
    epoch INTEGER NOT NULL,          -- bumped by every change of holder
    ttl_ms INTEGER,                  -- the holder's lease time (for operators)
    renewed_at_ms INTEGER,           -- the holder's wall clock at its last write (for operators)
    acquired_at_ms INTEGER           -- the holder's wall clock when it took the lease
);
"""


@dataclass(frozen=True)
class LeaseRow:
    """A lease as stored, with what operators read."""

    name: str
    record: LeaseRecord
    ttl_ms: int | None
    renewed_at_ms: int | None
    acquired_at_ms: int | None


class LeaseStore(SideStore):
    def __init__(self, path: str | Path | Db, *, synchronous: str = "NORMAL", busy_timeout_s: float = 30.0):
        super().__init__(path, _SCHEMA, synchronous=synchronous, busy_timeout_s=busy_timeout_s)

    def read(self, name: str) -> LeaseRow:
        """The lease's row; a lease never taken reads as free at version 0."""
        with self._lock:
            row = self._conn.execute("SELECT holder, version, epoch, ttl_ms, renewed_at_ms, acquired_at_ms"
                                     " FROM leases WHERE name = ?", (name,)).fetchone()
        if row is None:
            return LeaseRow(name, LeaseRecord(None, 0, 0), None, None, None)
        return LeaseRow(name, LeaseRecord(row[0], row[1], row[2]), row[3], row[4], row[5])

    def swap(self, name: str, expected: LeaseRecord, new: LeaseRecord, *, ttl_ms: int, now_ms: int) -> bool:
        """Write `new` if the row is still at `expected.version` (compare-and-set); True when written.
        The row is created (at version 0) the first time, by whoever gets there first."""
        acquired = new.holder is not None and new.epoch != expected.epoch
        with self._lock, self._conn.transaction() as db:
            db.execute("INSERT INTO leases (name, holder, version, epoch) VALUES (?, NULL, 0, 0)"
                       " ON CONFLICT (name) DO NOTHING", (name,))
            written = db.execute(
                "UPDATE leases SET holder = ?, version = ?, epoch = ?, ttl_ms = ?, renewed_at_ms = ?,"
                " acquired_at_ms = CASE WHEN ? = 1 THEN ? ELSE acquired_at_ms END"
                " WHERE name = ? AND version = ?",
                (new.holder, new.version, new.epoch, ttl_ms if new.holder else None,
                 now_ms if new.holder else None, 1 if acquired else 0, now_ms, name, expected.version)).rowcount
        return written == 1


class Leadership:
    """Keeps one lease from a background thread: every `renew_s` it reads the row, decides
    (store/lease_rules.py), writes; `on_gain()` runs when this replica becomes the leader and
    `on_lose()` when it stops being one (lost the race, could not renew in time, or stopped).
    One at a time, on this thread, except that a watchdog thread runs `on_lose()` as soon as the
    leadership lapses (`leader_until()`) while a renewal is still blocked in the store (a write
    lock held by a long commit): the jobs stop on time, whatever the store I/O does, before any
    other replica may take over."""

    def __init__(self, store: LeaseStore, name: str, me: str, *, ttl_s: float, renew_s: float | None = None,
                 on_gain: Callable[[], None] = lambda: None, on_lose: Callable[[], None] = lambda: None,
                 monotonic: Callable[[], float] = time.monotonic, clock: Callable[[], float] = time.time):
        self.store = store
        self.name = name
        self.me = me  # the replica id (status, metrics)
        # What this process writes as the holder: the replica id and a nonce of this process's, so
        # two processes with one replica id never take each other's row for their own.
        self.holder_id = new_holder(me)
        self.ttl_s = ttl_s
        # Several writes per ttl: a slow or failed write or two does not lose the lease.
        self.renew_s = renew_s if renew_s is not None else ttl_s / 5
        if not 0 < self.renew_s < ttl_s:
            raise ValueError(f"lease renew interval must be in (0, ttl = {ttl_s} s), got {self.renew_s}")
        # Leads until a margin before the ttl is out (a renew interval, at most half the time between
        # a renewal and the ttl's end, so renewals on time keep it leading without a break): the
        # watchdog stops the leader's work by then, before any follower may take over, even when its
        # thread wakes late on a loaded machine (with no margin it woke after the follower's on_gain).
        self.tracker = LeaseTracker(self.holder_id, ttl_s, margin=min(self.renew_s, (ttl_s - self.renew_s) / 2))
        self._twin_warned: str | None = None
        self.on_gain, self.on_lose = on_gain, on_lose
        self.monotonic, self.clock = monotonic, clock
        self.last_error: str | None = None
        self.transitions = 0  # gains and losses, for tests and metrics
        self._acting = False  # on_gain ran and on_lose has not yet
        self._act_lock = threading.Lock()  # the lease thread and the watchdog: one judges and acts at a time
        self._stop = threading.Event()
        self._wake = threading.Event()  # the watchdog looks again (the lease thread wrote)
        self._thread: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None

    def leading(self) -> bool:
        """This replica leads now (its last write is younger than the ttl)."""
        return self.tracker.leading(self.monotonic())

    def tick(self) -> None:
        """One round: read, decide, write, then start or stop the leader's work as it turned out."""
        try:
            row = self.store.read(self.name)
            step = self.tracker.step(row.record, self.monotonic())
            self._warn_of_a_twin(row.record.holder, step.action)
            if step.write is not None:
                won = self.store.swap(self.name, row.record, step.write, ttl_ms=int(self.ttl_s * 1000),
                                      now_ms=int(self.clock() * 1000))
                self.tracker.done(step, won)
                if won and step.action is Action.ACQUIRE:
                    log.info("lease %r: %s leads (epoch %d)", self.name, self.holder_id, step.write.epoch)
            self.last_error = None
        except Exception as exc:  # the store is away: leadership lapses on its own after ttl
            if self.last_error != str(exc):
                log.warning("lease %r: could not renew: %s", self.name, exc)
            self.last_error = str(exc)
        self._act()
        self._wake.set()

    def _warn_of_a_twin(self, holder: str | None, action: Action) -> None:
        """A fresh row held by this replica id from another process: two processes share one
        replica_id (or a previous run of this one stopped without releasing). It is followed as
        any other holder's; said once per holder."""
        if action is Action.FOLLOW and holder != self.holder_id and replica_of(holder) == self.me \
                and holder != self._twin_warned:
            self._twin_warned = holder
            log.warning("lease %r: held by %s, another process with this replica_id %r (this one is %s): give"
                        " each API process its own replica_id; this one waits for that lease to lapse",
                        self.name, holder, self.me, self.holder_id)

    def _act(self, leading: bool | None = None) -> None:
        """Start or stop the leader's work as this replica leads now (or as `leading` says)."""
        with self._act_lock:
            self._act_locked(self.leading() if leading is None else leading)

    def _act_locked(self, leading: bool) -> None:
        if leading and not self._acting:
            self._acting = True
            self.transitions += 1
            self.on_gain()
        elif not leading and self._acting:
            self._acting = False
            self.transitions += 1
            log.info("lease %r: %s no longer leads", self.name, self.holder_id)
            self.on_lose()

    def holder(self) -> LeaseRow:
        return self.store.read(self.name)

    # -- the background thread ------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"lease-{self.name}", daemon=True)
        self._thread.start()
        self._watchdog = threading.Thread(target=self._watch, name=f"lease-{self.name}-watchdog", daemon=True)
        self._watchdog.start()

    def _watch(self) -> None:
        """Stop the leader's work when the leadership lapses, without waiting for the lease
        thread (blocked in a read or a write to the store, it would act only once that returns)."""
        while not self._stop.is_set():
            self._wake.clear()
            until = self.tracker.leader_until()
            if self._acting and (until is None or self.monotonic() >= until):
                try:
                    self._act()
                except Exception:
                    log.exception("lease %r: leader work failed to stop", self.name)
            wait = self.renew_s
            if self._acting and until is not None:
                wait = min(wait, max(0.0, until - self.monotonic()) + 0.001)
            self._wake.wait(wait)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = self.monotonic()
            try:
                self.tick()
            except Exception:  # on_gain/on_lose failed: keep the lease loop alive
                log.exception("lease %r: leader work failed to start or stop", self.name)
            # Wake in time to stop acting before the lease lapses, even when a write was slow.
            until = self.tracker.leader_until()
            wait = self.renew_s - (self.monotonic() - started)
            if until is not None and self._acting:
                wait = min(wait, until - self.monotonic())
            self._stop.wait(max(0.0, wait))

    def stop(self, timeout_s: float = 5.0, *, release: bool = True) -> None:
        """Stop the leader's work, then hand the lease over at once (no ttl to wait out); with
        release=False the row stays as a crashed process leaves it (the others wait out the ttl)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if self._watchdog is not None:
            self._watchdog.join(timeout_s)
            self._watchdog = None
        self._act(False)
        if not release:
            return
        handover = self.tracker.release()
        if handover is not None:
            try:
                self.store.swap(self.name, self.tracker.record, handover, ttl_ms=0, now_ms=int(self.clock() * 1000))
            except Exception as exc:  # the others take over after ttl instead
                log.warning("lease %r: could not release: %s", self.name, exc)

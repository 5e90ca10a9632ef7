"""Idempotency keys of POST /api/v1/events: a producer that retries a request after a timeout
sends the same `Idempotency-Key`, and the retry returns the first answer instead of appending
the events a second time (as Stripe's API and the IETF httpapi draft "The Idempotency-Key HTTP
Header Field" do).

A key is claimed before the log append (`in_flight`), and its answer is recorded after it
(`done`), in a table beside the panes on the store's backend (store/connection.py Db), so
answers are kept across restarts and shared by every API replica on one PostgreSQL. The claim
is an `INSERT ... ON CONFLICT DO NOTHING`: of two requests with one key, at once, in one process
or two, exactly one gets it.

What to do with a key seen before is `decide`, pure and time-injected. One window stays open,
and docs/robustness.md says so: a process that dies between the append and the recording of the answer
leaves the key `in_flight`; after `in_flight_timeout_ms` a retry claims it again and appends
again. Exactly-once for such crashes needs the events' own ids (a stream's `event_id`).

The takeover must not meet a first try that is still working: `in_flight_timeout_ms` is the
setting `idempotency_in_flight_timeout`, which must exceed the log's produce timeout plus the
store's busy timeout (sketchboard/settings.py refuses it otherwise). And every claim carries a
token of its own (`claim_token`): `complete` and `release` change the row only while it still
holds their claim, so a first try that finishes after a takeover can neither record its answer
over the takeover's claim nor free it.

Ages are judged on one clock: with `store_clock` (as sketchboard/wiring.py opens it) a claim's
time and the time it is judged at are the store's, read in the claim's transaction (PostgreSQL's
clock_timestamp(); SQLite's 'now', the clock of the one machine whose local file it is), so API
replicas whose clocks disagree do not take each other's young claims for abandoned ones. Without
it (tests), the time the caller passes."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from store.connection import Db, SideStore, SqliteDb

_SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotency_keys (
    scope TEXT NOT NULL,          -- who sent it and where: '<token or anonymous> <stream>'
    idem_key TEXT NOT NULL,       -- the Idempotency-Key header as sent
    fingerprint TEXT NOT NULL,    -- a hash of the request (query and body): a reused key is told apart
    state TEXT NOT NULL,          -- 'in_flight' (claimed, answer not recorded yet) or 'done'
    claimed_ms INTEGER NOT NULL,
    status INTEGER,               -- the answer recorded ('done' only)
    answer TEXT,                  -- its JSON body
    claim_token TEXT,             -- whose claim it is: complete/release by a taken-over claim change nothing
    PRIMARY KEY (scope, idem_key)
);
CREATE INDEX IF NOT EXISTS idempotency_keys_by_time ON idempotency_keys (claimed_ms);
"""

IN_FLIGHT, DONE = "in_flight", "done"

# The store's clock in milliseconds since the epoch, read inside a transaction.
_NOW_SQLITE = "SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"
_NOW_POSTGRES = "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"


class Verdict(Enum):
    PROCEED = "proceed"      # the key is this request's now: do the work, then record the answer
    REPLAY = "replay"        # the same request was answered before: return that answer
    IN_PROGRESS = "in_progress"  # the same key is being worked on right now: 409, retry later
    MISMATCH = "mismatch"    # the key was used for a different request: 422


@dataclass(frozen=True)
class KeyRecord:
    fingerprint: str
    state: str
    claimed_ms: int
    status: int | None = None
    answer: dict | None = None


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    record: KeyRecord | None = None  # what was found (REPLAY: the answer to return)
    token: str | None = None  # PROCEED: this claim's token, for complete() and release()


def decide(existing: KeyRecord | None, fingerprint: str, now_ms: int, *, ttl_ms: int,
           in_flight_timeout_ms: int) -> Decision:
    """What a request with a key does, given what the store holds for that key.

    An expired record counts as none (the key may be used again). A claim older than the
    in-flight timeout was left by a request that never finished (its process died): it is
    taken over. A reused key with another request is refused even while in flight, so the
    answer does not depend on timing."""
    if existing is None or now_ms - existing.claimed_ms >= ttl_ms:
        return Decision(Verdict.PROCEED)
    if existing.fingerprint != fingerprint:
        return Decision(Verdict.MISMATCH, existing)
    if existing.state == DONE:
        return Decision(Verdict.REPLAY, existing)
    # A clock stepped back makes the age negative: that claim is young, not abandoned.
    if now_ms - existing.claimed_ms >= in_flight_timeout_ms:
        return Decision(Verdict.PROCEED, existing)
    return Decision(Verdict.IN_PROGRESS, existing)


class IdempotencyStore(SideStore):
    def __init__(self, target: str | Path | Db, *, ttl_ms: int = 86_400_000, in_flight_timeout_ms: int = 60_000,
                 synchronous: str = "NORMAL", busy_timeout_s: float = 30.0, store_clock: bool = False):
        if ttl_ms <= 0 or in_flight_timeout_ms <= 0:
            raise ValueError(f"idempotency key ttl and in-flight timeout must be positive, got {ttl_ms} and"
                             f" {in_flight_timeout_ms} ms")
        super().__init__(target, _SCHEMA, synchronous=synchronous, busy_timeout_s=busy_timeout_s)
        self.ttl_ms, self.in_flight_timeout_ms = ttl_ms, in_flight_timeout_ms
        self.store_clock = store_clock
        self._now_sql = _NOW_SQLITE if isinstance(self._conn, SqliteDb) else _NOW_POSTGRES
        with self._lock:  # a table made before claim tokens (CREATE TABLE IF NOT EXISTS kept it as it was)
            self.add_column("idempotency_keys", "claim_token", "TEXT")

    def claim(self, scope: str, key: str, fingerprint: str, now_ms: int) -> Decision:
        """Take the key for this request (PROCEED, with the claim's token), or say why not. Prunes
        expired keys. `now_ms` is ignored with `store_clock`: the store's clock is read instead."""
        token = uuid.uuid4().hex
        with self._lock, self._conn.transaction() as conn:
            if self.store_clock:
                now_ms = int(conn.execute(self._now_sql).fetchone()[0])
            conn.execute("DELETE FROM idempotency_keys WHERE claimed_ms < ?", (now_ms - self.ttl_ms,))
            inserted = conn.execute(
                "INSERT INTO idempotency_keys (scope, idem_key, fingerprint, state, claimed_ms, claim_token)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (scope, idem_key) DO NOTHING",
                (scope, key, fingerprint, IN_FLIGHT, now_ms, token)).rowcount
            if inserted == 1:
                return Decision(Verdict.PROCEED, token=token)
            row = conn.execute(
                "SELECT fingerprint, state, claimed_ms, status, answer FROM idempotency_keys"
                " WHERE scope = ? AND idem_key = ?", (scope, key)).fetchone()
            existing = None if row is None else KeyRecord(
                row[0], row[1], row[2], row[3], None if row[4] is None else json.loads(row[4]))
            decision = decide(existing, fingerprint, now_ms, ttl_ms=self.ttl_ms,
                              in_flight_timeout_ms=self.in_flight_timeout_ms)
            if decision.verdict is Verdict.PROCEED:
                # Take over what decide() judged abandoned; the claimed_ms condition makes sure
                # nobody else took it over in between.
                taken = conn.execute(
                    "UPDATE idempotency_keys SET fingerprint = ?, state = ?, claimed_ms = ?, status = NULL,"
                    " answer = NULL, claim_token = ? WHERE scope = ? AND idem_key = ? AND claimed_ms = ?",
                    (fingerprint, IN_FLIGHT, now_ms, token, scope, key,
                     existing.claimed_ms if existing else now_ms)).rowcount
                if taken != 1:
                    return Decision(Verdict.IN_PROGRESS, existing)
                return Decision(Verdict.PROCEED, existing, token)
            return decision

    def complete(self, scope: str, key: str, status: int, answer: dict, token: str | None = None) -> bool:
        """Record the answer of the request that holds the key: the claim `token` (claim()'s),
        when given, must still be the row's (False: it was taken over, nothing recorded)."""
        with self._lock, self._conn.transaction() as conn:
            return conn.execute(
                "UPDATE idempotency_keys SET state = ?, status = ?, answer = ? WHERE scope = ? AND idem_key = ?"
                " AND state = ? AND (CAST(? AS TEXT) IS NULL OR claim_token = ?)",
                (DONE, status, json.dumps(answer), scope, key, IN_FLIGHT, token, token)).rowcount == 1

    def release(self, scope: str, key: str, token: str | None = None) -> bool:
        """Give the key back: the request changed nothing (refused, or the log did not take the
        events), so a retry must be free to do the work. With a `token`, only that claim is
        released (False: it was taken over, and the takeover's claim stays)."""
        with self._lock, self._conn.transaction() as conn:
            return conn.execute(
                "DELETE FROM idempotency_keys WHERE scope = ? AND idem_key = ? AND state = ?"
                " AND (CAST(? AS TEXT) IS NULL OR claim_token = ?)",
                (scope, key, IN_FLIGHT, token, token)).rowcount == 1

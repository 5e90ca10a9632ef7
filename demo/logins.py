"""The demo shop's logins, with now and then a credential-stuffing burst, as a pure, seeded
generator (no I/O, time passed in), for the pattern `credential_stuffing` of config/streams.yaml
(docs/patterns.md, "The demo").

Ordinary logins come at `LOGINS_PER_S` per second of the clock (times the traffic's daily shape),
whatever the HTTP request rate: the demo stays light, and the benchmarks' event mix (drawn as
fast as the machine goes) stays the HTTP requests'. A login is by a user drawn uniformly from the
population (a user logs in now and then, not every minute), from the user's home address or, for
a share, a mobile network's. A share fails (a mistyped password); the user retries a few seconds
later from the same address, and after at most `MAX_USER_FAILURES` failures gets in or gives up:
fewer failures than the pattern needs, so ordinary traffic matches nothing.

Bursts: in each `BURST_SLOT_S` slot of the clock, with `BURST_PROBABILITY`, an attacker's address
tries one user's account with a leaked password list: `BURST_FAILURES` failed logins seconds
apart, then, for `BURST_SUCCESS_SHARE` of the bursts, a success from the same address (the
password was in the list: what the pattern finds); the other bursts give up. A burst depends only
on the seed, the run's tag and its slot (`burst(slot)`), so the same clock gives the same bursts at
any rate, and `bursts(from_ms, to_ms)` lists the ones a test must see matched; the tag (DemoTraffic
passes the seed's and start time's, as search ids carry) keeps a second producer beside the first
(a `sketchboard demo` for a spike) from sending the same bursts again, each attempt twice.

`LoginTraffic.due(now_ms)` returns the logins that happened since the last call (at most
`MAX_CATCHUP_MS` of ordinary ones after a stall) and the retries and burst attempts whose time
has come, each sent as it happens (within the call's span).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from demo.shapes import unit

LOGINS_PER_S = 2.0            # ordinary logins per second of the clock, before the daily shape
MAX_CATCHUP_MS = 5_000        # after a stall, at most this much clock time of ordinary logins is drawn
CLIENTS: tuple[tuple[str, float], ...] = (("web", 0.55), ("android", 0.27), ("ios", 0.18))
MOBILE_NETWORK_SHARE = 0.2    # logins from a phone's network address instead of the user's home one
FAILURE_SHARE = 0.08          # ordinary logins that fail (a mistyped password)
RETRY_FAILS = 0.35            # a user's retry fails again with this chance...
MAX_USER_FAILURES = 3         # ...at most this many times in a row (the pattern needs 5)
GIVE_UP_SHARE = 0.1           # a user who failed gives up instead of retrying
RETRY_GAP_MS = (3_000, 20_000)

BURST_SLOT_S = 120.0          # bursts: at most one per slot of clock time...
BURST_PROBABILITY = 0.3       # ...with this chance: one every ~7 minutes on average
BURST_FAILURES = (5, 9)       # failed attempts of one burst (inclusive)
BURST_GAP_MS = (3_000, 25_000)  # between two attempts of a burst: a throttled script
BURST_SUCCESS_SHARE = 0.6     # bursts that end in a success from the attacker's address
ATTACKER_NETWORK = "203.0.113"  # RFC 5737 documentation addresses

OUTCOME_SUCCESS, OUTCOME_FAILURE = "success", "failure"


def home_ip(user_id: str) -> str:
    """A user's home address: fixed per user id."""
    u = int(unit(0, "home-ip", user_id) * 2**24)
    return f"10.{u >> 16}.{(u >> 8) & 255}.{u & 255}"


@dataclass(frozen=True)
class Burst:
    """One credential-stuffing burst: the attacker's attempts on one user, in time order."""

    user_id: str
    ip: str
    client: str
    times_ms: tuple[int, ...]    # every attempt's time: the failures, then the success if any
    success: bool

    @property
    def failures(self) -> int:
        return len(self.times_ms) - self.success

    @property
    def start_ms(self) -> int:
        return self.times_ms[0]

    @property
    def end_ms(self) -> int:
        return self.times_ms[-1]


@dataclass(frozen=True)
class Logins:
    """Columns of the logins sent at one moment; `burst` says which came from a burst."""

    time_ms: list[int]
    strings: dict[str, list[str]]   # user_id, ip, outcome, client
    burst: list[bool]


class LoginTraffic:
    """Seeded logins of `users` from `started_ms` on (see the module's doc); `run` tags this
    producer's bursts ("": the seed's alone)."""

    def __init__(self, seed: int, users: Sequence[str], started_ms: int, *, rate_per_s: float = LOGINS_PER_S,
                 run: str = ""):
        self.seed = seed
        self.run = run
        self.users = list(users)
        self.rate_per_s = rate_per_s
        self._rng = np.random.default_rng([seed, 41])  # its own RNG: the other demo streams draw as before
        self._last_ms = started_ms
        # Bursts from the first whole slot after the start (a burst is never cut in half).
        self._next_slot = self._first_slot = int(started_ms // (BURST_SLOT_S * 1000)) + 1
        self._pending: list[tuple[int, int, tuple]] = []  # (time, order, row): a heap
        self._order = 0

    @property
    def pending(self) -> int:
        """Retries and burst attempts drawn but not due yet."""
        return len(self._pending)

    def burst(self, slot: int) -> Burst | None:
        """The burst of a slot of the clock, or None; a function of the seed, the run and the slot only."""
        tag = ("stuffing", self.run) if self.run else ("stuffing",)
        if unit(self.seed, *tag, slot) >= BURST_PROBABILITY:
            return None

        def u(*what) -> float:  # one draw per named part of the burst
            return unit(self.seed, *tag, slot, *what)

        lo, hi = BURST_FAILURES
        failures = lo + int(u("failures") * (hi - lo + 1))
        success = u("success") < BURST_SUCCESS_SHARE
        t = int(slot * BURST_SLOT_S * 1000 + u("start") * BURST_SLOT_S * 1000)
        times = [t]
        for i in range(failures - 1 + success):
            times.append(times[-1] + BURST_GAP_MS[0] + int(u("gap", i) * (BURST_GAP_MS[1] - BURST_GAP_MS[0])))
        user = self.users[int(u("user") * len(self.users))]
        ip = f"{ATTACKER_NETWORK}.{1 + int(u('ip') * 254)}"
        client = "web" if u("client") < 0.8 else "android"  # scripts mostly speak the web login's API
        return Burst(user, ip, client, tuple(times), success)

    def bursts(self, from_ms: int, to_ms: int) -> list[Burst]:
        """The bursts that start in [from_ms, to_ms), in time order (whether drawn yet or not); none
        of the slot the traffic started in, which `due` does not send."""
        slot_ms = BURST_SLOT_S * 1000
        out = []
        for slot in range(max(int(from_ms // slot_ms), self._first_slot), int(to_ms // slot_ms) + 1):
            b = self.burst(slot)
            if b is not None and from_ms <= b.start_ms < to_ms:
                out.append(b)
        return out

    def due(self, now_ms: int, rate_factor: float = 1.0) -> Logins:
        """The logins that happened since the last call, up to now_ms (see the module's doc)."""
        span = min(max(now_ms - self._last_ms, 0), MAX_CATCHUP_MS)
        self._last_ms = max(self._last_ms, now_ms)
        while self._next_slot * BURST_SLOT_S * 1000 <= now_ms:
            b = self.burst(self._next_slot)
            if b is not None:
                for i, t in enumerate(b.times_ms):
                    outcome = OUTCOME_SUCCESS if b.success and i == len(b.times_ms) - 1 else OUTCOME_FAILURE
                    self._push(t, (t, b.user_id, b.ip, outcome, b.client, True))
            self._next_slot += 1
        self._ordinary(now_ms, span, rate_factor)
        rows = []
        while self._pending and self._pending[0][0] <= now_ms:
            rows.append(heapq.heappop(self._pending)[2])
        # Sent together: shuffled, as requests of one moment reach the service in any order.
        rows = [rows[i] for i in self._rng.permutation(len(rows)).tolist()]
        cols = list(zip(*rows)) or [()] * 6
        return Logins(time_ms=list(cols[0]), burst=list(cols[5]),
                      strings={"user_id": list(cols[1]), "ip": list(cols[2]), "outcome": list(cols[3]),
                               "client": list(cols[4])})

    def _ordinary(self, now_ms: int, span: int, rate_factor: float) -> None:
        rng = self._rng
        n = int(rng.poisson(self.rate_per_s * rate_factor * span / 1000)) if span > 0 else 0
        if n == 0:
            return
        times = (now_ms - rng.integers(0, span, n)).tolist()
        users = [self.users[i] for i in rng.integers(0, len(self.users), n).tolist()]
        clients = [CLIENTS[i][0] for i in rng.choice(len(CLIENTS), size=n, p=_shares(CLIENTS)).tolist()]
        mobile = (rng.random(n) < MOBILE_NETWORK_SHARE).tolist()
        mobile_ips = [f"100.{64 + (v >> 16)}.{(v >> 8) & 255}.{v & 255}" for v in rng.integers(0, 2**22, n).tolist()]
        failed = (rng.random(n) < FAILURE_SHARE).tolist()
        for t, user, client, on_mobile, mobile_ip, fail in zip(times, users, clients, mobile, mobile_ips, failed):
            ip = mobile_ip if on_mobile else home_ip(user)
            if not fail:
                self._push(t, (t, user, ip, OUTCOME_SUCCESS, client, False))
                continue
            # A mistyped password: retried from the same address until it works, at most
            # MAX_USER_FAILURES failures in a row, unless the user gives up.
            failures = 1
            self._push(t, (t, user, ip, OUTCOME_FAILURE, client, False))
            while rng.random() >= GIVE_UP_SHARE:
                t += int(rng.integers(*RETRY_GAP_MS))
                fails_again = failures < MAX_USER_FAILURES and rng.random() < RETRY_FAILS
                self._push(t, (t, user, ip, OUTCOME_FAILURE if fails_again else OUTCOME_SUCCESS, client, False))
                if not fails_again:
                    break
                failures += 1

    def _push(self, t: int, row: tuple) -> None:
        heapq.heappush(self._pending, (t, self._order, row))
        self._order += 1


def _shares(pairs: tuple[tuple[str, float], ...]) -> np.ndarray:
    w = np.array([p[1] for p in pairs], dtype=float)
    return w / w.sum()

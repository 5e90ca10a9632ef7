"""The demo shop's `users` table: each user's plan and country, and how they change, as a pure,
seeded generator (no I/O, time passed in), for enriching `http_requests` by user_id (a
stream-table join, docs/tables.md "Enrichment").

At start every user has a row (`UserTable.initial`), except a small share of the least active
ones (`UNSYNCED_SHARE`): new sign-ups whose row has not reached the table yet, so some requests
find no row and are counted as enrichment misses. Then, every `CHANGE_EVERY_S` seconds of the
clock (`UserTable.due`), a few users change plan: upgrades by one step a bit more often than
downgrades; the users who change are drawn from the active ones (the `ACTIVE_USERS` busiest),
each about once an hour and a half, so the busiest do not flip plans every few seconds and the
mix of plans drifts only slowly. Now and then one of the unsynced users signs up (its row arrives
on the free plan), so the misses slowly shrink.

Rows carry exactly the table's fields (`user_id`, `plan`, `country`, and the time the change
happened): the demo's `users` stream in config/streams.yaml.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# Plans, cheapest first (an upgrade moves one step right), and the share of users on each at start.
PLANS: tuple[tuple[str, float], ...] = (("free", 0.62), ("plus", 0.24), ("pro", 0.11), ("team", 0.03))
PLAN_NAMES = tuple(p[0] for p in PLANS)
# Where the shop's users live (a few countries and the rest): six values keep the panes small.
USER_COUNTRIES: tuple[tuple[str, float], ...] = (
    ("DE", 0.30), ("FR", 0.19), ("GB", 0.17), ("ES", 0.10), ("US", 0.08), ("other", 0.16),
)
UNSYNCED_SHARE = 0.01         # users whose row is not in the table at start (new sign-ups)
UNSYNCED_FROM_RANK = 1_000    # ... drawn from the tail of the activity ranks: the heavy users have rows
CHANGE_EVERY_S = 5.0          # plan changes come in ticks of this much clock time
CHANGES_PER_TICK = 2.0        # mean plan changes tried per tick (Poisson; free can't go down, team can't go up)
UPGRADE_SHARE = 0.6           # of plan changes: the rest are downgrades
ACTIVE_USERS = 2_000          # the users who change plan: the busiest by rank
SIGNUP_PER_TICK = 0.2         # chance per tick that one unsynced user signs up


class UserTable:
    """Seeded rows of the demo's `users` table and their changes over time (see the module's doc).

    users: the user ids by activity rank (DemoTraffic's Zipf ranks: index 0 is the busiest).
    """

    def __init__(self, seed: int, users: Sequence[str]):
        self.users = list(users)
        rng = np.random.default_rng([seed, 31])  # its own RNG: the other demo streams draw as before
        self._rng = rng
        n = len(self.users)
        self.plan = rng.choice(len(PLANS), size=n, p=_shares(PLANS))          # index into PLANS, per rank
        self.country = rng.choice(len(USER_COUNTRIES), size=n, p=_shares(USER_COUNTRIES))
        tail = np.arange(min(UNSYNCED_FROM_RANK, n), n)
        k = min(len(tail), round(UNSYNCED_SHARE * n))
        self._unsynced = [int(r) for r in rng.permutation(tail)[:k]]  # sign-up order
        self.unsynced = set(self._unsynced)   # ranks without a row yet
        self._next_tick: int | None = None

    def initial(self, now_ms: int) -> list[dict]:
        """Every user's row but the unsynced ones', as of now_ms; changes come from then on (`due`)."""
        self._next_tick = math.floor(now_ms / 1000 / CHANGE_EVERY_S) + 1
        return [self._row(r, now_ms) for r in range(len(self.users)) if r not in self.unsynced]

    def due(self, now_ms: int) -> list[dict]:
        """The changes of every tick that has come by now_ms since the last call, in order (each
        row stamped with its tick's time). None before `initial`."""
        if self._next_tick is None:
            return []
        out: list[dict] = []
        while self._next_tick * CHANGE_EVERY_S * 1000 <= now_ms:
            out += self._tick(round(self._next_tick * CHANGE_EVERY_S * 1000))
            self._next_tick += 1
        return out

    def plan_of(self, user_id: str) -> str | None:
        """The user's current plan (None: no row yet); for tests and the curious."""
        r = self.users.index(user_id)
        return None if r in self.unsynced else PLAN_NAMES[self.plan[r]]

    def _tick(self, at_ms: int) -> list[dict]:
        rng = self._rng
        rows = []
        for _ in range(int(rng.poisson(CHANGES_PER_TICK))):
            r = int(rng.integers(min(ACTIVE_USERS, len(self.users))))
            if r in self.unsynced:
                continue  # no row to change yet
            up = rng.random() < UPGRADE_SHARE
            p = int(self.plan[r])
            p = min(p + 1, len(PLANS) - 1) if up else max(p - 1, 0)
            if p == self.plan[r]:
                continue  # already on the top plan, or on free: nothing to change
            self.plan[r] = p
            rows.append(self._row(r, at_ms))
        if self._unsynced and rng.random() < SIGNUP_PER_TICK:
            r = self._unsynced.pop(0)
            self.unsynced.discard(r)
            self.plan[r] = 0  # a sign-up starts free
            rows.append(self._row(r, at_ms))
        return rows

    def _row(self, r: int, at_ms: int) -> dict:
        return {"time": at_ms, "user_id": self.users[r], "plan": PLAN_NAMES[self.plan[r]],
                "country": USER_COUNTRIES[self.country[r]][0]}


def _shares(pairs: tuple[tuple[str, float], ...]) -> np.ndarray:
    w = np.array([p[1] for p in pairs], dtype=float)
    return w / w.sum()

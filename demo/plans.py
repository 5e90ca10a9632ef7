"""The demo shop's `plans` table: each plan's tier and monthly price, and their rare changes, as a
pure, seeded generator (no I/O, time passed in). With the view `user_plans` (users.plan ->
plans.plan_id, a left join: config/streams.yaml) it lets `http_requests` be grouped by a column two joins away,
the plan's tier (docs/tables.md, "Enrichment through a view").

A handful of rows: one per plan of demo/users.py (its `plan` is the plan's `plan_id`). Every
`CHANGE_EVERY_S` seconds of the clock one paid plan changes: mostly its price (a few per cent up
or down), and now and then `pro` is repackaged between the `paid` and `business` tiers, so the
requests of every pro user move tier at once (one change of the right table updates the view rows
of all its users) while requests from before the change keep the tier they had.
"""

from __future__ import annotations

import math

import numpy as np

from demo.users import PLAN_NAMES

# id -> (tier, monthly price in EUR) at start, for the plans of demo/users.py.
PLANS: dict[str, tuple[str, float]] = {"free": ("free", 0.0), "plus": ("paid", 9.0), "pro": ("paid", 29.0),
                                       "team": ("business", 99.0)}
REPACKAGED = "pro"            # the plan that moves between tiers
TIERS = ("paid", "business")  # ... these two
CHANGE_EVERY_S = 600.0        # a plan changes this often (clock time): a rare change of a small table
REPACKAGE_SHARE = 0.3         # of the changes: the tier move; the rest are price changes
PRICE_STEP = 0.1              # a price change: up or down by at most this share

assert set(PLANS) == set(PLAN_NAMES)


class PlanTable:
    """Seeded rows of the demo's `plans` table and their changes over time (see the module's doc)."""

    def __init__(self, seed: int):
        self._rng = np.random.default_rng([seed, 47])  # its own RNG: the other demo streams draw as before
        self.plans = {plan_id: [tier, price] for plan_id, (tier, price) in PLANS.items()}
        self._next_tick: int | None = None

    def initial(self, now_ms: int) -> list[dict]:
        """Every plan's row as of now_ms; changes come from then on (`due`)."""
        self._next_tick = math.floor(now_ms / 1000 / CHANGE_EVERY_S) + 1
        return [self._row(plan_id, now_ms) for plan_id in self.plans]

    def due(self, now_ms: int) -> list[dict]:
        """The changes of every tick that has come by now_ms since the last call, in order."""
        if self._next_tick is None:
            return []
        out: list[dict] = []
        while self._next_tick * CHANGE_EVERY_S * 1000 <= now_ms:
            out.append(self._tick(round(self._next_tick * CHANGE_EVERY_S * 1000)))
            self._next_tick += 1
        return out

    def tier_of(self, plan_id: str) -> str:
        return self.plans[plan_id][0]

    def _tick(self, at_ms: int) -> dict:
        rng = self._rng
        if rng.random() < REPACKAGE_SHARE:
            plan = self.plans[REPACKAGED]
            plan[0] = TIERS[1 - TIERS.index(plan[0])]
            return self._row(REPACKAGED, at_ms)
        paid = [p for p, (_, price) in self.plans.items() if price > 0]
        plan_id = paid[int(rng.integers(len(paid)))]
        plan = self.plans[plan_id]
        plan[1] = round(plan[1] * (1 + rng.uniform(-PRICE_STEP, PRICE_STEP)), 2)
        return self._row(plan_id, at_ms)

    def _row(self, plan_id: str, at_ms: int) -> dict:
        tier, price = self.plans[plan_id]
        return {"time": at_ms, "plan_id": plan_id, "tier": tier, "price": price}

"""The demo's plans table (demo/plans.py): one row per plan of the users table at start, then one
rare change per tick (a price, or `pro` moved between the paid and business tiers), seeded."""

from __future__ import annotations

from demo.plans import CHANGE_EVERY_S, PLANS, REPACKAGED, TIERS, PlanTable
from demo.users import PLAN_NAMES

NOW_MS = 1_700_000_000_000
HOUR_MS = 3_600_000


def changes(seed: int, hours: int) -> tuple[list[dict], list[dict]]:
    table = PlanTable(seed)
    initial = table.initial(NOW_MS)
    return initial, [row for t in range(NOW_MS, NOW_MS + hours * HOUR_MS, 60_000) for row in table.due(t)]


def test_every_plan_of_the_users_has_a_row_then_rare_changes():
    initial, later = changes(0, 24)
    assert [r["plan_id"] for r in initial] == list(PLAN_NAMES)
    assert all(set(r) == {"time", "plan_id", "tier", "price"} for r in initial + later)
    assert {r["plan_id"]: (r["tier"], r["price"]) for r in initial} == PLANS
    # One change per tick, stamped with its tick's time: rare (a few an hour).
    assert len(later) == 24 * 3600 // CHANGE_EVERY_S
    assert all(r["time"] % (CHANGE_EVERY_S * 1000) == 0 for r in later)
    moves = [r for r in later if r["plan_id"] == REPACKAGED and r["tier"] in TIERS]
    assert {r["tier"] for r in moves} == set(TIERS)  # pro moves between paid and business
    assert all(r["price"] > 0 for r in later)  # only paid plans change; free stays free
    assert "free" not in {r["plan_id"] for r in later}


def test_same_seed_same_changes():
    assert changes(3, 6) == changes(3, 6)
    assert changes(3, 6) != changes(4, 6)

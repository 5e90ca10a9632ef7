"""The demo's users table (demo/users.py): every user's row at start but a few new ones, plan
changes by one step every few seconds among the active users, sign-ups of the missing ones,
deterministic under a seed; DemoTraffic hands the rows out by its clock and sends no table
events and no enriched fields."""

from __future__ import annotations

from collections import Counter

from demo.traffic import DemoTraffic
from demo.users import ACTIVE_USERS, CHANGE_EVERY_S, PLAN_NAMES, UNSYNCED_FROM_RANK, USER_COUNTRIES, UserTable
from tests.support.clock import FakeClock

NOW_S = 1_700_000_000.0
USERS = [f"u{i:05d}" for i in range(50_000)]


def run(seed: int, seconds: int) -> tuple[list[dict], list[dict]]:
    table = UserTable(seed, USERS)
    initial = table.initial(int(NOW_S * 1000))
    changes = []
    for s in range(1, seconds + 1):
        changes += table.due(int((NOW_S + s) * 1000))
    return initial, changes


def test_every_user_has_a_row_at_start_but_a_few_new_ones_of_the_tail():
    table = UserTable(0, USERS)
    initial = table.initial(int(NOW_S * 1000))
    assert len(initial) == len(USERS) - len(table.unsynced) == 49_500
    assert min(table.unsynced) >= UNSYNCED_FROM_RANK  # the busiest users all have rows
    assert {r["user_id"] for r in initial}.isdisjoint(USERS[r] for r in table.unsynced)
    assert all(set(r) == {"time", "user_id", "plan", "country"} for r in initial)
    plans = Counter(r["plan"] for r in initial)
    assert set(plans) == set(PLAN_NAMES) and plans["free"] > plans["plus"] > plans["pro"] > plans["team"]
    assert {r["country"] for r in initial} == {c for c, _ in USER_COUNTRIES}


def test_plans_change_by_one_step_every_few_seconds_and_new_users_sign_up():
    table = UserTable(0, USERS)
    before = {r["user_id"]: r["plan"] for r in table.initial(int(NOW_S * 1000))}
    changes = []
    for s in range(1, 601):
        changes += table.due(int((NOW_S + s) * 1000))
    assert 100 < len(changes) < 400  # ~2 tried per 5 s tick over 10 minutes
    assert all(r["time"] % int(CHANGE_EVERY_S * 1000) == 0 for r in changes)
    plan = dict(before)
    ups = downs = signups = 0
    for r in changes:
        if r["user_id"] not in plan:
            assert r["plan"] == "free"
            signups += 1
        else:
            step = PLAN_NAMES.index(r["plan"]) - PLAN_NAMES.index(plan[r["user_id"]])
            assert step in (1, -1)
            ups, downs = ups + (step == 1), downs + (step == -1)
            assert USERS.index(r["user_id"]) < ACTIVE_USERS
        plan[r["user_id"]] = r["plan"]
    assert ups > downs > 0 and signups > 0


def test_same_seed_same_rows():
    assert run(5, 120) == run(5, 120)
    assert run(5, 120) != run(6, 120)


def test_traffic_hands_out_the_load_then_the_due_changes_and_no_table_events(catalog):
    clock = FakeClock(NOW_S)
    traffic = DemoTraffic(catalog, seed=1, clock=clock)
    first = traffic.table_changes()
    assert list(first) == ["users", "plans"] and len(first["users"]) == 49_500 and len(first["plans"]) == 4
    assert traffic.table_changes() == {}  # nothing due in the same instant
    clock.advance(60)
    assert 0 < len(traffic.table_changes()["users"]) < 100
    events = traffic.generate(1_000)
    assert not {"users", "plans", "user_plans"} & set(events)
    assert not {"plan", "country"} & set(events["http_requests"][0])  # looked up by the pipeline, not sent

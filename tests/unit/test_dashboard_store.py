"""The saved dashboards (store/dashboards.py) on every store backend."""

from __future__ import annotations

from store.dashboards import DashboardConflict, DashboardStore
from tests.support.side_race import race


def test_two_writers_of_one_dashboard_name_at_once_the_second_gets_the_conflict(store_backend):
    """Two API replicas saving one new dashboard name at once: the second is told the name is
    taken (DashboardConflict: HTTP 409), not the database's unique violation (a 500)."""
    store = store_backend.create()
    first_db = store_backend.side_db(store)
    first, second = DashboardStore(first_db), DashboardStore(store_backend.side_db(store))
    created, refused = race(first_db, "INSERT INTO dashboards", lambda: first.create("ops", {"title": "a"}, now_ms=1),
                            lambda: second.create("ops", {"title": "b"}, now_ms=2))
    assert created.name == "ops" and isinstance(refused, DashboardConflict)
    assert second.dashboard("ops").definition == {"title": "a"}


def test_dashboards_are_listed_in_code_point_order_whatever_the_database_s_collation(store_backend):
    dashboards = DashboardStore(store_backend.side_db(store_backend.create(linguistic=True)))
    for name in ["b", "B", "a", "_z", "é", "e"]:
        dashboards.create(name, {"title": name}, now_ms=1)
    assert [d.name for d in dashboards.dashboards()] == ["B", "_z", "a", "b", "e", "é"]

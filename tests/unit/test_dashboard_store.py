"""The saved dashboards (store/dashboards.py) on every store backend."""

from __future__ import annotations

import pytest

from store.dashboards import DashboardConflict, DashboardStale, DashboardStore
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


def test_a_change_or_delete_naming_a_version_that_is_no_longer_stored_is_refused_and_changes_nothing(store_backend):
    """Optimistic concurrency: a writer that edited version v is refused (DashboardStale, HTTP
    409) once someone else changed the dashboard, instead of silently undoing their change."""
    dashboards = DashboardStore(store_backend.side_db(store_backend.create()))
    loaded = dashboards.create("ops", {"panels": ["a"]}, now_ms=1_000)
    theirs = dashboards.replace("ops", {"panels": ["a", "b"]}, now_ms=1_000, expected_ms=loaded.updated_ms)
    assert theirs.updated_ms > loaded.updated_ms  # a new version even within the same millisecond
    with pytest.raises(DashboardStale, match="changed by someone else since you loaded it, at 1970-01-01T00:00:01.001Z"):
        dashboards.replace("ops", {"panels": []}, now_ms=2_000, expected_ms=loaded.updated_ms)
    with pytest.raises(DashboardStale):
        dashboards.delete("ops", expected_ms=loaded.updated_ms)
    assert dashboards.dashboard("ops") == theirs
    assert dashboards.replace("ops", {"panels": ["c"]}, now_ms=3_000).definition == {"panels": ["c"]}  # unversioned: overwrites
    assert dashboards.delete("ops", expected_ms=dashboards.dashboard("ops").updated_ms)

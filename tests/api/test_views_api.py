"""A view (catalog/views.py) through the table routes (api/table_routes.py) over a real SQLite log
and store: read one row or a page like a table, writes refused with the reason (the view's state
is written by the pipeline: here a batch commit of its tables, maintained by aggregates/views.py)."""

from __future__ import annotations

import warnings

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from aggregates.views import Views, with_views
from api.app import create_app
from catalog import parse_catalog
from store.base import BatchCommit
from store.table_state import TableChange
from tests.api.conftest import context

CONFIG = """
streams:
  users: {kind: table, key_field: user_id, dimensions: [plan_id], values: [credit]}
  plans: {kind: table, key_field: id, dimensions: [tier]}
views:
  user_plans: {left: users, right: plans, foreign_key: plan_id, kind: left}
"""


@pytest.fixture
def view_ctx(tmp_path, clock):
    with context(tmp_path, clock, parse_catalog(CONFIG)) as c:
        yield c


@pytest.fixture
def http(view_ctx):
    with TestClient(create_app(view_ctx)) as c:
        yield c


def test_a_view_reads_like_a_table(http, view_ctx, now_ms):
    changes = {"users": {f"u{i:02d}": TableChange({"plan_id": "p1" if i % 2 else "p2", "credit": float(i)},
                                                  now_ms, 0, i) for i in range(7)},
               "plans": {"p1": TableChange({"tier": "gold"}, now_ms + 1, 0, 0)}}
    views = Views(view_ctx.catalog, view_ctx.store)
    commit = with_views(BatchCommit("main", 0, [], 0, table_changes=changes), views.process(changes), views.names)
    view_ctx.store.commit_batch(commit, lateness_ms={}, now_ms=now_ms)
    one = http.get("/api/v1/tables/user_plans", params={"key": "u01"})
    assert one.status_code == 200, one.text
    assert one.json()["row"]["row"] == {"plan_id": "p1", "credit": 1.0, "tier": "gold"}
    assert one.json()["row"]["offset"] == 0  # the plan's change set it last
    assert http.get("/api/v1/tables/user_plans", params={"key": "u02"}).json()["row"]["row"]["tier"] is None
    missing = http.get("/api/v1/tables/user_plans", params={"key": "zz"})
    assert missing.status_code == 404 and "view 'user_plans' has no row with key 'zz'" in missing.json()["detail"]
    keys, cursor = [], ""
    while cursor is not None:
        page = http.get("/api/v1/tables/user_plans", params={"limit": 3, "cursor": cursor}).json()
        keys += [r["key"] for r in page["rows"]]
        cursor = page["next_cursor"]
    assert keys == sorted(changes["users"])


def test_writes_to_a_view_are_refused_with_the_tables_to_write(http):
    for answer in (http.post("/api/v1/tables/user_plans", json=[{"user_id": "u"}]),
                   http.delete("/api/v1/tables/user_plans/u1")):
        assert answer.status_code == 409
        assert "'user_plans' is a view (a left join of tables 'users' and 'plans')" in answer.json()["detail"]
    answer = http.get("/api/v1/tables/nope")
    assert answer.status_code == 404 and "views: user_plans" in answer.json()["detail"]

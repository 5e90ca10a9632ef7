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
                                                  now_ms, 0, i, now_ms) for i in range(7)},
               "plans": {"p1": TableChange({"tier": "gold"}, now_ms + 1, 0, 0, now_ms + 1)}}
    views = Views(view_ctx.catalog, view_ctx.store)
    commit = with_views(BatchCommit("main", 0, [], 0, table_changes=changes),
                        views.process(changes, batch_now_ms=now_ms), views.names)
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


def test_a_views_changelog_has_the_old_and_new_row_of_each_change(http, view_ctx, now_ms):
    views = Views(view_ctx.catalog, view_ctx.store)

    def commit(batch_id: int, changes: dict) -> None:
        done = views.process(changes, batch_now_ms=now_ms)
        view_ctx.store.commit_batch(with_views(BatchCommit("main", batch_id, [], 0, table_changes=changes), done,
                                               views.names), lateness_ms={}, now_ms=now_ms)

    commit(0, {"users": {"u1": TableChange({"plan_id": "p1", "credit": 1.0}, now_ms, 0, 0, now_ms)},
               "plans": {"p1": TableChange({"tier": "gold"}, now_ms, 0, 0, now_ms)}})
    commit(1, {"plans": {"p1": TableChange({"tier": "silver"}, now_ms + 5, 0, 1, now_ms + 5)}})   # a right change
    commit(2, {"users": {"u1": TableChange(None, now_ms + 9, 0, 1, now_ms + 9)}})  # a left delete
    first = http.get("/api/v1/views/user_plans/changes", params={"limit": 3})
    assert first.status_code == 200, first.text
    page = first.json()
    row = {"plan_id": "p1", "credit": 1.0}
    # Batch 0 applies the left change, then the right one, each against the view before it.
    assert [(c["key"], c["old"], c["new"]) for c in page["changes"]] == [
        ("u1", None, {**row, "tier": None}), ("u1", {**row, "tier": None}, {**row, "tier": "gold"}),
        ("u1", {**row, "tier": "gold"}, {**row, "tier": "silver"})]
    assert [c["cursor"] for c in page["changes"]] == ["1", "2", "3"]  # positions the store gives
    assert page["changes"][2]["event_time_ms"] == now_ms + 5 and page["changes"][2]["offset"] == 1
    rest = http.get("/api/v1/views/user_plans/changes", params={"cursor": page["next_cursor"]}).json()
    assert [(c["old"]["tier"], c["new"]) for c in rest["changes"]] == [("silver", None)]
    # A cursor of the older "batch.seq" form (batch 1's change 0) reads on from the same place.
    assert http.get("/api/v1/views/user_plans/changes", params={"cursor": "1.0"}).json()["changes"] == rest["changes"]
    # Nothing new: the same cursor back, to poll with.
    again = http.get("/api/v1/views/user_plans/changes", params={"cursor": rest["next_cursor"]}).json()
    assert again == {"view": "user_plans", "changes": [], "next_cursor": rest["next_cursor"]}
    # A table, an unknown name and a bad cursor are refused with the reason.
    table = http.get("/api/v1/views/users/changes")
    assert table.status_code == 400 and "'users' is a table: its changes are its log" in table.json()["detail"]
    assert http.get("/api/v1/views/nope/changes").status_code == 404
    for cursor in ("u1", str(2**63), f"1.{2**63}"):  # past 64 bits: was a 500 (OverflowError binding it)
        bad = http.get("/api/v1/views/user_plans/changes", params={"cursor": cursor})
        assert bad.status_code == 400 and "not a changes cursor" in bad.json()["detail"], cursor


def test_a_cursor_whose_next_changes_are_gone_is_a_410_and_one_past_the_last_a_400(http, view_ctx, now_ms):
    # Both were 200: the first silently without the pruned changes, the second echoed back as
    # next_cursor, so a reader would later skip the changes up to it.
    views = Views(view_ctx.catalog, view_ctx.store)

    def commit(batch_id: int, changes: dict, at: int) -> None:
        done = views.process(changes, batch_now_ms=at)
        view_ctx.store.commit_batch(with_views(BatchCommit("main", batch_id, [], 0, table_changes=changes), done,
                                               views.names), lateness_ms={}, now_ms=at)

    commit(0, {"users": {"u1": TableChange({"plan_id": "p1", "credit": 1.0}, now_ms, 0, 0, now_ms)}}, now_ms)
    held = http.get("/api/v1/views/user_plans/changes").json()["next_cursor"]
    commit(1, {"plans": {"p1": TableChange({"tier": "gold"}, now_ms, 0, 0, now_ms)}}, now_ms)
    later = now_ms + view_ctx.catalog.streams["user_plans"].retention + 1
    commit(2, {"users": {"u2": TableChange({"plan_id": "p1", "credit": 2.0}, later, 0, 1, later)}}, later)
    gone = http.get("/api/v1/views/user_plans/changes", params={"cursor": held})
    assert gone.status_code == 410, gone.text
    assert gone.json() == {"param": "cursor", "detail": (
        "the changes after cursor '1' are gone (the oldest kept is 3; past the view's retention or dropped by a"
        " rebuild): re-read the view's rows (GET /api/v1/tables/user_plans), then read its changes on from cursor '3'")}
    assert http.get("/api/v1/views/user_plans/changes", params={"cursor": "3"}).json()["changes"] == []
    past = http.get("/api/v1/views/user_plans/changes", params={"cursor": "99"})
    assert past.status_code == 400 and past.json() == {
        "param": "cursor", "detail": "cursor '99' is past the view's last change (3): pass a cursor an answer gave"}


def test_a_reader_caught_up_before_a_rebuild_is_told_with_a_410_and_ends_with_the_view(http, view_ctx, now_ms):
    """A rebuild (here a changed declaration) joins the view again without writing a change. A
    reader at the old end of the changelog read on with a 200 and never saw the rebuilt rows; it
    gets the 410, and doing what it says (the rows, then the changes on from the cursor named)
    ends with the view."""
    def commit(views: Views, batch_id: int, changes: dict) -> None:
        done = views.process(changes, batch_now_ms=now_ms)
        view_ctx.store.commit_batch(with_views(BatchCommit("main", batch_id, [], 0, table_changes=changes), done,
                                               views.names), lateness_ms={}, now_ms=now_ms)

    inner = Views(parse_catalog(CONFIG.replace("kind: left", "kind: inner")), view_ctx.store)
    commit(inner, 0, {"users": {"u1": TableChange({"plan_id": "p1", "credit": 1.0}, now_ms, 0, 0, now_ms),
                                "u2": TableChange({"plan_id": "p9", "credit": 2.0}, now_ms, 0, 1, now_ms)},
                      "plans": {"p1": TableChange({"tier": "gold"}, now_ms, 0, 0, now_ms)}})
    page = http.get("/api/v1/views/user_plans/changes").json()
    held = page["next_cursor"]  # caught up: the changelog's end
    assert http.get("/api/v1/views/user_plans/changes", params={"cursor": held}).json()["changes"] == []
    # The declaration becomes a left join: the next batch rebuilds the view (u2 joins, with no plan).
    commit(Views(view_ctx.catalog, view_ctx.store), 1,
           {"plans": {"p1": TableChange({"tier": "silver"}, now_ms + 1, 0, 1, now_ms + 1)}})
    gone = http.get("/api/v1/views/user_plans/changes", params={"cursor": held})
    assert gone.status_code == 410, gone.text
    end = gone.json()["detail"].rsplit("cursor '", 1)[1].rstrip("'")
    replayed = {r["key"]: r["row"] for r in http.get("/api/v1/tables/user_plans").json()["rows"]}
    for change in http.get("/api/v1/views/user_plans/changes", params={"cursor": end}).json()["changes"]:
        replayed[change["key"]] = change["new"]
    assert replayed == {"u1": {"plan_id": "p1", "credit": 1.0, "tier": "silver"},
                        "u2": {"plan_id": "p9", "credit": 2.0, "tier": None}}

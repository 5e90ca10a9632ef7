"""Views maintained batch by batch (aggregates/views.py) in the batch's transaction, on every store
backend (the `store_backend` fixture: SQLite and a real PostgreSQL): the stored view always equals
a join of the stored tables, a replayed batch changes nothing, and a dropped view is rebuilt
from the tables' rows to the same state."""

from __future__ import annotations

import random

import pytest

from aggregates.view_join import from_scratch
from aggregates.views import Views, shape_of, with_views
from catalog import parse_catalog
from store.base import BatchCommit
from store.table_state import TableChange

T0 = 1_700_000_000_000
YAML = """
streams:
  users: {kind: table, key_field: user_id, dimensions: [plan_id, country], values: [credit]}
  plans: {kind: table, key_field: id, dimensions: [tier], values: [price]}
views:
  user_plans: {left: users, right: plans, foreign_key: plan_id, kind: left}
  paying: {left: users, right: plans, foreign_key: plan_id}
"""
CATALOG = parse_catalog(YAML)
LATENESS = {name: s.allowed_lateness for name, s in CATALOG.streams.items()}


def random_changes(rng: random.Random, batch: int) -> dict:
    changes: dict = {"users": {}, "plans": {}}
    for i in range(rng.randint(0, 8)):
        table = rng.choice(["users", "plans"])
        key = f"{'u' if table == 'users' else 'p'}{rng.randint(1, 6)}"
        if rng.random() < 0.2:
            row = None
        elif table == "users":
            row = {"plan_id": rng.choice(["p1", "p2", "p3", "p9", ""]), "country": "nl", "credit": float(i)}
        else:
            row = {"tier": rng.choice(["free", "gold"]), "price": float(rng.randint(0, 9))}
        changes[table][key] = TableChange(row, T0 + batch * 1000 + i, 0, batch * 100 + i)
    return changes


def commit_batch(store, views: Views, batch_id: int, changes: dict):
    commit = BatchCommit("main", batch_id, [], 0, table_changes=changes)
    done = views.process(changes)
    result = store.commit_batch(with_views(commit, done, views.names), lateness_ms=LATENESS, now_ms=T0 + batch_id)
    return done, result


def stored_view(store, view: str) -> dict:
    return {r.key: r.row for r in store.view_rows(view, limit=1000)}


def joined_tables(store, view: str) -> dict:
    tables = {t: {r.key: r.row for r in store.table_rows(t, limit=1000)} for t in ("users", "plans")}
    return from_scratch(shape_of(CATALOG, CATALOG.views[view]), tables["users"], tables["plans"]).rows


def test_the_stored_view_is_the_join_of_the_stored_tables_after_every_batch(store_backend):
    store = store_backend.create()
    views = Views(CATALOG, store)
    rng = random.Random(7)
    changed = 0
    for batch_id in range(25):
        done, result = commit_batch(store, views, batch_id, random_changes(rng, batch_id))
        assert result.committed
        changed += done.changes
        assert sum(p.data.count for p in done.partials) == done.changes  # one change event per view change
        for view in CATALOG.views:
            assert stored_view(store, view) == joined_tables(store, view), (batch_id, view)
    assert changed > 20
    assert store.view_row("user_plans", "nobody") is None
    # A replayed batch id writes nothing (its view changes neither).
    before = stored_view(store, "user_plans")
    replay = {"users": {k: TableChange(None, T0, 0, 0) for k in before}}
    assert not commit_batch(store, views, 24, replay)[1].committed
    assert stored_view(store, "user_plans") == before


def test_a_dropped_view_is_rebuilt_from_the_tables_by_the_next_batch(store_backend):
    store = store_backend.create()
    views = Views(CATALOG, store)
    rng = random.Random(3)
    for batch_id in range(10):
        commit_batch(store, views, batch_id, random_changes(rng, batch_id))
    built = {view: stored_view(store, view) for view in CATALOG.views}
    assert built["user_plans"]
    store.drop_view("user_plans")
    assert stored_view(store, "user_plans") == {} and store.view_definition("user_plans") is None
    done, _ = commit_batch(store, views, 10, {})  # a batch without table changes rebuilds it
    assert done.rebuilt == ("user_plans",) and done.changes == 0
    assert {view: stored_view(store, view) for view in CATALOG.views} == built
    # ... and maintains it from there, also after a restart of the store.
    store = store_backend.reopen(store)
    views = Views(CATALOG, store)
    commit_batch(store, views, 11, {"plans": {"p1": TableChange(None, T0, 0, 999)}})
    for view in CATALOG.views:
        assert stored_view(store, view) == joined_tables(store, view)
    # A changed declaration (left -> inner) is rebuilt too: its rows are those of an inner join.
    changed = parse_catalog(YAML.replace("kind: left", "kind: inner"))
    done = Views(changed, store).process({})
    assert done.rebuilt == ("user_plans",)
    store.commit_batch(with_views(BatchCommit("main", 12, [], 0), done, ["user_plans"]), lateness_ms=LATENESS,
                       now_ms=T0)
    assert stored_view(store, "user_plans") == stored_view(store, "paying")


def replayed(store, view: str, page: int = 7) -> dict:
    """The view's changelog read page by page from the start and replayed from empty."""
    rows: dict = {}
    cursor, seen = "", []
    while True:
        changes = store.view_changes(view, after=cursor, limit=page)
        for c in changes:
            assert rows.get(c.key) == (None if c.old is None else dict(c.old)), c  # old: the row before
            if c.new is None:
                rows.pop(c.key, None)
            else:
                rows[c.key] = dict(c.new)
        seen += [c.cursor for c in changes]
        if len(changes) < page:
            break
        cursor = changes[-1].cursor
    assert len(seen) == len(set(seen))
    return rows


def test_the_changelog_has_old_and_new_rows_and_replayed_from_empty_is_the_view(store_backend):
    store = store_backend.create()
    views = Views(CATALOG, store)
    rng = random.Random(11)
    for batch_id in range(20):
        done, _ = commit_batch(store, views, batch_id, random_changes(rng, batch_id))
        for view in CATALOG.views:
            assert replayed(store, view) == stored_view(store, view), (batch_id, view)
    changes = store.view_changes("user_plans", limit=1000)
    assert any(c.old is not None and c.new is not None for c in changes)  # updates carry both rows
    assert any(c.old is None for c in changes) and any(c.new is None for c in changes)
    # A replayed batch adds no change; a cursor past the end reads nothing new.
    assert not commit_batch(store, views, 19, {"users": {"u1": TableChange(None, T0, 0, 0)}})[1].committed
    assert store.view_changes("user_plans", after=changes[-1].cursor) == []
    with pytest.raises(ValueError, match="not a changes cursor"):
        store.view_changes("user_plans", after="u1")
    # Kept for the view stream's retention: a batch committed after it prunes the older changes.
    retention = CATALOG.streams["user_plans"].retention
    commit = BatchCommit("main", 20, [], 0, table_changes={})
    store.commit_batch(with_views(commit, views.process({"plans": {"p1": TableChange({"tier": "x", "price": 1.0},
                                                                                     T0, 0, 5000)}}), views.names),
                       lateness_ms=LATENESS, now_ms=T0 + 20 + retention)
    assert all(c.cursor.startswith("20.") for c in store.view_changes("user_plans", limit=1000))
    # A dropped view's changelog starts again with its rebuild (which itself emits no change).
    store.drop_view("user_plans")
    commit_batch(store, views, 21, {})
    assert store.view_changes("user_plans") == [] and stored_view(store, "user_plans")

"""Views maintained batch by batch (aggregates/views.py) in the batch's transaction, on every store
backend (the `store_backend` fixture: SQLite and a real PostgreSQL): the stored view always equals
a join of the stored tables, a replayed batch changes nothing, and a dropped view is rebuilt
from the tables' rows to the same state."""

from __future__ import annotations

import random

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

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
from store.view_state import ChangesGone, CursorPastEnd
from tests.sqlite_steps import counted_steps

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
        at = T0 + batch * 1000 + i
        changes[table][key] = TableChange(row, at, 0, batch * 100 + i, at)
    return changes


def commit_batch(store, views: Views, batch_id: int, changes: dict):
    commit = BatchCommit("main", batch_id, [], 0, table_changes=changes)
    done = views.process(changes, batch_now_ms=T0 + batch_id)
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
    done = Views(changed, store).process({}, batch_now_ms=T0)
    assert done.rebuilt == ("user_plans",)
    store.commit_batch(with_views(BatchCommit("main", 12, [], 0), done, ["user_plans"]), lateness_ms=LATENESS,
                       now_ms=T0)
    assert stored_view(store, "user_plans") == stored_view(store, "paying")


def test_a_row_keyed_empty_is_in_the_view_and_its_rebuild(store_backend):
    """A left row keyed "" (stored before empty keys were refused): the rebuild read the tables
    from "after the key ''" and lost it; the view's listing missed it the same way."""
    store = store_backend.create()
    views = Views(CATALOG, store)
    row = {"plan_id": "p1", "country": "nl", "credit": 1.0}
    commit_batch(store, views, 0, {"users": {"": TableChange(row, T0, 0, 0, T0), "u1": TableChange(row, T0, 0, 1, T0)},
                                   "plans": {"p1": TableChange({"tier": "gold", "price": 2.0}, T0, 0, 0, T0)}})
    assert list(stored_view(store, "user_plans")) == ["", "u1"]
    store.drop_view("user_plans")
    done, _ = commit_batch(store, views, 1, {})
    assert done.rebuilt == ("user_plans",)
    assert stored_view(store, "user_plans") == {key: {**row, "tier": "gold", "price": 2.0} for key in ("", "u1")}


def test_view_rows_are_in_code_point_order_whatever_the_database_s_collation(store_backend):
    """The view's rows, and their pages, in the left keys' code-point order (as the tables'),
    also in a PostgreSQL database collated en_US, which would put 'a' before 'B'."""
    from tests.unit.test_table_state_store import UNORDERED_KEYS

    store = store_backend.create(linguistic=True)
    views = Views(CATALOG, store)
    row = {"plan_id": "p1", "country": "nl", "credit": 1.0}
    commit_batch(store, views, 0, {"users": {k: TableChange(row, T0, 0, i, T0) for i, k in enumerate(UNORDERED_KEYS)},
                                   "plans": {"p1": TableChange({"tier": "gold", "price": 2.0}, T0, 0, 0, T0)}})
    assert list(stored_view(store, "user_plans")) == sorted(UNORDERED_KEYS)
    seen, after = [], None
    while page := store.view_rows("user_plans", after=after, limit=4):
        seen += [r.key for r in page]
        after = page[-1].key
    assert seen == sorted(UNORDERED_KEYS)


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
    last = views.process({"plans": {"p1": TableChange({"tier": "x", "price": 1.0}, T0, 0, 5000, T0)}},
                         batch_now_ms=T0 + 20 + retention)
    store.commit_batch(with_views(commit, last, views.names), lateness_ms=LATENESS, now_ms=T0 + 20 + retention)
    kept = store.view_changes("user_plans", limit=1000)
    assert [c.key for c in kept] == [c.key for v in last.commits if v.view == "user_plans" for c in v.changes]
    assert int(kept[0].cursor) > int(changes[-1].cursor)  # positions go on past the pruned ones
    # A dropped view's changelog starts again with its rebuild (which itself emits no change).
    store.drop_view("user_plans")
    commit_batch(store, views, 21, {})
    assert store.view_changes("user_plans") == [] and stored_view(store, "user_plans")


def test_a_cursor_whose_next_changes_are_gone_or_past_the_last_is_refused(store_backend):
    """Reading on from a cursor whose next changes were pruned (retention) or dropped (a rebuild)
    silently skipped them, and a cursor past the last change was taken, so the changes up to it
    would be skipped once written: both are refused, the first with the end to read on from."""
    store = store_backend.create()
    views = Views(CATALOG, store)
    user = {"plan_id": "p1", "country": "nl", "credit": 1.0}
    commit_batch(store, views, 0, {"users": {"u1": TableChange(user, T0, 0, 0, T0)},
                                   "plans": {"p1": TableChange({"tier": "gold", "price": 1.0}, T0, 0, 0, T0)}})
    commit_batch(store, views, 1, {"plans": {"p1": TableChange({"tier": "silver", "price": 1.0}, T0, 0, 1, T0)}})
    assert [c.cursor for c in store.view_changes("user_plans")] == ["1", "2", "3"]
    with pytest.raises(CursorPastEnd, match=r"cursor '4' is past the view's last change \(3\)"):
        store.view_changes("user_plans", after="4")
    # A batch a retention later prunes changes 1..3 and writes 4.
    now = T0 + CATALOG.streams["user_plans"].retention + 10
    changes = {"plans": {"p1": TableChange({"tier": "bronze", "price": 1.0}, now, 0, 2, now)}}
    done = views.process(changes, batch_now_ms=now)
    store.commit_batch(with_views(BatchCommit("main", 2, [], 0, table_changes=changes), done, views.names),
                       lateness_ms=LATENESS, now_ms=now)
    assert [c.cursor for c in store.view_changes("user_plans")] == ["4"]  # the empty cursor: the oldest kept
    with pytest.raises(ChangesGone, match=r"the changes after cursor '1' are gone \(the oldest kept is 4") as gone:
        store.view_changes("user_plans", after="1")
    assert gone.value.last == 4
    assert [c.cursor for c in store.view_changes("user_plans", after="3")] == ["4"]  # nothing missed
    assert store.view_changes("user_plans", after="4") == []
    # A rebuild drops them all and rebuilds the rows without writing a change: every cursor from
    # before it missed the rebuilt rows, one at the old end too (it was read on from unawares).
    store.drop_view("user_plans")
    for before in ("3", "4"):
        with pytest.raises(ChangesGone, match="none is kept") as gone:
            store.view_changes("user_plans", after=before)
        assert gone.value.last == 5
    commit_batch(store, views, 3, {})  # the rebuild
    with pytest.raises(ChangesGone, match=r"after cursor '4' are gone \(none is kept"):
        store.view_changes("user_plans", after="4")
    assert store.view_changes("user_plans", after="5") == []  # the end the 410 names reads on
    commit_batch(store, views, 4, {"users": {"u2": TableChange(user, T0, 0, 1, T0)}})
    with pytest.raises(ChangesGone, match=r"after cursor '4' are gone \(the oldest kept is 6"):
        store.view_changes("user_plans", after="4")
    assert [c.cursor for c in store.view_changes("user_plans", after="5")] == ["6"]
    # A changed declaration's rebuild (no drop_view) too.
    changed = Views(parse_catalog(YAML.replace("kind: left", "kind: inner")), store)
    commit_batch(store, changed, 5, {})
    with pytest.raises(ChangesGone, match=r"after cursor '6' are gone") as gone:
        store.view_changes("user_plans", after="6")
    assert gone.value.last == 7 and store.view_changes("user_plans", after="7") == []


def changes_per_batch(views: Views, store, rng: random.Random, batches: range) -> list[tuple[int, int, str]]:
    """Commit random batches; each change of user_plans as (batch, place in batch, key)."""
    out = []
    for batch_id in batches:
        done, _ = commit_batch(store, views, batch_id, random_changes(rng, batch_id))
        made = [c for v in done.commits if v.view == "user_plans" for c in v.changes]
        out += [(batch_id, seq, c.key) for seq, c in enumerate(made)]
    return out


def test_changelog_positions_are_the_stores_own_and_old_batch_seq_cursors_still_read(store_backend):
    """The changelog is ordered by positions the store gives in the commit's transaction (not the
    pipeline's batch ids); a cursor of the old form "batch.seq" reads on after that change."""
    store = store_backend.create()
    views = Views(CATALOG, store)
    written = changes_per_batch(views, store, random.Random(5), range(15))
    assert len(written) > 20
    read = store.view_changes("user_plans", limit=1000)
    assert [c.key for c in read] == [key for _, _, key in written]
    assert [int(c.cursor) for c in read] == list(range(1, len(read) + 1))
    for i, (batch, seq, _) in enumerate(written):
        assert store.view_changes("user_plans", after=f"{batch}.{seq}", limit=1000) == read[i + 1:]
        assert store.view_changes("user_plans", after=read[i].cursor, limit=1000) == read[i + 1:]
    # An old cursor between changes (a batch without any) reads on after the last one before it.
    quiet = next(b for b in range(15) if b not in {w[0] for w in written})
    before = sum(1 for w in written if w[0] < quiet)
    assert store.view_changes("user_plans", after=f"{quiet}.0", limit=1000) == read[before:]
    assert store.view_changes("user_plans", after="99.0", limit=1000) == []
    # A rebuild starts the changelog again, after every position a reader may hold.
    store.drop_view("user_plans")
    commit_batch(store, views, 15, {})
    more = changes_per_batch(views, store, random.Random(6), range(16, 22))
    with pytest.raises(ChangesGone):  # a cursor at the old end missed the rebuilt rows
        store.view_changes("user_plans", after=read[-1].cursor, limit=1000)
    again = store.view_changes("user_plans", limit=1000)
    assert [c.key for c in again] == [key for _, _, key in more] and int(again[0].cursor) > int(read[-1].cursor) + 1
    # So did an old "batch.seq" one (its changes were dropped with the rest: it read on unawares).
    with pytest.raises(ChangesGone, match=rf"after cursor '{written[-1][0]}.{written[-1][1]}' are gone"):
        store.view_changes("user_plans", after=f"{written[-1][0]}.{written[-1][1]}", limit=1000)


def _to_layout_before_positions(store) -> None:
    """The store as one made before the changelog had positions of its own."""
    db = store.side_db()
    with db.transaction():
        db.execute("DROP INDEX view_changes_by_seq")
        db.execute("ALTER TABLE view_changes DROP COLUMN change_seq")
        db.execute("DROP TABLE view_changelog_ends")
    db.close()


def test_a_changelog_from_before_positions_is_numbered_in_its_old_order_when_opened(store_backend):
    store = store_backend.create()
    views = Views(CATALOG, store)
    written = changes_per_batch(views, store, random.Random(9), range(12))
    before = [(c.key, c.old, c.new) for c in store.view_changes("user_plans", limit=1000)]
    _to_layout_before_positions(store)
    store.close()
    store = store_backend.reopen(store)
    read = store.view_changes("user_plans", limit=1000)
    assert [(c.key, c.old, c.new) for c in read] == before
    batch, seq, _ = written[len(written) // 2]
    assert store.view_changes("user_plans", after=f"{batch}.{seq}", limit=1000) == read[len(written) // 2 + 1:]
    views = Views(CATALOG, store)
    more = changes_per_batch(views, store, random.Random(10), range(12, 16))
    assert [c.key for c in store.view_changes("user_plans", after=read[-1].cursor, limit=1000)] == \
        [key for _, _, key in more]
    assert replayed(store, "user_plans") == stored_view(store, "user_plans")


FAR_FUTURE = 253_402_214_400_000  # 9999-12-31


def test_a_view_change_refused_by_its_tables_rules_is_counted_not_aggregated(store_backend):
    """A view's change stream applies the event-time rules of the table each change comes from
    (too far in the future, beyond retention): a refused change is not in the view's panes, does not
    move its watermark and is counted per view and reason; its rows still follow the tables."""
    store = store_backend.create()
    views = Views(CATALOG, store)
    ok = {"plan_id": "p1", "country": "nl", "credit": 1.0}
    done, _ = commit_batch(store, views, 0, {"users": {"u1": TableChange(ok, T0, 0, 0, T0)},
                                             "plans": {"p1": TableChange({"tier": "gold", "price": 1.0}, T0, 0, 0, T0)}})
    assert done.dead == {} and sum(p.data.count for p in done.partials if p.stream == "user_plans") == 2
    watermark = store.progress("main").streams["user_plans"].watermark_ms
    retention = CATALOG.streams["users"].retention
    # u2 stamped 9999-12-31 (received at T0 + 1 s), u3 older than the table's retention, u4 a normal change.
    changes = {"users": {"u2": TableChange(ok, FAR_FUTURE, 0, 1, T0 + 1000),
                         "u3": TableChange(ok, T0 + 1 - retention - 1, 0, 2, T0 + 1000),
                         "u4": TableChange(ok, T0 + 1000, 0, 3, T0 + 1000)}}
    done, result = commit_batch(store, views, 1, changes)
    assert result.committed
    assert done.dead == {"user_plans": {"future_skew": 1, "beyond_retention": 1},
                         "paying": {"future_skew": 1, "beyond_retention": 1}}
    mine = [p for p in done.partials if p.stream == "user_plans"]
    assert [(p.start_ms <= T0 + 1000 < p.end_ms, p.data.count) for p in mine] == [(True, 1)]  # u4's only
    assert done.max_event_ms["user_plans"] == T0 + 1000 and done.changes == 6
    progress = store.progress("main").streams["user_plans"]
    assert progress.max_event_ms == T0 + 1000
    assert watermark < progress.watermark_ms < T0 + 1000  # moved by u4, not to year 9999
    assert progress.dead_lettered_by_reason == {"future_skew": 1, "beyond_retention": 1}
    assert progress.events_read == progress.events_aggregated + progress.events_dead_lettered == 5
    assert store.view_row("user_plans", "u2") is not None  # the rows follow the tables (which take every change)
    assert stored_view(store, "user_plans") == joined_tables(store, "user_plans")
    # A right change from the future is refused for every view row it changes (u1, u2, u3, u4).
    done, _ = commit_batch(store, views, 2, {"plans": {"p1": TableChange({"tier": "x", "price": 2.0}, FAR_FUTURE,
                                                                         0, 1, T0 + 2000)}})
    assert done.dead["user_plans"] == {"future_skew": 4} and not done.partials and not done.max_event_ms
    # A rebuild joins the stored rows and emits no change: nothing is counted twice.
    store.drop_view("user_plans")
    done, _ = commit_batch(store, views, 3, {})
    assert done.rebuilt == ("user_plans",) and done.dead == {}
    progress = store.progress("main").streams["user_plans"]
    assert progress.dead_lettered_by_reason == {"future_skew": 5, "beyond_retention": 1}
    assert progress.max_event_ms == T0 + 1000


def test_a_commits_changelog_retention_reads_what_it_drops_not_every_change_kept(tmp_path):
    """Nearly every batch of the demo edits a view, and each such commit drops the changes past the
    changelog's retention (7 days). Asked by commit time with no index on it, it read every change
    the view kept. SQLite's virtual-machine steps, counted, not timed."""
    from store import SqlitePaneStore
    from store.view_state import ViewCommit, apply

    steps = {}
    for kept in (20, 2_000):
        store = SqlitePaneStore(tmp_path / f"{kept}.db", synchronous="OFF")
        conn = store._conn
        conn.executemany(
            "INSERT INTO view_changes (view_name, batch_id, seq, left_key, old_json, new_json, event_time_ms,"
            " log_partition, log_offset, committed_at_ms, change_seq)"
            " VALUES ('v', ?, 0, 'k', NULL, '{}', 0, 0, ?, ?, ?)",
            [(i, i, T0 + i, i + 1) for i in range(kept)])
        # the oldest change is a day inside the retention: nothing to drop
        steps[kept] = counted_steps(conn, lambda: apply(conn.cursor(), [ViewCommit("v", "{}", retention_ms=86_400_000)],
                                                        kept, T0, "?"))[1]
        assert conn.execute("SELECT COUNT(*) FROM view_changes").fetchone()[0] == kept
        store.close()
    assert steps[2_000] <= 2 * steps[20] + 2, steps  # 100 times the changes, the same work


def test_a_lookup_reads_the_keys_entries_not_every_entry_of_the_view(tmp_path):
    """A batch's lookup of a few left and right keys: as one WHERE with `left_key IN (...) OR
    right_key IN (...)`, SQLite read every entry of the view (the demo's users view: ~50 000).
    SQLite's virtual-machine steps, counted, not timed."""
    from store import SqlitePaneStore

    steps, found = {}, {}
    for kept in (20, 5_000):
        store = SqlitePaneStore(tmp_path / f"{kept}.db", synchronous="OFF")
        conn = store._conn
        conn.executemany(
            "INSERT INTO view_rows (view_name, left_key, right_key, row_json, event_time_ms, log_partition, log_offset,"
            " batch_id, updated_at_ms) VALUES ('v', ?, ?, '{}', 0, 0, ?, 0, 0)",
            [(f"u{i}", f"p{i % 4}" if i else "p9", i) for i in range(kept)])
        found[kept], steps[kept] = counted_steps(conn, lambda: store.view_links("v", ["u1", "u2"], ["p9"]))
        store.close()
    assert {link.left_key for link in found[5_000]} == {"u0", "u1", "u2"}
    assert found[5_000] == found[20]
    assert steps[5_000] <= 2 * steps[20] + 2, steps  # 250 times the entries, the same work

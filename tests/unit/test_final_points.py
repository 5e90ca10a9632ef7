"""Final points kept in the store (store/final_points.py): a restarted process, another replica
or a new client reads them instead of computing them again, and reads only what is still true."""

from __future__ import annotations

import math
import threading
import time

from store.final_points import FinalPoints
from store.kept_point import form
from store.point_text import point_text
from store.point_cache import PointCache
from store.rollup import ErrorBound, Point
from tests.unit.test_tiers import LAYOUT, MINUTE, T0, answer, commit_all, pane_rollup, store_at

HOUR_OF_EVENTS = [[(T0 + i * 7_000, {"a": "xy"[i % 2], "b": "pqr"[i % 3], "c": "mn"[i % 2]}, float(i % 97), f"u{i % 40}")
                   for i in range(514)]]  # an hour of events, then a batch that makes its windows final
LATER = [[(T0 + 2 * 3_600_000, {"a": "x", "b": "p", "c": "m"}, 1.0, "u1")]]
QUERY = dict(stat="p90", start=T0, end=T0 + 3_600_000, step=MINUTE, window=MINUTE)


def test_a_restarted_process_reads_the_kept_points_instead_of_computing_them(store_backend):
    store = store_at(store_backend, LAYOUT)
    commit_all(store, HOUR_OF_EVENTS + LATER)
    kept = FinalPoints(store_backend.side_db(store))
    first = answer(store, **QUERY, cache=PointCache(backing=kept))
    kept.flush()
    kept.close()

    again = store_backend.reopen(store)  # a restart: nothing in memory
    cache = PointCache(backing=FinalPoints(store_backend.side_db(again)))
    try:
        restarted = answer(again, **QUERY, cache=cache)
        assert restarted == first  # values, counts, revisions and error bounds identical
        assert all(p.final and p.error is not None for p in restarted[0].points)
        # Every point from the store (the hour: one chunk of final windows): no sketch read or merged
        assert cache.hits == 60 and cache.chunk_hits == 1
    finally:
        cache.backing.close()


def test_a_straggler_after_the_restart_recomputes_only_its_window(store_backend):
    store = store_at(store_backend, LAYOUT)
    plain = store_at(store_backend, None)
    for s in (store, plain):
        commit_all(s, HOUR_OF_EVENTS + LATER)
    kept = FinalPoints(store_backend.side_db(store))
    try:
        answer(store, **QUERY, cache=PointCache(backing=kept))
        kept.flush()
        straggler = [[(T0 + 5 * MINUTE + 1_000, {"a": "x", "b": "q", "c": "n"}, 5_000.0, "u99")]]
        for s in (store, plain):
            commit_all(s, straggler, first_id=2)
        cache = PointCache(backing=kept)
        got = answer(store, **QUERY, cache=cache)
        assert got == pane_rollup(plain, **QUERY)
        assert got[0].points[5].revision == 2
        assert cache.hits == 59  # the corrected window's fingerprint changed: computed again
        kept.flush()
        assert answer(store, **QUERY, cache=PointCache(backing=kept)) == got  # and kept again, corrected
    finally:
        kept.close()


def test_points_keep_every_value_and_bound_exactly(store_backend):
    kept = FinalPoints(store_backend.side_db())
    points = [Point(T0, 0.1 + 0.2, 7, True, 3, ErrorBound("kll", -math.inf, math.inf, rank_error=0.0133)),
              Point(T0 + MINUTE, None, 0, True, 0, None),
              Point(T0 + 2 * MINUTE, 1e308, 1, True, 1, ErrorBound("hll", 0.5, 2.5, relative_error=0.01,
                                                                 expected_undercount=0.25))]
    try:
        kept.save([(("s", "p99"), ("x",), p.t_ms, (1, 2, 3, 4), p) for p in points])
        loaded = kept.load(("s", "p99"), T0, T0 + 3 * MINUTE)
        assert [(g, t, fp, p) for g, t, fp, p, _ in sorted(loaded)] == [(("x",), p.t_ms, (1, 2, 3, 4), p) for p in points]
        assert kept.load(("s", "p95"), T0, T0 + 3 * MINUTE) == []  # another shape
    finally:
        kept.close()


def test_a_new_process_reads_each_kept_points_text_instead_of_writing_it(store_backend, monkeypatch):
    """The text GET /api/v1/query writes of a point (store/point_text.py) is kept beside it: a new
    process's point cache loads it with the point, and it is the text the point would be written as."""
    import store.point_text as point_text_module

    points = [Point(T0, 0.1 + 0.2, 7, True, 3, ErrorBound("kll", -math.inf, math.nan, rank_error=0.0133)),
              Point(T0 + MINUTE, 1e-7, 2, True, 0, None),
              Point(T0 + 2 * MINUTE, 1e308, 1, True, 1, ErrorBound("hll", 0.5, 2.5, relative_error=0.01,
                                                                 expected_undercount=0.25))]
    written = [point_text_module.format_point(p) for p in points]
    kept = FinalPoints(store_backend.side_db())
    try:
        kept.save([(("s", "p99"), (), p.t_ms, (1, 2, 3, 4), p) for p in points])
        cache = PointCache(backing=kept)  # a new process's
        cache.load(("s", "p99"), T0, T0 + 3 * MINUTE)
        loaded = cache.get_many([((("s", "p99"), (), p.t_ms), (1, 2, 3, 4)) for p in points])
        assert [point_text_module.format_point(p) for p in loaded] == written  # the point's own text

        def no_formatting(p):
            raise AssertionError("a kept point's text was written again")

        monkeypatch.setattr(point_text_module, "format_point", no_formatting)
        assert [point_text_module.point_text(p) for p in loaded] == written
        monkeypatch.undo()

        # A chunk of final windows (store/series.py) keeps its points and their texts the same way.
        kept.save_chunks([(("s", "p50"), T0, "v", (((), tuple(map(form, points)), tuple(written)),), None)])
        cache = PointCache(backing=kept)
        assert cache.final_chunks(("s", "p50"), {T0: "another validity"}) == {}  # rows changed since
        [[chunk]] = [groups.values() for groups in cache.final_chunks(("s", "p50"), {T0: "v"}).values()]
        assert [point_text_module.format_point(p) for p in chunk.values()] == written
        monkeypatch.setattr(point_text_module, "format_point", no_formatting)
        assert [point_text_module.point_text(p) for p in chunk.values()] == written
    finally:
        kept.close()


def test_a_text_is_not_served_for_a_point_a_replica_of_the_version_before_changed(store_backend):
    """A rolling upgrade: a replica of the version before recomputes a kept point (a straggler
    revised its window) and updates the row's point, not its text (it knows no text): a new
    process must write the new point's text, not serve the old one."""
    from store.final_points import _digest, _shape_key
    from store.point_text import format_point

    before = Point(T0, 51.0, 9, True, 1, ErrorBound("kll", 50.0, 52.0, rank_error=0.0133))
    store = store_backend.create()
    kept = FinalPoints(store.side_db())
    old = store.side_db()
    try:
        kept.save([(("s", "p90"), (), T0, (9, 1, 1, 1), before)])
        old.execute("UPDATE kept_points SET events = 29, last_batch = 2, revision = 2,"  # what its save's upsert sets
                    " point = '[5000.0,29,2,[\"kll\",4999.0,5001.0,null,0.0133,null]]'"
                    " WHERE shape_key = ? AND grp_key = ? AND t_ms = ?", (_shape_key(("s", "p90")), _digest("[]"), T0))
        (loaded,) = kept.load(("s", "p90"), T0, T0 + MINUTE)
        assert loaded[3][1] == 5000.0 and loaded[4] is None  # the text written for `before` is not served
        cache = PointCache(backing=kept)
        cache.load(("s", "p90"), T0, T0 + MINUTE)
        (point,) = cache.get_many([((("s", "p90"), (), T0), (29, 1, 2, 2))])
        assert point_text(point) == format_point(point) != format_point(before)
    finally:
        kept.close()
        old.close()


def test_points_of_shapes_and_groups_longer_than_an_index_entry_are_kept(store_backend):
    """A filter value and a group's labels may each be 2 048 bytes, and JSON writes a CJK character
    as 6 (\\uXXXX): the texts outgrew a PostgreSQL B-tree entry (~2 700 bytes), and every save of
    such points failed (logged; they were computed again at every query). Keyed by digests now."""
    import random

    rng = random.Random(57)  # random text: PostgreSQL compresses a repetitive one below the bound
    kept = FinalPoints(store_backend.side_db())
    long_filter = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(3 * 1024))
    long_label = "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(682))
    shape = ("s", "p99", (("region", long_filter),))
    point = Point(T0, 1.5, 2, True, 1, None)
    try:
        kept.save([(shape, (long_label,), T0, (1, 2, 3, 4), point)])
        assert [row[:4] for row in kept.load(shape, T0, T0 + MINUTE)] == [((long_label,), T0, (1, 2, 3, 4), point)]
    finally:
        kept.close()


def test_clear_and_retention_forget_kept_points(store_backend):
    now_ms = T0 + 10 * MINUTE
    kept = FinalPoints(store_backend.side_db(), retention_ms=5 * MINUTE, clock=lambda: now_ms / 1000)
    old, new = (Point(t, 1.0, 1, True, 1, None) for t in (T0, T0 + 6 * MINUTE))
    try:
        kept.save([("s", (), p.t_ms, (1, 1, 1, 1), p) for p in (old, new)])
        assert [t for _, t, *_ in kept.load("s", T0, now_ms)] == [new.t_ms]  # older than 5 min: gone
        kept.save_chunks([("s", p.t_ms, "v", (((), (form(p),), (point_text(p),)),), None) for p in (old, new)])
        kept.save([])  # nothing to keep: no retention pass either
        assert [c for c, *_ in kept.load_chunks("s", {old.t_ms: "v", new.t_ms: "v"})] == [old.t_ms, new.t_ms]
        kept._pruned_ms -= 3_600_000  # an hour since the last retention pass
        kept.save_chunks([("s", new.t_ms, "v", (((), (form(new),), (point_text(new),)),), None)])  # chunks alone: the pass runs too
        assert [c for c, *_ in kept.load_chunks("s", {old.t_ms: "v", new.t_ms: "v"})] == [new.t_ms]
        cache = PointCache(backing=kept)
        cache.clear()  # a switch replaced the stream's rows: kept points are of the old ones
        assert kept.load("s", T0, now_ms) == [] and kept.load_chunks("s", {new.t_ms: "v"}) == []
    finally:
        kept.close()


def test_a_load_does_not_wait_behind_a_write_that_waits_for_the_store(store_backend):
    """The writes have a connection of their own: while one waits for the store's write lock (a
    pipeline commit holds it for seconds on SQLite), queries still load kept points at once."""
    store = store_backend.create()
    kept = FinalPoints(store.side_db(), writer=store.side_db())
    first, second = (Point(t, 1.0, 1, True, 1, None) for t in (T0, T0 + MINUTE))
    other = store_backend.reopen(store).side_db()  # the pipeline's, in its own process
    held, release = threading.Event(), threading.Event()

    def commit_in_progress() -> None:
        with other.transaction():
            other.execute("LOCK TABLE kept_points IN EXCLUSIVE MODE" if store_backend.kind == "postgres"
                          else "DELETE FROM kept_points WHERE t_ms < 0")  # SQLite: the database's write lock
            held.set()
            release.wait(20)

    try:
        kept.save([("s", (), first.t_ms, (1, 1, 1, 1), first)])
        holder = threading.Thread(target=commit_in_progress)
        holder.start()
        assert held.wait(10)
        kept.save_soon([("s", (), second.t_ms, (1, 1, 1, 1), second)])  # its writer now waits for the lock
        time.sleep(0.3)
        began = time.monotonic()
        assert [p for _, _, _, p, _ in kept.load("s", T0, T0 + 2 * MINUTE)] == [first]
        assert time.monotonic() - began < 2
        release.set()
        holder.join(10)
        kept.flush()
        assert sorted(p for _, _, _, p, _ in kept.load("s", T0, T0 + 2 * MINUTE)) == [first, second]
    finally:
        release.set()
        kept.close()
        other.close()


def test_retention_is_applied_at_most_once_an_hour(store_backend):
    now = [T0 + 10 * MINUTE]
    kept = FinalPoints(store_backend.side_db(), retention_ms=5 * MINUTE, clock=lambda: now[0] / 1000)
    point = (lambda t: Point(t, 1.0, 1, True, 1, None))
    try:
        kept.save([("s", (), T0 + 6 * MINUTE, (1, 1, 1, 1), point(T0 + 6 * MINUTE))])  # prunes (the first save)
        now[0] += 30 * MINUTE  # T0 + 6 min is now past retention, but the last pruning was 30 min ago
        kept.save([("s", (), T0 + 39 * MINUTE, (1, 1, 1, 1), point(T0 + 39 * MINUTE))])
        assert len(kept.load("s", T0, now[0])) == 2
        now[0] += 31 * MINUTE
        kept.save([("s", (), T0 + 70 * MINUTE, (1, 1, 1, 1), point(T0 + 70 * MINUTE))])
        assert [t for _, t, *_ in kept.load("s", T0, now[0])] == [T0 + 70 * MINUTE]
    finally:
        kept.close()


def test_kept_points_by_an_earlier_way_of_computing_them_are_not_served(store_backend, monkeypatch):
    # store/final_points.py POINTS_VERSION: p0/p100 and the ranges near KLL's ends changed (session
    # 59), and a point kept before (its rows unchanged, so its fingerprint too) was served for good.
    from store import final_points

    kept = FinalPoints(store_backend.side_db())
    point = Point(T0, 5018.0, 7, True, 3, ErrorBound("kll", 5014.0, 5018.0, rank_error=0.0133))
    try:
        monkeypatch.setattr(final_points, "POINTS_VERSION", final_points.POINTS_VERSION - 1)
        kept.save([(("s", "p100"), ("x",), T0, (1, 2, 3, 4), point)])
        assert kept.load(("s", "p100"), T0, T0 + MINUTE) != []
        monkeypatch.undo()
        assert kept.load(("s", "p100"), T0, T0 + MINUTE) == []
    finally:
        kept.close()


def test_points_that_cannot_be_kept_are_one_warning_line(store_backend, caplog):
    """On a full disk this comes at every query: a traceback each time buried the log."""
    store = store_backend.create()
    kept = FinalPoints(store.side_db(), writer=store.side_db())
    other = store_backend.reopen(store).side_db()
    try:
        other.execute("DROP TABLE kept_points")  # any store error that fails the save
        kept.save_soon([("s", (), T0, (1, 1, 1, 1), Point(T0, 1.0, 1, True, 1, None))])
        kept.flush()
        [record] = [r for r in caplog.records if "could not keep" in r.getMessage()]
        assert record.exc_info is None and record.getMessage().startswith("could not keep 1 final points in the store: ")
        assert "kept_points" in record.getMessage()  # the reason, in the line
    finally:
        kept.close()
        other.close()


def test_a_point_is_forgotten_when_no_granule_that_answers_it_is_kept(store_backend):
    """A day of the standard views' 1-minute points is ~40 000 rows: kept as long as the hours
    (90 days shipped) they were most of the table. Each goes when the rows of every granule that
    can answer its window are gone (store.planner.answerable_ms)."""
    from store.planner import answerable_ms
    from store.tiers import TierLayout

    day = 86_400_000
    layout = TierLayout(10_000, 2 * day, ((MINUTE, 8 * day), (60 * MINUTE, 90 * day)), ("",))
    assert answerable_ms(layout, 10_000, MINUTE, MINUTE) == 8 * day + MINUTE
    assert answerable_ms(layout, 10_000, MINUTE, 60 * MINUTE) == 8 * day + 60 * MINUTE  # minutes, not hours
    assert answerable_ms(layout, 10_000, 60 * MINUTE, 60 * MINUTE) == 90 * day + 60 * MINUTE
    assert answerable_ms(layout, 10_000, 90_000, 90_000) == 2 * day + 90_000  # 30 s buckets: the panes only
    assert answerable_ms(None, 10_000, MINUTE, MINUTE) is None

    now = [T0 / 1000]
    kept = FinalPoints(store_backend.side_db(), retention_ms=90 * day + 60 * MINUTE, clock=lambda: now[0])
    point = Point(T0, 1.0, 1, True, 1, None)
    try:
        kept.save([("minutes", (), T0, (1, 1, 1, 1), point, answerable_ms(layout, 10_000, MINUTE, MINUTE)),
                   ("hours", (), T0, (1, 1, 1, 1), point, answerable_ms(layout, 10_000, 60 * MINUTE, 60 * MINUTE)),
                   ("asked before", (), T0, (1, 1, 1, 1), point)])  # no keep given: the retention's
        now[0] += (8 * day + 2 * MINUTE) / 1000  # past the minutes' keep; the last pruning was long ago
        kept.save([("later", (), T0 + 8 * day, (1, 1, 1, 1), point._replace(t_ms=T0 + 8 * day), MINUTE)])
        assert kept.load("minutes", T0, T0 + 1) == []
        assert len(kept.load("hours", T0, T0 + 1)) == len(kept.load("asked before", T0, T0 + 1)) == 1
    finally:
        kept.close()


def test_a_querys_points_are_kept_as_long_as_its_granules(store_backend):
    store = store_at(store_backend, LAYOUT)
    commit_all(store, HOUR_OF_EVENTS + LATER)
    kept = FinalPoints(store_backend.side_db(store))
    try:
        answer(store, **QUERY, cache=PointCache(backing=kept))
        kept.flush()
        rows = kept._conn.execute("SELECT t_ms, expires_ms FROM kept_points").fetchall()
        assert len(rows) == 60 and all(expires == t + 7 * 86_400_000 + MINUTE for t, expires in rows)  # LAYOUT: 7 d
        assert kept._conn.execute("SELECT t_ms, expires_ms FROM kept_chunks").fetchall() == [
            (T0, T0 + 7 * 86_400_000 + MINUTE)]  # the hour, one chunk, as long as its first window
    finally:
        kept.close()


def test_windows_without_a_row_are_answered_but_never_kept(store_backend):
    """The hour before the stream's first event, and a gap: their windows are made as asked (equal
    to what the roll-up makes of no rows), neither computed from sketches nor kept in the store."""
    store = store_at(store_backend, LAYOUT)
    gap = [e for e in HOUR_OF_EVENTS[0] if not T0 + 20 * MINUTE <= e[0] < T0 + 30 * MINUTE]
    commit_all(store, [gap] + LATER)
    kept = FinalPoints(store_backend.side_db(store))
    try:
        for stat, group_by in (("p90", ()), ("distinct", ("a",))):
            asked = dict(QUERY, stat=stat, start=T0 - 3_600_000, group_by=group_by)
            plain = answer(store, **asked)
            cache = PointCache(backing=kept)
            assert answer(store, **asked, cache=cache) == plain  # cold
            assert answer(store, **asked, cache=cache) == plain  # warm
            kept.flush()
            assert answer(store, **asked, cache=PointCache(backing=kept)) == plain  # a new process's
            with_rows = sum(p.count > 0 for s in plain for p in s.points)
            assert with_rows == 50 * len(plain) and sum(len(s.points) for s in plain) == 120 * len(plain)
            assert len(cache) == with_rows
        assert kept._conn.execute("SELECT COUNT(*) FROM kept_points").fetchone()[0] == 50 + 100
    finally:
        kept.close()


def test_a_store_kept_by_the_version_before_is_upgraded_in_place(store_backend):
    """A rolling upgrade: replicas of the version before go on reading and writing kept_points
    (without expires_ms) beside the new ones; the new version adds the column, never replaces the
    table, and forgets their rows by the retention."""
    store = store_backend.create()
    old = store.side_db()
    old.create("""DROP TABLE IF EXISTS kept_points; CREATE TABLE kept_points (shape_key TEXT NOT NULL, grp_key TEXT NOT NULL, grp TEXT NOT NULL,
        t_ms INTEGER NOT NULL, events INTEGER NOT NULL, rows_in INTEGER NOT NULL, last_batch INTEGER NOT NULL,
        revision INTEGER NOT NULL, point TEXT NOT NULL, PRIMARY KEY (shape_key, grp_key, t_ms))""")
    from store.final_points import _digest, _shape_key

    def old_write(t: int) -> None:  # what the version before writes
        old.execute("INSERT INTO kept_points (shape_key, grp_key, grp, t_ms, events, rows_in, last_batch, revision,"
                    " point) VALUES (?, ?, '[]', ?, 1, 1, 1, 1, '[1.0,1,1,null]')", (_shape_key("old"), _digest("[]"), t))

    old_write(T0)
    now = [T0 / 1000]
    kept = FinalPoints(store.side_db(), retention_ms=60 * MINUTE, clock=lambda: now[0])
    again = FinalPoints(store.side_db())  # a second new replica: the column is there already
    try:
        old_write(T0 + MINUTE)  # the old replicas still write after the upgrade
        assert [t for _, t, *_ in kept.load("old", T0, T0 + 2 * MINUTE)] == [T0, T0 + MINUTE]
        now[0] += 61 * MINUTE / 1000
        kept.save([("new", (), T0 + 61 * MINUTE, (1, 1, 1, 1), Point(T0 + 61 * MINUTE, 1.0, 1, True, 1, None), MINUTE)])
        assert [t for _, t, *_ in kept.load("old", T0, T0 + 2 * MINUTE)] == [T0 + MINUTE]  # past the retention: gone
        assert len(again.load("new", T0, T0 + 62 * MINUTE)) == 1
    finally:
        kept.close()
        again.close()
        old.close()

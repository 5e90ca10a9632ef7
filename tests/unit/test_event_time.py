"""Event time in the store, no JVM: watermarks, provisional vs final panes, revisions,
correction records, dead letters and the read = aggregated + dead-lettered counters.
Property tests (Hypothesis) for the watermark, pane assignment and merge order."""

from __future__ import annotations

import json
import math
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregates.eventtime import BEYOND_RETENTION, FUTURE_SKEW, UNPARSEABLE, dead_letter_reason
from catalog import parse_catalog
from sketches import HllSketch, KllSketch
from store import BatchCommit, DeadLetter, PaneData, PanePartial, SqlitePaneStore, ValueStats, pane_start
from store.panes import advance_watermark, is_final, merge_all, next_revision
from store.schema_version import SCHEMA_VERSION, StoreVersionError
from tests.sqlite_steps import counted_steps

PANE = 10_000
T0 = 1_700_000_000_000
LATENESS = {"s": 30_000}


def data(values=(), users=()) -> PaneData:
    stats = {}
    if values:
        kll = KllSketch()
        for v in values:
            kll.update(v)
        stats["v"] = ValueStats(len(values), math.fsum(values), min(values), max(values), kll.to_bytes())
    hlls = {}
    if users:
        hll = HllSketch()
        for u in users:
            hll.update(u)
        hlls["u"] = hll.to_bytes()
    return PaneData(len(values), stats, hlls)


def part(start: int, values=(1.0,), users=("a",), dims=None) -> PanePartial:
    return PanePartial("s", start, start + PANE, dims or {"d": "x"}, data(values, users))


def commit(batch_id: int, partials, max_event=None, dead=(), read=None, dead_counts=None, now=None) -> BatchCommit:
    aggregated = sum(p.data.count for p in partials)
    return BatchCommit("main", batch_id, list(partials), aggregated + len(dead),
                       {} if max_event is None else {"s": max_event}, {}, list(dead),
                       {} if read is None else {"s": read}, dead_counts or {}, now)


@pytest.fixture
def store(store_backend):
    """A new store of each backend (tests/store_backends.py): these are the store's contract."""
    return store_backend.create()


# -- pure rules -------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(-10**13, 10**13)), max_size=30), st.integers(0, 10**9))
def test_watermark_never_decreases(max_events, lateness):
    wm = None
    for m in max_events:
        nxt = advance_watermark(wm, m, lateness)
        if wm is not None:
            assert nxt is not None and nxt >= wm
        if m is not None:
            assert nxt >= m - lateness
        wm = nxt


@settings(max_examples=200, deadline=None)
@given(st.integers(-10**13, 10**13), st.sampled_from([1_000, 10_000, 60_000, 3_600_000]))
def test_every_event_falls_in_exactly_one_pane(t, pane_ms):
    start = pane_start(t, pane_ms)
    containing = [s for s in (start - pane_ms, start, start + pane_ms) if s <= t < s + pane_ms]
    assert containing == [start] and start % pane_ms == 0


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.integers(-1000, 1000), min_size=0, max_size=8), min_size=1, max_size=5), st.randoms())
def test_merging_panes_in_any_order_gives_the_same_result(groups, rnd):
    parts = [data([float(v) for v in g], [f"u{v}" for v in g]) for g in groups]
    reference = merge_all(parts)
    shuffled = parts[:]
    rnd.shuffle(shuffled)
    other = merge_all(shuffled)
    assert other.count == reference.count
    assert other.summary() == reference.summary()  # integer values: sums exact; HLL estimate of the same set
    if "v" in reference.values:
        assert KllSketch.from_bytes(other.values["v"].kll).n == reference.values["v"].n


def test_revision_rule():
    assert [next_revision(None, False), next_revision(None, True)] == [1, 2]
    assert [next_revision(3, False), next_revision(3, True)] == [3, 4]
    assert is_final(T0 + PANE, T0 + PANE) and not is_final(T0 + PANE - 1, T0 + PANE) and not is_final(None, 0)


def test_dead_letter_reason_rule():
    kw = {"batch_now_ms": T0, "retention_ms": 86_400_000, "max_future_skew_ms": 300_000}
    assert dead_letter_reason(T0, T0, None, **kw) is None
    assert dead_letter_reason(T0, T0, "bad", **kw) == UNPARSEABLE
    assert dead_letter_reason(None, T0, None, **kw) == UNPARSEABLE
    assert dead_letter_reason(T0 - 86_400_000, T0, None, **kw) is None
    assert dead_letter_reason(T0 - 86_400_001, T0, None, **kw) == BEYOND_RETENTION
    assert dead_letter_reason(T0 + 300_000, T0, None, **kw) is None
    assert dead_letter_reason(T0 + 300_001, T0, None, **kw) == FUTURE_SKEW


def test_catalog_retention_and_skew_defaults_and_validation():
    base = "streams:\n  s:\n    pane: 10s\n    allowed_lateness: 30s\n"
    stream = parse_catalog(base).stream("s")
    assert (stream.retention, stream.max_future_skew) == (7 * 86_400_000, 300_000)
    stream = parse_catalog(base + "    retention: 2d\n    max_future_skew: 1h\n").stream("s")
    assert (stream.retention, stream.max_future_skew) == (2 * 86_400_000, 3_600_000)
    for bad, words in (("    retention: 20s\n", "longer than allowed_lateness"),
                       ("    retention: 5s\n", "at least one pane"),
                       ("    max_future_skew: soon\n", "not a duration"),
                       ("    retention: -1d\n", "not a duration")):
        with pytest.raises(ValueError, match=words):
            parse_catalog(base + bad)


# -- the store --------------------------------------------------------------------------


def test_provisional_changes_keep_the_revision_final_ones_are_corrections(store):
    store.commit_batch(commit(0, [part(T0, [1.0, 2.0], ["a"])], max_event=T0 + 5_000), lateness_ms=LATENESS, now_ms=1)
    # watermark T0 - 25 s: the pane [T0, T0+10s) is provisional; a change keeps revision 1
    store.commit_batch(commit(1, [part(T0, [3.0], ["b"])], max_event=T0 + 45_000), lateness_ms=LATENESS, now_ms=2)
    [pane] = store.read_panes("s", T0, T0 + PANE)
    assert (pane.revision, pane.data.count) == (1, 3)
    assert store.corrections() == [] and store.max_correction_id() == 0
    # watermark now T0 + 15 s >= pane end: final. A late event is merged and corrects it.
    result = store.commit_batch(commit(2, [part(T0, [10.0, -1.0], ["c", "d"]), part(T0 + 60_000)],
                                       max_event=T0 + 70_000), lateness_ms=LATENESS, now_ms=3)
    assert result.corrections == 1
    [pane] = store.read_panes("s", T0, T0 + PANE)
    assert (pane.revision, pane.data.count) == (2, 5)
    [c] = store.corrections()
    assert (c.stream, c.pane_start_ms, c.pane_end_ms, dict(c.dims)) == ("s", T0, T0 + PANE, {"d": "x"})
    assert (c.revision_from, c.revision_to, c.batch_id, c.events_added, c.at_ms) == (1, 2, 2, 2, 3)
    assert c.old["count"] == 3 and c.old["values"]["v"] == {"n": 3, "sum": 6.0, "min": 1.0, "max": 3.0}
    assert c.new["count"] == 5 and c.new["values"]["v"] == {"n": 5, "sum": 15.0, "min": -1.0, "max": 10.0}
    assert c.old["distinct"]["u"] == pytest.approx(2, abs=0.01) and c.new["distinct"]["u"] == pytest.approx(4, abs=0.01)
    # the change feed marks the correction; the provisional new pane is not one
    changes = store.changes_since(0)
    assert [(ch.batch_id, ch.revision, ch.correction_id) for ch in changes][-2:] == [(2, 2, c.id), (2, 1, None)]
    assert store.progress("main").streams["s"].corrections == 1


def test_a_pane_born_final_starts_at_revision_2_from_an_empty_one(store):
    store.commit_batch(commit(0, [part(T0 + 100_000)], max_event=T0 + 100_000), lateness_ms=LATENESS, now_ms=1)
    store.commit_batch(commit(1, [part(T0, [4.0], ["z"])]), lateness_ms=LATENESS, now_ms=2)
    [c] = store.corrections()
    assert (c.revision_from, c.revision_to, c.events_added) == (1, 2, 1)
    assert c.old == {"count": 0, "values": {}, "distinct": {}}
    assert store.read_panes("s", T0, T0 + PANE)[0].revision == 2


def test_the_batch_own_watermark_does_not_finalise_its_panes(store):
    # one batch advancing the watermark past a pane while adding to it: not a correction
    store.commit_batch(commit(0, [part(T0), part(T0 + 100_000)], max_event=T0 + 100_000), lateness_ms=LATENESS, now_ms=1)
    assert store.corrections() == []
    assert {p.revision for p in store.read_panes("s", 0, 2**62)} == {1}


def test_corrections_filters_and_cursor(store):
    store.commit_batch(commit(0, [part(T0 + 200_000)], max_event=T0 + 200_000), lateness_ms=LATENESS, now_ms=1)
    store.commit_batch(commit(1, [part(T0), part(T0 + 50_000)]), lateness_ms=LATENESS, now_ms=2)
    store.commit_batch(commit(2, [part(T0)]), lateness_ms=LATENESS, now_ms=3)
    everything = store.corrections()
    assert [(c.pane_start_ms, c.revision_from, c.revision_to) for c in everything] == [
        (T0, 1, 2), (T0 + 50_000, 1, 2), (T0, 2, 3)]
    assert [c.id for c in store.corrections(newest_first=True)] == [c.id for c in reversed(everything)]
    assert [c.pane_start_ms for c in store.corrections(start_ms=T0 + 10_000)] == [T0 + 50_000]
    assert [c.pane_start_ms for c in store.corrections(end_ms=T0 + 10_000)] == [T0, T0]
    assert store.corrections(stream="other") == []
    assert [c.id for c in store.corrections(after_id=everything[0].id, limit=1)] == [everything[1].id]
    assert store.max_correction_id() == everything[-1].id


def test_each_change_names_its_own_correction_when_a_batch_corrects_many_panes(store):
    """A batch's corrections are saved together (PostgreSQL: their ids taken at once, then one COPY):
    each change of a corrected pane names its own correction, also for a pane two of the batch's
    partials correct in turn, and the ids follow the batch's writes."""
    store.commit_batch(commit(0, [part(T0 + 200_000)], max_event=T0 + 200_000), lateness_ms=LATENESS, now_ms=1)
    late = [part(T0 + i * PANE, dims={"d": f"x{i % 3}"}) for i in range(12)] + [part(T0 + PANE, dims={"d": "x1"})]
    result = store.commit_batch(commit(1, late), lateness_ms=LATENESS, now_ms=2)
    assert result.corrections == 13
    by_id = {c.id: c for c in store.corrections()}
    changes = [ch for ch in store.changes_since(0) if ch.batch_id == 1]
    assert len(changes) == 13 and [ch.correction_id for ch in changes] == sorted(by_id)
    for ch in changes:
        c = by_id[ch.correction_id]
        assert (c.pane_start_ms, dict(c.dims), c.revision_to) == (ch.start_ms, json.loads(ch.dims), ch.revision)
    twice = [by_id[ch.correction_id] for ch in changes if ch.start_ms == T0 + PANE]
    assert [(c.revision_from, c.revision_to, c.new["count"]) for c in twice] == [(1, 2, 1), (2, 3, 2)]


def test_replayed_batch_records_no_second_correction(store):
    store.commit_batch(commit(0, [part(T0 + 200_000)], max_event=T0 + 200_000), lateness_ms=LATENESS, now_ms=1)
    late = commit(1, [part(T0)], dead=[DeadLetter("s", 0, 7, FUTURE_SKEW, T0 + 10**9, T0)],
                  read=2, dead_counts={"s": {FUTURE_SKEW: 1}})
    assert store.commit_batch(late, lateness_ms=LATENESS, now_ms=2).committed
    assert not store.commit_batch(late, lateness_ms=LATENESS, now_ms=3).committed
    assert len(store.corrections()) == 1 and len(store.dead_letters()) == 1
    s = store.progress("main").streams["s"]
    assert (s.events_read, s.events_aggregated, s.events_dead_lettered) == (3, 2, 1)


def test_dead_letters_and_counters(store):
    dead = [DeadLetter("s", 1, 10, UNPARSEABLE, None, None, "undecodable log segment"),
            DeadLetter("s", 1, 11, BEYOND_RETENTION, T0 - 10**10, T0, None, {"d": "x"}),
            DeadLetter("s", 2, 3, FUTURE_SKEW, T0 + 10**9, T0, None, {"d": "y"})]
    counts = {"s": {UNPARSEABLE: 1, BEYOND_RETENTION: 1, FUTURE_SKEW: 1}}
    store.commit_batch(commit(0, [part(T0, [1.0, 2.0])], max_event=T0, dead=dead, read=5, dead_counts=counts),
                       lateness_ms=LATENESS, now_ms=9)
    s = store.progress("main").streams["s"]
    assert (s.events_read, s.events_aggregated, s.events_dead_lettered) == (5, 2, 3)
    assert s.dead_lettered_by_reason == {UNPARSEABLE: 1, BEYOND_RETENTION: 1, FUTURE_SKEW: 1}
    stored = store.dead_letters()
    assert [d.letter for d in stored] == list(reversed(dead)) and {d.batch_id for d in stored} == {0}
    assert [d.letter.offset for d in store.dead_letters(reason=BEYOND_RETENTION)] == [11]
    assert store.watermarks() == {"s": T0 - 30_000}  # dead rows carry no max_event: only the good ones count


def test_dead_letter_counts_are_per_stream_over_a_span_of_arrival(store):
    """What the dead_letters alert kind reads: per stream, the dead letters that arrived (were
    committed) in [start, end); a stream with none there is left out."""
    arrivals = {100: {"s": 2, "t": 1}, 200: {"t": 3}, 300: {"s": 1, "u": 4}}
    for batch_id, (at, per_stream) in enumerate(arrivals.items()):
        dead = [DeadLetter(stream, 0, batch_id * 100 + i, FUTURE_SKEW, T0 + 10**9, T0)
                for stream, n in per_stream.items() for i in range(n)]
        store.commit_batch(BatchCommit("main", batch_id, [], len(dead), {}, {}, dead, dict(per_stream),
                                       {stream: {FUTURE_SKEW: n} for stream, n in per_stream.items()}),
                           lateness_ms=LATENESS, now_ms=at)
    assert store.dead_letter_counts(0, 10**6) == {"s": 3, "t": 4, "u": 4}
    assert store.dead_letter_counts(100, 300) == {"s": 2, "t": 4}  # the end is not in the span
    assert store.dead_letter_counts(101, 301) == {"t": 3, "s": 1, "u": 4}
    assert store.dead_letter_counts(201, 300) == {}


def test_dead_letter_counts_read_the_span_not_every_dead_letter_kept(tmp_path):
    """The demo's dead_letters alert asks every 10 s over its window; the store keeps dead letters
    for the streams' retention (millions at 20 000 events/s). Counted by time alone, each ask
    scanned them all under the store's lock. SQLite's virtual-machine steps, counted, not timed."""
    steps = {}
    for kept in (20, 2_000):
        store = SqlitePaneStore(tmp_path / f"{kept}.db", synchronous="OFF")
        conn = store._conn
        conn.executemany(
            "INSERT INTO dead_letters (pipeline, batch_id, stream, partition, \"offset\", reason, at_ms)"
            " VALUES ('main', 0, ?, 0, ?, 'future_skew', ?)",
            [(stream, i, i) for stream in ("s", "t") for i in range(kept)])  # one a ms, long before the span
        counts, steps[kept] = counted_steps(conn, lambda: store.dead_letter_counts(kept - 5, kept + 10_000))
        assert counts == {"s": 5, "t": 5}
        store.close()
    assert steps[2_000] <= 2 * steps[20] + 2, steps  # 100 times the dead letters, the same work


def test_a_commit_breaking_the_invariant_is_refused(store):
    bad = commit(0, [part(T0)], max_event=T0, read=5)  # 1 aggregated + 0 dead != 5 read
    with pytest.raises(ValueError, match="5 records read but 1 aggregated"):
        store.commit_batch(bad, lateness_ms=LATENESS, now_ms=1)
    assert store.last_batch_id("main") is None and store.read_panes("s", 0, 2**62) == []


def test_panes_beyond_retention_are_dropped(store):
    store.commit_batch(commit(0, [part(T0), part(T0 + 20_000)], max_event=T0 + 20_000), lateness_ms=LATENESS, now_ms=1)
    store.commit_batch(commit(1, [], now=T0 + 20_000 + 86_400_000), lateness_ms=LATENESS, now_ms=2,
                       retention_ms={"s": 86_400_000})
    assert [p.key.start_ms for p in store.read_panes("s", 0, 2**62)] == [T0 + 20_000]


def test_a_panes_corrections_are_dropped_with_it_past_retention(store):
    store.commit_batch(commit(0, [part(T0), part(T0 + 20_000)], max_event=T0 + 70_000), lateness_ms=LATENESS, now_ms=1)
    # Both panes final: a straggler to each is a correction.
    store.commit_batch(commit(1, [part(T0), part(T0 + 20_000)], max_event=T0 + 70_000), lateness_ms=LATENESS, now_ms=2)
    assert sorted(c.pane_start_ms for c in store.corrections()) == [T0, T0 + 20_000]
    store.commit_batch(commit(2, [], now=T0 + 20_000 + 86_400_000), lateness_ms=LATENESS, now_ms=3,
                       retention_ms={"s": 86_400_000})
    assert [c.pane_start_ms for c in store.corrections()] == [T0 + 20_000]  # its pane is kept, as read_panes shows
    assert [p.key.start_ms for p in store.read_panes("s", 0, 2**62)] == [T0 + 20_000]


def test_a_retention_commit_drops_a_bounded_number_of_corrections_and_the_next_ones_the_rest(store, monkeypatch):
    for module in ("store.sqlite", "store.postgres.panes"):  # as a store from before holds its every correction
        monkeypatch.setattr(f"{module}.CORRECTIONS_DROPPED_PER_COMMIT", 2)
    starts = [T0, T0 + 20_000, T0 + 40_000]
    store.commit_batch(commit(0, [part(s) for s in starts], max_event=T0 + 90_000), lateness_ms=LATENESS, now_ms=1)
    store.commit_batch(commit(1, [part(s) for s in starts], max_event=T0 + 90_000), lateness_ms=LATENESS, now_ms=2)
    assert len(store.corrections()) == 3
    day = 86_400_000
    store.commit_batch(commit(2, [], now=T0 + day + 60_000), lateness_ms=LATENESS, now_ms=3, retention_ms={"s": day})
    assert len(store.corrections()) == 1 and store.read_panes("s", 0, 2**62) == []
    store.commit_batch(commit(3, [], now=T0 + day + 61_000), lateness_ms=LATENESS, now_ms=4, retention_ms={"s": day})
    assert store.corrections() == []


def test_the_retention_run_reads_the_corrections_due_not_every_correction_kept(tmp_path):
    """Each commit of a retention run looks for corrections past the horizon: a range of the index
    by pane, not a walk over the ~140 a second a stream with stragglers keeps (counted, not timed)."""
    steps = {}
    for kept in (20, 2_000):
        store = SqlitePaneStore(tmp_path / f"{kept}.db", synchronous="OFF")
        store._conn.executemany(
            "INSERT INTO corrections (stream, pane_start_ms, pane_end_ms, dims, revision_from, revision_to, pipeline,"
            " batch_id, events_added, at_ms, old, new) VALUES ('s', ?, ?, '{}', 1, 2, 'main', 0, 1, ?, '{}', '{}')",
            [(T0 + i * PANE, T0 + (i + 1) * PANE, T0 + i * PANE) for i in range(kept)])  # all inside the retention
        _, steps[kept] = counted_steps(store._conn, lambda: store.commit_batch(
            commit(0, [], now=T0 + 3_600_000), lateness_ms=LATENESS, now_ms=1, retention_ms={"s": 86_400_000}))
        assert len(store.corrections(limit=10_000)) == kept
        store.close()
    assert steps[2_000] <= 2 * steps[20] + 2, steps  # 100 times the corrections, the same work


def test_an_old_store_file_is_migrated(tmp_path):
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(
            "CREATE TABLE changes (seq INTEGER PRIMARY KEY AUTOINCREMENT, stream TEXT NOT NULL, start_ms INTEGER NOT NULL,"
            " dims TEXT NOT NULL, revision INTEGER NOT NULL, batch_id INTEGER NOT NULL, count_added INTEGER NOT NULL,"
            " at_ms INTEGER NOT NULL);"
            "CREATE TABLE stream_progress (stream TEXT PRIMARY KEY, watermark_ms INTEGER, max_event_ms INTEGER,"
            " events_aggregated INTEGER NOT NULL DEFAULT 0);"
            "INSERT INTO stream_progress VALUES ('s', 1, 2, 40);"
            "CREATE TABLE pattern_progress (pattern TEXT PRIMARY KEY, watermark_ms INTEGER, matches INTEGER NOT NULL,"
            " late_events INTEGER NOT NULL);"
            "INSERT INTO pattern_progress VALUES ('cs', 5, 2, 1);")
    store = SqlitePaneStore(path)
    s = store.progress("main").streams["s"]
    assert (s.events_read, s.events_aggregated, s.events_dead_lettered) == (40, 40, 0)
    cs = store.pattern_sizes()["cs"]
    assert (cs.matches, cs.late_events, cs.dropped_runs) == (2, 1, 0)  # a counter added since
    store.commit_batch(commit(0, [part(T0)]), lateness_ms=LATENESS, now_ms=1)
    assert store.changes_since(0)[0].correction_id is None
    store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_a_store_written_by_a_newer_version_is_refused_untouched(store_backend):
    store = store_backend.create()
    store.commit_batch(commit(0, [part(T0)], max_event=T0), lateness_ms=LATENESS, now_ms=1)
    store.close()
    store_backend.set_schema_version(store, SCHEMA_VERSION + 1)
    with pytest.raises(StoreVersionError, match=f"schema version {SCHEMA_VERSION + 1}.*newer Sketchboard"):
        store_backend.reopen(store)
    store_backend.set_schema_version(store, SCHEMA_VERSION)
    again = store_backend.reopen(store)
    assert [p.data.count for p in again.read_panes("s", 0, 2**62)] == [1]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 3)), min_size=1, max_size=12))
def test_watermark_in_the_store_never_decreases_and_corrections_match_the_rule(store_backend, batches):
    """Random batches (newest event offset in panes, events per batch): the stored watermark
    never goes back, and exactly the merges into panes final before their batch are corrections."""
    store = store_backend.create()
    wm, revisions, expected = None, {}, 0
    for batch_id, (max_pane, n_late) in enumerate(batches):
        starts = sorted({T0 + max_pane * PANE, *(T0 + i * PANE for i in range(n_late))})
        store.commit_batch(commit(batch_id, [part(s) for s in starts], max_event=T0 + max_pane * PANE),
                           lateness_ms=LATENESS, now_ms=batch_id)
        for s in starts:
            final = is_final(wm, s + PANE)
            expected += final
            revisions[s] = next_revision(revisions.get(s), final)
        new_wm = store.watermarks()["s"]
        assert wm is None or new_wm >= wm
        wm = new_wm
    assert len(store.corrections(limit=10_000)) == expected
    assert {p.key.start_ms: p.revision for p in store.read_panes("s", 0, 2**62)} == revisions
    store.close()


@pytest.mark.parametrize(("step", "window"), [(PANE, PANE), (PANE, 3 * PANE), (2 * PANE, 4 * PANE)])
def test_a_correction_changes_every_window_covering_the_pane_and_no_other(store, step, window):
    from store.rollup import rollup

    starts = [T0 + i * PANE for i in range(12)]
    store.commit_batch(commit(0, [part(s, [1.0, 2.0]) for s in starts], max_event=T0 + 200_000),
                       lateness_ms=LATENESS, now_ms=1)

    def points():
        series = rollup(store.read_panes("s", T0, T0 + 200_000), stat="sum", quantile=None, value_field="v",
                        distinct_field=None, start_ms=T0, end_ms=T0 + 120_000, step_ms=step, window_ms=window,
                        pane_ms=PANE, watermark_ms=store.watermarks()["s"])
        return {p.t_ms: p for p in series[0].points}

    before = points()
    corrected = T0 + 5 * PANE
    store.commit_batch(commit(1, [part(corrected, [100.0])]), lateness_ms=LATENESS, now_ms=2)
    after = points()
    for t, p in after.items():
        covers = t <= corrected < t + window
        assert p.value == before[t].value + (100.0 if covers else 0.0)
        assert p.revision == (2 if covers else 1) and p.final


# -- watermarks per partition (store/watermarks.py) in the store's commit ---------------


def test_a_partition_with_unread_records_holds_the_watermark_and_progress_shows_it(store_backend):
    """Partition 0 read to the log's end up to T0 + 60 s, partition 1 only up to T0 + 20 s with
    records left: the watermark is partition 1's, kept across a reopen, and moves on (never
    back) once partition 1 is caught up."""
    store = store_backend.create()

    def partitioned(batch_id: int, read: dict, newest: dict, ends: dict) -> BatchCommit:
        partial = part(pane_start(max(newest.values()), PANE))
        return BatchCommit("main", batch_id, [partial], 1, {"s": max(newest.values())}, {"s": read},
                           read_by_stream={"s": 1}, partition_max_event_ms={"s": newest}, log_end_offsets={"s": ends})

    assert store.commit_batch(partitioned(0, {0: 50, 1: 10}, {0: T0 + 60_000, 1: T0 + 20_000}, {0: 50, 1: 40}),
                              lateness_ms=LATENESS, now_ms=T0).committed
    assert store.watermarks() == {"s": T0 + 20_000 - 30_000}
    store = store_backend.reopen(store)
    s = store.progress("main").streams["s"]
    assert s.held_by_partition == 1 and s.max_event_ms == T0 + 60_000
    assert {p: (pp.mark.max_event_ms, pp.mark.read_offset, pp.mark.log_end_offset, pp.state)
            for p, pp in s.partitions.items()} == {0: (T0 + 60_000, 50, 50, "caught_up"),
                                                   1: (T0 + 20_000, 10, 40, "active")}
    # Partition 1 catches up with older events than partition 0's: the stream-wide newest rules.
    assert store.commit_batch(partitioned(1, {1: 40}, {1: T0 + 30_000}, {0: 50, 1: 40}),
                              lateness_ms=LATENESS, now_ms=T0 + 1).committed
    assert store.watermarks() == {"s": T0 + 60_000 - 30_000}
    assert store.progress("main").streams["s"].held_by_partition is None
    # Idle: partition 1 gets a backlog but nothing is read from it for the timeout.
    assert store.commit_batch(partitioned(2, {0: 60}, {0: T0 + 90_000}, {0: 60, 1: 90}),
                              lateness_ms=LATENESS, now_ms=T0 + 2, idle_timeout_ms={"s": 1_000}).committed
    assert store.watermarks() == {"s": T0 + 60_000 - 30_000}  # held by 1 at its own, never back
    assert store.commit_batch(partitioned(3, {0: 70}, {0: T0 + 95_000}, {0: 70, 1: 90}),
                              lateness_ms=LATENESS, now_ms=T0 + 2_000, idle_timeout_ms={"s": 1_000}).committed
    assert store.watermarks() == {"s": T0 + 95_000 - 30_000}
    assert store.progress("main").streams["s"].partitions[1].state == "idle"


IDLE_CATALOG = ("streams:\n  s:\n    time_field: ts\n    key_field: k\n    partitions: 2\n"
                "    allowed_lateness: 30s\n    partition_idle_timeout: 5m\n")
IDLE_TIMEOUT = {"s": 300_000}


def two_partitions(batch_id: int, read: dict, newest: dict, ends: dict, batch_now: int) -> BatchCommit:
    """A batch of stream s's two partitions, judged at `batch_now` (the pipeline's batch clock)."""
    partial = part(pane_start(max(newest.values()), PANE))
    return BatchCommit("main", batch_id, [partial], 1, {"s": max(newest.values())}, {"s": read},
                       read_by_stream={"s": 1}, partition_max_event_ms={"s": newest}, log_end_offsets={"s": ends},
                       batch_now_ms=batch_now)


def test_a_wall_clock_stepped_back_does_not_make_an_idle_partition_hold_the_watermark_again(store_backend):
    """Partition 1 is stuck with unread records and goes idle after the timeout; then the host's
    clock steps back an hour while partition 0 is read on. The batch clock holds the last commit's
    instant (aggregates/batch_clock.py), and idleness is judged at it: partition 1 stays idle and
    the watermark follows partition 0 (judged at the wall clock, it was `active` again and held
    the watermark for the hour). The batch's sessions and joins see the watermark the store keeps."""
    from aggregates.batch_clock import batch_now_ms
    from aggregates.joins import stream_watermarks_after

    store, catalog = store_backend.create(), parse_catalog(IDLE_CATALOG)
    commit_at = dict(lateness_ms=LATENESS, idle_timeout_ms=IDLE_TIMEOUT)
    assert store.commit_batch(two_partitions(0, {0: 10, 1: 10}, {0: T0, 1: T0}, {0: 10, 1: 50}, T0),
                              now_ms=T0, **commit_at).committed
    at_6m = T0 + 360_000
    assert store.commit_batch(two_partitions(1, {0: 20, 1: 10}, {0: at_6m}, {0: 20, 1: 50}, at_6m),
                              now_ms=at_6m + 500, **commit_at).committed
    assert store.watermarks() == {"s": at_6m - 30_000}
    assert store.progress("main").streams["s"].partitions[1].state == "idle"
    for i, minutes in enumerate((7, 30, 60), start=2):  # real time goes on; the wall clock is an hour behind it
        real = T0 + minutes * 60_000
        wall = real - 3_600_000
        batch = two_partitions(i, {0: 20 + i, 1: 10}, {0: real}, {0: 20 + i, 1: 50},
                               batch_now_ms(wall, store.last_commit_ms("main")))
        seen_by_sessions = stream_watermarks_after(store, catalog, ["s"], batch, now_ms=batch.batch_now_ms)["s"]
        assert store.commit_batch(batch, now_ms=wall + 500, **commit_at).committed
        stream = store.progress("main").streams["s"]
        assert stream.watermark_ms == real - 30_000 == seen_by_sessions, minutes
        assert stream.held_by_partition is None and stream.partitions[1].state == "idle"


def test_sessions_and_joins_close_on_the_watermark_the_store_commits(store_backend):
    """A batch that starts just before partition 1's idle timeout and commits just after it: the
    store judges idleness at the batch's instant, as its sessions and joins did before the commit
    (aggregates/joins.py stream_watermarks_after), so what closed is the watermark stored. Judged
    at the commit's clock, partition 1 was idle there and the store moved past what sessions saw."""
    from aggregates.joins import stream_watermarks_after

    store, catalog = store_backend.create(), parse_catalog(IDLE_CATALOG)
    commit_at = dict(lateness_ms=LATENESS, idle_timeout_ms=IDLE_TIMEOUT)
    assert store.commit_batch(two_partitions(0, {0: 10, 1: 10}, {0: T0, 1: T0}, {0: 10, 1: 50}, T0),
                              now_ms=T0, **commit_at).committed
    batch = two_partitions(1, {0: 20, 1: 10}, {0: T0 + 290_000}, {0: 20, 1: 50}, batch_now=T0 + 299_000)
    seen_by_sessions = stream_watermarks_after(store, catalog, ["s"], batch, now_ms=batch.batch_now_ms)["s"]
    assert store.commit_batch(batch, now_ms=T0 + 301_000, **commit_at).committed  # a 2 s batch
    stream = store.progress("main").streams["s"]
    assert stream.watermark_ms == seen_by_sessions == T0 - 30_000
    assert stream.held_by_partition == 1 and stream.partitions[1].state == "active"
    # The store's clock still records when it took the batch.
    assert store.last_commit_ms("main") == T0 + 301_000


def test_a_batch_reads_the_watermarks_before_it_without_counting_the_panes(store_backend, monkeypatch):
    """Every batch with sessions or a join reads the stored progress (stream_watermarks_after):
    without the pane and correction counts, which read every pane (~130 ms a batch at a day of
    3 M events on SQLite)."""
    from aggregates.joins import stream_watermarks_after

    store, catalog = store_backend.create(), parse_catalog(IDLE_CATALOG)
    asked, progress = [], store.progress
    monkeypatch.setattr(store, "progress", lambda pipeline, **kw: asked.append(kw) or progress(pipeline, **kw))
    batch = two_partitions(0, {0: 10, 1: 10}, {0: T0, 1: T0}, {0: 10, 1: 50}, T0)
    assert stream_watermarks_after(store, catalog, ["s"], batch, now_ms=T0) == {"s": T0 - 30_000}
    assert asked == [{"row_counts": False}]


def test_the_last_commit_time_is_the_newest_batch_s_of_its_pipeline(store):
    """What a restarted pipeline's batch clock starts from (aggregates/batch_clock.py): one query,
    not the whole progress() the status page reads."""
    assert store.last_commit_ms("main") is None
    store.commit_batch(commit(0, [part(T0)], max_event=T0), lateness_ms=LATENESS, now_ms=T0 + 5)
    store.commit_batch(commit(1, [], now=T0 + 9), lateness_ms=LATENESS, now_ms=T0 + 9)
    assert store.last_commit_ms("main") == T0 + 9 == store.progress("main").last_commit_ms
    assert store.last_commit_ms("other") is None

"""The patterns' state, matches and late events in the store (store/patterns.py), the same
contract on SQLite and PostgreSQL: saved with the batch's transaction once, read back by key and
by due time, deleted when a key holds nothing, paged and filtered, counted for the status."""

from __future__ import annotations

from dataclasses import replace

import pytest

from store import BatchCommit
from store.patterns import (BufferedEvent, HistoryEvent, KeyState, LateEvent, NewMatch, PatternCommit, PatternSizes,
                            PublishedMatch)

T0 = 1_700_000_000_000
RUN = {"last": [T0, "logins", 0, 1], "runs": [{"taken": [], "count": 1, "blocked": [], "deadline": None}],
       "waiting": []}


def commit(batch_id: int, *patterns: PatternCommit) -> BatchCommit:
    return BatchCommit(pipeline="main", batch_id=batch_id, partials=[], events_read=0, patterns=list(patterns))


def match(key: str, at: int, n: int = 1) -> NewMatch:
    return NewMatch(key, at, [{"step": "a", "stream": "logins", "partition": 0, "offset": n, "time": at}], {"n": n})


def test_pattern_state_matches_and_late_events_are_saved_with_the_batch_once(store_backend):
    store = store_backend.create()
    assert store.pattern_state("cs", ["alice"], T0).watermark_ms is None
    first = PatternCommit(
        "cs", T0,
        keys={"alice": KeyState(RUN, (["logins", 0, 3, T0 + 50, {"outcome": "failure"}],), T0 + 50, 1),
              "bob": KeyState(RUN, (), T0 + 600_000, 1)},
        matches=[match("alice", T0 - 5), match("bob", T0 - 1, 2)],
        late=[LateEvent("logins", 1, 9, T0 - 100, T0)], dropped_runs=3)
    assert store.commit_batch(commit(0, first), lateness_ms={}, now_ms=T0).committed
    assert not store.commit_batch(commit(0, first), lateness_ms={}, now_ms=T0).committed  # a replay: nothing twice
    store = store_backend.reopen(store)  # a restart reads the same state
    # By key, or by due time: bob is not due until T0 + 10m and was not asked for.
    load = store.pattern_state("cs", ["alice"], T0 + 100)
    assert load.watermark_ms == T0 and sorted(load.keys) == ["alice"]
    assert load.keys["alice"].buffered == (["logins", 0, 3, T0 + 50, {"outcome": "failure"}],)
    assert load.keys["alice"].state == RUN
    assert sorted(store.pattern_state("cs", [], T0 + 600_000).keys) == ["alice", "bob"]
    assert store.pattern_state("other", ["alice"], T0).keys == {}  # patterns apart
    assert store.pattern_sizes() == {"cs": PatternSizes(T0, keys_held=2, partial_matches=2, buffered_events=1,
                                                        matches=2, late_events=1, dropped_runs=3)}
    page = store.pattern_matches("cs")
    assert [(m.key, m.decided_at_ms, m.measures, m.late, m.batch_id) for m in page] == [
        ("alice", T0 - 5, {"n": 1}, False, 0), ("bob", T0 - 1, {"n": 2}, False, 0)]
    assert page[0].events[0]["offset"] == 1
    assert store.pattern_late("cs") == [("logins", 1, 9, T0 - 100, T0, 0)]
    # A later batch: alice holds nothing any more (deleted), a third match; the watermark moves.
    second = PatternCommit("cs", T0 + 100, keys={"alice": KeyState()}, matches=[match("bob", T0 + 90, 3)],
                           dropped_runs=2)
    assert store.commit_batch(commit(1, second), lateness_ms={}, now_ms=T0).committed
    assert sorted(store.pattern_state("cs", ["alice", "bob"], None).keys) == ["bob"]
    assert store.pattern_sizes()["cs"] == PatternSizes(T0 + 100, keys_held=1, partial_matches=1, matches=3,
                                                       late_events=1, dropped_runs=5)
    # Paging by id, filters by key and decided time.
    ids = [m.id for m in store.pattern_matches("cs")]
    assert len(ids) == 3 and ids == sorted(ids)
    assert [m.id for m in store.pattern_matches("cs", after_id=ids[0], limit=1)] == [ids[1]]
    assert [m.decided_at_ms for m in store.pattern_matches("cs", key="bob")] == [T0 - 1, T0 + 90]
    assert [m.decided_at_ms for m in store.pattern_matches("cs", start_ms=T0 - 1, end_ms=T0 + 90)] == [T0 - 1]


def test_a_failed_commit_saves_no_pattern_state(store_backend):
    store = store_backend.create()
    bad = BatchCommit(pipeline="main", batch_id=0, partials=[], events_read=0, read_by_stream={"x": 3},
                      patterns=[PatternCommit("cs", T0, keys={"alice": KeyState(RUN, (), T0, 1)},
                                              matches=[match("alice", T0)])])
    with pytest.raises(ValueError):
        store.commit_batch(bad, lateness_ms={}, now_ms=T0)
    assert store.pattern_sizes() == {} and store.pattern_matches("cs") == []


def test_buffered_events_are_rows_released_by_time_with_their_keys_and_deleted_past_the_watermark(store_backend):
    store = store_backend.create()
    failure = {"outcome": "failure", "ip": "10.0.0.9"}
    buffered = [BufferedEvent("alice", "logins", 0, 3, T0 + 50, failure), BufferedEvent("bob", "logins", 1, 4, T0 + 70, {}),
                BufferedEvent("carol", "logins", 0, 5, T0 + 900, failure)]
    first = PatternCommit("cs", T0, keys={"alice": KeyState(RUN, (), T0 + 600_000, 1)}, buffer=buffered)
    assert store.commit_batch(commit(0, first), lateness_ms={}, now_ms=T0).committed
    store = store_backend.reopen(store)
    assert store.pattern_sizes()["cs"] == PatternSizes(T0, keys_held=3, partial_matches=1, buffered_events=3)
    # Up to T0 + 100: alice's and bob's events, and the state of their keys (bob has none), not carol's.
    load = store.pattern_state("cs", [], T0 + 100)
    assert sorted(load.released) == buffered[:2] and sorted(load.keys) == ["alice"]
    assert load.keys["alice"].state == RUN
    assert store.pattern_state("cs", [], None).released == []  # no watermark yet: nothing released
    # The next batch released them (its watermark passed them) and buffers carol's event again: kept once.
    second = PatternCommit("cs", T0 + 100, buffer=[buffered[2]])
    assert store.commit_batch(commit(1, second), lateness_ms={}, now_ms=T0).committed
    assert store.pattern_state("cs", [], T0 + 1000).released == [buffered[2]]
    assert store.pattern_sizes()["cs"] == PatternSizes(T0 + 100, keys_held=2, partial_matches=1, buffered_events=1)


def test_history_rows_are_kept_per_key_rewritten_and_cut_and_a_retraction_names_the_match(store_backend):
    store = store_backend.create()
    failure = {"outcome": "failure", "ip": "10.0.0.9"}
    rows = [HistoryEvent("alice", "logins", 0, 3, T0 + 50, failure, True),
            HistoryEvent("alice", "logins", 0, 4, T0 + 60, failure, False),
            HistoryEvent("bob", "logins", 1, 5, T0 + 70, {}, True)]
    alices = replace(match("alice", T0 + 60), dims={"ip": "10.0.0.9"})
    first = PatternCommit("cs", T0 + 100, matches=[alices, match("bob", T0 + 70, 2)], history=rows)
    assert store.commit_batch(commit(0, first), lateness_ms={}, now_ms=T0).committed
    store = store_backend.reopen(store)
    assert store.pattern_sizes()["cs"].history_rows == 3  # the events kept for replays, in the status
    load = store.pattern_state("cs", [], None, history_keys=["alice", "carol"])
    assert load.history == {"alice": rows[:2]}  # only the keys asked for, in event-time order
    # With them, the keys' published matches: a retraction goes to its match's dimensions and late value.
    assert load.published == {"alice": [PublishedMatch(T0 + 60, alices.events, {"ip": "10.0.0.9"}, False)]}
    assert store.pattern_state("other", [], None, history_keys=["alice"]).history == {}
    # A replay rewrote alice's rows (a late event in between, restarts recomputed); the cut drops
    # every row before it; a retraction names the match it withdraws; counted net.
    late = HistoryEvent("alice", "logins", 2, 9, T0 + 55, failure, False)
    retraction = NewMatch("alice", T0 + 60, match("alice", T0 + 60).events, {"n": 1}, late=True, retraction=True,
                          dims={"ip": "10.0.0.9"})
    added = NewMatch("alice", T0 + 55, match("alice", T0 + 55, 9).events, {"n": 9}, late=True)
    second = PatternCommit("cs", T0 + 200, matches=[retraction, added], history_rewritten=["alice"],
                           history=[rows[0], late, rows[1]._replace(restart=True)], history_cut_ms=T0 + 55)
    assert store.commit_batch(commit(1, second), lateness_ms={}, now_ms=T0).committed
    assert not store.commit_batch(commit(1, second), lateness_ms={}, now_ms=T0).committed  # a replay: nothing twice
    history = store.pattern_state("cs", [], None, history_keys=["alice", "bob"]).history
    assert history == {"alice": [late, rows[1]._replace(restart=True)], "bob": [rows[2]]}
    page = store.pattern_matches("cs")
    assert [(m.key, m.decided_at_ms, m.late, m.retracts, m.dims) for m in page] == [
        ("alice", T0 + 60, False, None, {"ip": "10.0.0.9"}), ("bob", T0 + 70, False, None, {}),
        ("alice", T0 + 60, True, page[0].id, {"ip": "10.0.0.9"}), ("alice", T0 + 55, True, None, {})]
    assert store.pattern_sizes()["cs"].history_rows == 3  # alice's rewritten and cut, bob's
    assert store.pattern_sizes()["cs"].matches == 2  # two, less one retracted, plus one added


def test_a_sqlite_store_written_before_matches_had_dimensions_gains_the_column(tmp_path):
    import sqlite3

    from store import SqlitePaneStore
    from store.patterns import PATTERN_TABLES

    old = PATTERN_TABLES.replace(
        "    retracts INTEGER,               -- set on a retraction: the id of the match it withdraws\n", "    retracts INTEGER\n")
    old = "\n".join(line for line in old.splitlines() if not line.lstrip().startswith("dims TEXT"))
    with sqlite3.connect(tmp_path / "store.db") as conn:
        conn.executescript(old)
        conn.execute("INSERT INTO pattern_matches (pattern, pattern_key, decided_at_ms, events, measures, late, batch_id,"
                     " committed_at_ms) VALUES ('cs', 'alice', 1, '[]', '{}', 0, 0, 0)")
    store = SqlitePaneStore(tmp_path / "store.db")
    assert [(m.key, m.dims) for m in store.pattern_matches("cs")] == [("alice", {})]  # none kept: no dimensions
    assert store.commit_batch(commit(0, PatternCommit("cs", T0, matches=[replace(match("bob", T0), dims={"ip": "x"})])),
                              lateness_ms={}, now_ms=T0).committed
    assert [m.dims for m in store.pattern_matches("cs")] == [{}, {"ip": "x"}]
    store.close()

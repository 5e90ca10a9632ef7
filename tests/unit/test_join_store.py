"""The window joins' state in the store (store/joins.py), the same contract on SQLite and
PostgreSQL: saved with the batch's transaction once, read back by key and by expiry, pruned by
time, counted for the status."""

from __future__ import annotations

import pytest

from store import BatchCommit
from store.joins import JoinCommit, JoinEvent, JoinSizes
from tests.sqlite_steps import counted_steps

T0 = 1_700_000_000_000


def commit(batch_id: int, join: JoinCommit) -> BatchCommit:
    return BatchCommit(pipeline="main", batch_id=batch_id, partials=[], events_read=0, joins=[join])


def test_join_state_is_saved_with_the_batch_once_and_read_by_key_and_expiry(store_backend):
    store = store_backend.create()
    assert store.join_state("sc", ["s1"], None).clock_ms is None
    first = JoinCommit("sc", T0, None,
                       lefts=[JoinEvent(T0, 0, 1, "s1", ("books", None)), JoinEvent(T0 + 5, 1, 2, "s2", ("toys", "x"))],
                       rights=[JoinEvent(T0 + 1, 0, 7, "s9"), JoinEvent(T0 + 2, 0, 8, "s1", (), True)], pairs=1)
    assert store.commit_batch(commit(0, first), lateness_ms={}, now_ms=T0).committed
    assert not store.commit_batch(commit(0, first), lateness_ms={}, now_ms=T0).committed  # a replay: nothing twice
    store = store_backend.reopen(store)  # a restart reads the same state
    state = store.join_state("sc", ["s1"], None)
    assert state.clock_ms == T0
    assert list(state.lefts) == [JoinEvent(T0, 0, 1, "s1", ("books", None))]
    assert list(state.rights) == [JoinEvent(T0 + 2, 0, 8, "s1", (), True)]
    # Expiring right events are read whatever their key: the batch judges them.
    assert [e.key for e in store.join_state("sc", [], T0 + 1).rights] == ["s9"]
    assert store.join_state("other", ["s1"], None) == store.join_state("other", [], None)  # joins apart
    assert store.join_sizes() == {"sc": JoinSizes(T0, left_rows=2, right_rows=2, pending_right=1, pairs=1)}
    # A later batch marks a left matched, and expires what is at or before T0 + 1.
    second = JoinCommit("sc", T0 + 100, T0 + 1, lefts=[JoinEvent(T0 + 5, 1, 2, "s2", ("toys", "x"), True)],
                        pairs=2, unmatched_right=1)
    assert store.commit_batch(commit(1, second), lateness_ms={}, now_ms=T0).committed
    assert list(store.join_state("sc", ["s1", "s2"], None).lefts) == [JoinEvent(T0 + 5, 1, 2, "s2", ("toys", "x"), True)]
    assert store.join_sizes()["sc"] == JoinSizes(T0 + 100, left_rows=1, right_rows=1, pending_right=0, pairs=3,
                                                 unmatched_right=1)


def test_an_event_named_twice_in_a_commit_keeps_its_last_row(store_backend):
    """A batch's events are written in bulk (PostgreSQL: COPY, then one INSERT ... ON CONFLICT,
    which may not touch a row twice): an event the commit names twice, new then matched, is kept
    once, as its last row says, and the other events beside it all."""
    store = store_backend.create()
    lefts = [JoinEvent(T0 + i, i % 2, i, f"s{i}", ("books",)) for i in range(300)]
    lefts.append(JoinEvent(T0 + 7, 1, 7, "s7", ("books",), True))
    rights = [JoinEvent(T0 + 1, 0, 1, "s1"), JoinEvent(T0 + 1, 0, 1, "s1", (), True)]
    join = JoinCommit("sc", T0, None, lefts=lefts, rights=rights, pairs=1)
    assert store.commit_batch(commit(0, join), lateness_ms={}, now_ms=T0).committed
    state = store.join_state("sc", ["s1", "s7", "s8"], None)
    assert list(state.lefts) == [lefts[1], lefts[-1], lefts[8]]
    assert list(state.rights) == [rights[-1]]
    assert store.join_sizes()["sc"] == JoinSizes(T0, left_rows=300, right_rows=1, pending_right=0, pairs=1)


def test_a_failed_commit_saves_no_join_state(store_backend):
    store = store_backend.create()
    bad = BatchCommit(pipeline="main", batch_id=0, partials=[], events_read=0, read_by_stream={"x": 3},
                      joins=[JoinCommit("sc", T0, None, lefts=[JoinEvent(T0, 0, 1, "s1")])])
    with pytest.raises(ValueError):
        store.commit_batch(bad, lateness_ms={}, now_ms=T0)
    assert store.join_sizes() == {} and list(store.join_state("sc", ["s1"], None).lefts) == []


def test_a_right_event_both_of_a_key_and_expiring_is_read_once(store_backend):
    store = store_backend.create()
    rights = [JoinEvent(T0 + 1, 0, 7, "s1"), JoinEvent(T0 + 2, 0, 8, "s2"), JoinEvent(T0 + 50, 0, 9, "s1")]
    assert store.commit_batch(commit(0, JoinCommit("sc", T0, None, rights=rights)), lateness_ms={}, now_ms=T0).committed
    assert list(store.join_state("sc", ["s1"], T0 + 2).rights) == rights  # s1's both, and s2's as it expires
    assert list(store.join_state("sc", ["s1"], None).rights) == [rights[0], rights[2]]
    assert list(store.join_state("sc", [], T0 + 1).rights) == [rights[0]]
    clock_alone = store.join_state("sc", [], None)
    assert clock_alone.clock_ms == T0 and not clock_alone.lefts and not clock_alone.rights


def test_a_lookup_reads_the_keys_and_the_expiring_events_not_every_event_of_the_join(tmp_path):
    """SQLite's work, counted in its virtual machine's steps: a lookup of a few keys, or of the
    join's clock alone, must not grow with the right events the join keeps (a `key IN (...) OR
    time_ms <= ?` read them all through the index on the join's name)."""
    from store import SqlitePaneStore

    store = SqlitePaneStore(tmp_path / "store.db")

    def steps(keys, through) -> int:
        return counted_steps(store._conn, lambda: store.join_state("sc", keys, through))[1]

    few = steps(["s1"], T0 + 1)
    rights = [JoinEvent(T0 + 10 + i, 0, i, f"s{i % 5_000}") for i in range(20_000)]
    assert store.commit_batch(commit(0, JoinCommit("sc", T0, None, rights=rights)), lateness_ms={}, now_ms=T0).committed
    assert steps(["s1"], T0 + 1) < few + 500  # four events of s1, none expiring
    assert steps([], None) < few + 500  # the clock alone
    store.close()

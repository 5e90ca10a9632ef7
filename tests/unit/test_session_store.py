"""The open sessions in the store (store/sessions.py), the same contract on SQLite and PostgreSQL:
saved with the batch's transaction once, read back by key and by due time, counted per stream."""

from __future__ import annotations

import pytest

from store import BatchCommit
from store.sessions import Session, SessionCommit

T0 = 1_700_000_000_000


def commit(batch_id: int, *sessions: SessionCommit) -> BatchCommit:
    return BatchCommit(pipeline="main", batch_id=batch_id, partials=[], events_read=0, sessions=list(sessions))


def test_open_sessions_are_saved_with_the_batch_once_and_read_by_key_and_due_time(store_backend):
    store = store_backend.create()
    assert store.session_state("web", ["u1"], None) == [] and store.session_sizes() == {}
    first = SessionCommit("web", kept=[Session("u1", T0, T0 + 10, 2), Session("u2", T0 + 5, T0 + 5, 1),
                                       Session("u1", T0 + 900, T0 + 950, 3)])
    assert store.commit_batch(commit(0, first, SessionCommit("app", kept=[Session("u1", T0, T0, 1)])),
                              lateness_ms={}, now_ms=T0).committed
    assert not store.commit_batch(commit(0, first), lateness_ms={}, now_ms=T0).committed  # a replay: nothing twice
    store = store_backend.reopen(store)  # a restart reads the same state
    assert store.session_state("web", ["u1"], None) == [Session("u1", T0, T0 + 10, 2), Session("u1", T0 + 900, T0 + 950, 3)]
    # Sessions due to close are read whatever their key: the batch closes them.
    assert store.session_state("web", [], T0 + 5) == [Session("u2", T0 + 5, T0 + 5, 1)]
    assert store.session_state("web", ["u9"], T0 + 10) == [Session("u1", T0, T0 + 10, 2), Session("u2", T0 + 5, T0 + 5, 1)]
    assert store.session_state("app", ["u1"], None) == [Session("u1", T0, T0, 1)]  # streams apart
    assert store.session_sizes() == {"web": 3, "app": 1}
    # A later batch: u1's first session grows (same first event), u2's closes, a new one opens.
    second = SessionCommit("web", removed=[Session("u1", T0, T0 + 10, 2), Session("u2", T0 + 5, T0 + 5, 1)],
                           kept=[Session("u1", T0, T0 + 20, 3), Session("u3", T0 + 30, T0 + 30, 1)])
    assert store.commit_batch(commit(1, second), lateness_ms={}, now_ms=T0).committed
    assert store.session_state("web", ["u1", "u2", "u3"], None) == [
        Session("u1", T0, T0 + 20, 3), Session("u1", T0 + 900, T0 + 950, 3), Session("u3", T0 + 30, T0 + 30, 1)]
    assert store.session_sizes() == {"web": 3, "app": 1}


def test_a_failed_commit_saves_no_session(store_backend):
    store = store_backend.create()
    bad = BatchCommit(pipeline="main", batch_id=0, partials=[], events_read=0, read_by_stream={"x": 3},
                      sessions=[SessionCommit("web", kept=[Session("u1", T0, T0, 1)])])
    with pytest.raises(ValueError):
        store.commit_batch(bad, lateness_ms={}, now_ms=T0)
    assert store.session_sizes() == {} and store.session_state("web", ["u1"], None) == []


def test_open_sessions_are_read_in_code_point_order_of_their_keys_and_written_in_bulk(store_backend):
    """Whatever the database's collation, the lookup's order is Python's (the rule relies on no
    order, the contract does); a batch of many sessions is written and grown in one commit."""
    store = store_backend.create()
    keys = ["b", "B", "é", "z", "😀", "a b", "ab"]
    many = [Session(f"k{i}", T0 + i, T0 + i + 5, 1) for i in range(3000)]
    kept = [Session(k, T0, T0 + 1, 1) for k in keys] + many
    assert store.commit_batch(commit(0, SessionCommit("web", kept=kept)), lateness_ms={}, now_ms=T0).committed
    assert list(store.session_state("web", keys, None)) == sorted(Session(k, T0, T0 + 1, 1) for k in keys)
    grown = [Session(s.key, s.first_ms, s.last_ms + 10, 2) for s in many]
    assert store.commit_batch(commit(1, SessionCommit("web", removed=many, kept=grown)), lateness_ms={}, now_ms=T0).committed
    assert list(store.session_state("web", [s.key for s in many], None)) == sorted(grown)
    assert store.session_sizes() == {"web": len(keys) + len(many)}
    closed = SessionCommit("web", removed=sorted(grown)[:1000])
    assert store.commit_batch(commit(2, closed), lateness_ms={}, now_ms=T0).committed
    assert store.session_sizes() == {"web": len(keys) + len(many) - 1000}

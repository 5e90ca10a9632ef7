"""Idempotency keys (store/idempotency.py): the pure decision, then the store's contract on
every store backend (SQLite and a real PostgreSQL, through the store_backend fixture): claim,
replay, mismatch, release, expiry, takeover of an abandoned claim, answers kept across a
restart, and one winner among concurrent claims."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from store.idempotency import DONE, IN_FLIGHT, IdempotencyStore, KeyRecord, Verdict, decide

TTL, IN_FLIGHT_TIMEOUT = 86_400_000, 60_000
ANSWER = {"stream": "orders", "accepted": 2, "rejected": [], "ingest_time_ms": 5, "partitions": {"0": [0, 2]}}


def verdict(existing, fingerprint="f", now=1_000_000):
    return decide(existing, fingerprint, now, ttl_ms=TTL, in_flight_timeout_ms=IN_FLIGHT_TIMEOUT).verdict


def test_a_new_key_proceeds_and_a_done_one_replays_its_answer():
    assert verdict(None) is Verdict.PROCEED
    done = KeyRecord("f", DONE, 999_000, 200, ANSWER)
    decision = decide(done, "f", 1_000_000, ttl_ms=TTL, in_flight_timeout_ms=IN_FLIGHT_TIMEOUT)
    assert decision.verdict is Verdict.REPLAY and decision.record.answer == ANSWER


def test_a_key_reused_for_another_request_is_refused_whatever_its_state():
    assert verdict(KeyRecord("other", DONE, 999_000, 200, ANSWER)) is Verdict.MISMATCH
    assert verdict(KeyRecord("other", IN_FLIGHT, 999_000)) is Verdict.MISMATCH


def test_a_young_claim_is_in_progress_and_an_abandoned_one_is_taken_over():
    assert verdict(KeyRecord("f", IN_FLIGHT, 1_000_000 - IN_FLIGHT_TIMEOUT + 1)) is Verdict.IN_PROGRESS
    assert verdict(KeyRecord("f", IN_FLIGHT, 1_000_000 - IN_FLIGHT_TIMEOUT)) is Verdict.PROCEED


def test_a_clock_stepped_back_keeps_a_claim_young():
    assert verdict(KeyRecord("f", IN_FLIGHT, 2_000_000)) is Verdict.IN_PROGRESS


@given(age=st.integers(min_value=TTL, max_value=10 * TTL), state=st.sampled_from([IN_FLIGHT, DONE]),
       same=st.booleans())
def test_an_expired_key_is_free_again_whatever_it_held(age, state, same):
    record = KeyRecord("f" if same else "g", state, 10 * TTL - age, 200 if state == DONE else None)
    assert verdict(record, now=10 * TTL) is Verdict.PROCEED


@pytest.fixture
def keys(store_backend):
    store = IdempotencyStore(store_backend.side_db(), ttl_ms=TTL, in_flight_timeout_ms=IN_FLIGHT_TIMEOUT)
    yield store
    store.close()


def test_claim_complete_replay_and_mismatch(keys):
    assert keys.claim("t orders", "k1", "f", 1000).verdict is Verdict.PROCEED
    assert keys.claim("t orders", "k1", "f", 1001).verdict is Verdict.IN_PROGRESS
    keys.complete("t orders", "k1", 200, ANSWER)
    replay = keys.claim("t orders", "k1", "f", 1002)
    assert replay.verdict is Verdict.REPLAY and (replay.record.status, replay.record.answer) == (200, ANSWER)
    assert keys.claim("t orders", "k1", "g", 1003).verdict is Verdict.MISMATCH
    # Another scope (token or stream) has keys of its own.
    assert keys.claim("u orders", "k1", "g", 1004).verdict is Verdict.PROCEED


def test_a_released_key_is_free_for_the_retry(keys):
    assert keys.claim("s", "k", "f", 1000).verdict is Verdict.PROCEED
    keys.release("s", "k")
    assert keys.claim("s", "k", "other body", 1001).verdict is Verdict.PROCEED


def test_expired_keys_are_pruned_and_free(keys, store_backend):
    keys.claim("s", "old", "f", 1000)
    keys.complete("s", "old", 200, ANSWER)
    assert keys.claim("s", "old", "f", 1000 + TTL).verdict is Verdict.PROCEED


def test_an_abandoned_claim_is_taken_over_once(keys):
    assert keys.claim("s", "k", "f", 1000).verdict is Verdict.PROCEED
    later = 1000 + IN_FLIGHT_TIMEOUT
    assert keys.claim("s", "k", "f", later).verdict is Verdict.PROCEED
    assert keys.claim("s", "k", "f", later + 1).verdict is Verdict.IN_PROGRESS


def test_a_late_first_try_neither_completes_nor_releases_the_takeovers_claim(keys):
    first = keys.claim("s", "k", "f", 1000)
    takeover = keys.claim("s", "k", "f", 1000 + IN_FLIGHT_TIMEOUT)
    assert takeover.verdict is Verdict.PROCEED and takeover.token != first.token
    assert keys.release("s", "k", first.token) is False  # the slow first try failed after all
    assert keys.claim("s", "k", "f", 1000 + IN_FLIGHT_TIMEOUT + 1).verdict is Verdict.IN_PROGRESS
    assert keys.complete("s", "k", 200, {"late": True}, first.token) is False
    assert keys.complete("s", "k", 200, ANSWER, takeover.token) is True
    assert keys.claim("s", "k", "f", 1000 + IN_FLIGHT_TIMEOUT + 2).record.answer == ANSWER


def test_a_table_made_before_claim_tokens_gets_the_column(tmp_path):
    import sqlite3

    with sqlite3.connect(tmp_path / "store.db") as conn:
        conn.execute("CREATE TABLE idempotency_keys (scope TEXT NOT NULL, idem_key TEXT NOT NULL, fingerprint TEXT"
                     " NOT NULL, state TEXT NOT NULL, claimed_ms INTEGER NOT NULL, status INTEGER, answer TEXT,"
                     " PRIMARY KEY (scope, idem_key))")
        conn.execute("INSERT INTO idempotency_keys VALUES ('s', 'old', 'f', 'in_flight', 1000, NULL, NULL)")
    keys = IdempotencyStore(tmp_path / "store.db")
    assert keys.complete("s", "old", 200, ANSWER) is True  # a claim of the old version, no token
    assert keys.claim("s", "old", "f", 2000).record.answer == ANSWER
    keys.close()


def test_on_the_stores_clock_a_replica_with_a_clock_ahead_does_not_take_over_a_young_claim(store_backend):
    """Replica B's wall clock 61 s ahead of A's judged A's claim (still appending) abandoned."""
    import time

    store = store_backend.create()
    a = IdempotencyStore(store_backend.side_db(store), store_clock=True)
    b = IdempotencyStore(store_backend.side_db(store), store_clock=True)
    now_ms = int(time.time() * 1000)
    first = a.claim("s", "k", "f", now_ms)
    assert first.verdict is Verdict.PROCEED
    assert b.claim("s", "k", "f", now_ms + IN_FLIGHT_TIMEOUT + 1000).verdict is Verdict.IN_PROGRESS
    assert a.complete("s", "k", 200, ANSWER, first.token)
    replay = b.claim("s", "k", "f", now_ms + 10 * TTL)  # nor does a clock a ttl ahead expire the answer
    assert replay.verdict is Verdict.REPLAY and abs(replay.record.claimed_ms - now_ms) < 60_000
    a.close()
    b.close()


def test_answers_survive_a_restart(store_backend):
    store = store_backend.create()
    first = IdempotencyStore(store.side_db())
    first.claim("s", "k", "f", 1000)
    first.complete("s", "k", 200, ANSWER)
    first.close()
    second = IdempotencyStore(store_backend.reopen(store).side_db())
    assert second.claim("s", "k", "f", 2000).record.answer == ANSWER
    second.close()


def test_of_concurrent_claims_exactly_one_proceeds(store_backend):
    store = store_backend.create()
    # One store object per thread, as several API processes would each have theirs.
    stores = [IdempotencyStore(store_backend.side_db(store)) for _ in range(6)]
    start, verdicts = threading.Barrier(len(stores)), []

    def claim(keys):
        start.wait()
        verdicts.append(keys.claim("s", "k", "f", 1000).verdict)

    threads = [threading.Thread(target=claim, args=(keys,)) for keys in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(v.value for v in verdicts) == ["in_progress"] * 5 + ["proceed"]
    for keys in stores:
        keys.close()


def test_bad_settings_are_refused(tmp_path):
    with pytest.raises(ValueError, match="must be positive"):
        IdempotencyStore(tmp_path / "s.db", ttl_ms=0)

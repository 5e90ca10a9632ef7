"""A dead letter's error may quote what the producer sent (an undeclared field's name in a bound's
message): where that is no text a store can hold (a NUL, a lone surrogate) it is stored as escapes,
or the batch could never be committed on PostgreSQL (psycopg.DataError at every replay). On every
store backend."""

from __future__ import annotations

from aggregates.commit import rows_to_dead_letters
from store import BatchCommit

T0 = 1_795_000_000_000


def test_an_error_quoting_unstorable_text_is_committed_with_escapes(store_backend, catalog):
    store = store_backend.create()
    error = "x\x00\ud800: integer of more than 40 digits exceeds max_int_digits"
    rows = [{"stream": "http_requests", "dead_reason": "invalid",
             "dead_records": [{"partition": 0, "offset": 5, "ingest_time": T0, "error": error}]}]
    [dead] = rows_to_dead_letters(rows, catalog)
    assert dead.error == "x\\x00\\ud800: integer of more than 40 digits exceeds max_int_digits"
    lateness = {n: s.allowed_lateness for n, s in catalog.streams.items()}
    commit = BatchCommit("main", 0, [], 1, dead_letters=[dead], read_by_stream={"http_requests": 1},
                         dead_by_stream={"http_requests": {"invalid": 1}})
    assert store.commit_batch(commit, lateness_ms=lateness, now_ms=T0).committed
    [stored] = store.dead_letters(stream="http_requests")
    assert stored.letter.error == dead.error

"""store/table_state.py: a changelog table's rows written with the batch, on every store backend
(the `store_backend` fixture: SQLite and a real PostgreSQL)."""

from __future__ import annotations

from store.base import BatchCommit
from store.table_state import TableChange

T0 = 1_700_000_000_000


def commit(batch_id: int, changes: dict) -> BatchCommit:
    return BatchCommit("main", batch_id, [], 0, table_changes=changes)


def test_rows_are_upserted_and_deleted_with_their_batch_exactly_once(store_backend):
    store = store_backend.create()
    store.commit_batch(commit(0, {"users": {"u1": TableChange({"plan": "pro", "credit": 2.0}, T0, 1, 5),
                                            "u2": TableChange({"plan": "free"}, T0 + 1, 0, 3)},
                                  "teams": {"u1": TableChange({"name": "x"}, T0, 0, 0)}}),
                       lateness_ms={}, now_ms=T0 + 100)
    row = store.table_row("users", "u1")
    assert (row.key, row.row, row.event_time_ms, row.partition, row.offset, row.updated_at_ms) == \
        ("u1", {"plan": "pro", "credit": 2.0}, T0, 1, 5, T0 + 100)
    store.commit_batch(commit(1, {"users": {"u1": TableChange(None, T0 + 2, 1, 6),
                                            "u2": TableChange({"plan": "pro"}, T0 + 3, 0, 4)}}),
                       lateness_ms={}, now_ms=T0 + 200)
    assert store.table_row("users", "u1") is None
    assert store.table_row("users", "u2").row == {"plan": "pro"}
    assert store.table_row("teams", "u1").row == {"name": "x"}  # tables are apart
    # A replayed batch id changes nothing.
    assert not store.commit_batch(commit(1, {"users": {"u2": TableChange(None, T0, 0, 4)}}),
                                  lateness_ms={}, now_ms=T0 + 300).committed
    assert store.table_row("users", "u2") is not None
    # A deleted key that was never there is no error; the rows survive reopening.
    store.commit_batch(commit(2, {"users": {"nobody": TableChange(None, T0, 0, 9)}}), lateness_ms={}, now_ms=T0)
    assert store_backend.reopen(store).table_row("users", "u2").row == {"plan": "pro"}


def test_rows_are_paged_in_key_order(store_backend):
    store = store_backend.create()
    keys = [f"k{i:03d}" for i in range(25)]
    store.commit_batch(commit(0, {"t": {k: TableChange({"n": float(i)}, T0, 0, i) for i, k in enumerate(keys)}}),
                       lateness_ms={}, now_ms=T0)
    seen, after = [], None
    while True:
        page = store.table_rows("t", after=after, limit=10)
        seen += [r.key for r in page]
        if len(page) < 10:
            break
        after = page[-1].key
    assert seen == keys
    assert store.table_rows("other") == []


# Keys whose code-point order is not a linguistic one's (en-US: 'a' < 'B', '_' and ' ' skipped, 'é' by 'e').
UNORDERED_KEYS = ["b", "B", "a", "A", "a b", "ab", "a-c", "é", "e", "z", "😀", "10", "9", "_x"]


def test_rows_are_in_code_point_order_whatever_the_database_s_collation(store_backend):
    """Key order is the code points' (docs/tables.md), as SQLite and Python order text, also in
    a PostgreSQL database collated en_US, as a deployment's usually is: pages, and `after`."""
    store = store_backend.create(linguistic=True)
    store.commit_batch(commit(0, {"t": {k: TableChange({"n": 1.0}, T0, 0, i) for i, k in enumerate(UNORDERED_KEYS)}}),
                       lateness_ms={}, now_ms=T0)
    assert [r.key for r in store.table_rows("t", limit=100)] == sorted(UNORDERED_KEYS)
    seen, after = [], None
    while page := store.table_rows("t", after=after, limit=3):
        seen += [r.key for r in page]
        after = page[-1].key
    assert seen == sorted(UNORDERED_KEYS)
    assert [r.key for r in store.table_rows("t", after="a", limit=100)] == sorted(k for k in UNORDERED_KEYS if k > "a")


def test_the_first_page_holds_a_row_keyed_empty(store_backend):
    """A row keyed "" (stored before empty keys were refused) sorts first: the first page, read as
    "after ''", missed it, and so did a view's rebuild, which pages the same way."""
    store = store_backend.create()
    store.commit_batch(commit(0, {"t": {k: TableChange({"n": 1.0}, T0, 0, i) for i, k in enumerate(["", "a", "b"])}}),
                       lateness_ms={}, now_ms=T0)
    assert [r.key for r in store.table_rows("t")] == ["", "a", "b"]
    assert [r.key for r in store.table_rows("t", limit=1)] == [""]
    assert [r.key for r in store.table_rows("t", after="", limit=5)] == ["a", "b"]  # after the key ''

"""The change feed is bounded like the rest of the store (issue 27: disk bounded by retention):
a commit with a retention run drops the change records committed before the longest stream
retention, and nothing newer; readers tailing the feed go on past the gap."""

from __future__ import annotations

from store import BatchCommit
from tests.unit.test_commit_bulk import T0, _partials

DAY = 86_400_000


def _commit(store, batch_id: int, now_ms: int, retention_ms=None) -> None:
    partials = _partials(batch_id, 6)
    store.commit_batch(BatchCommit("main", batch_id, partials, sum(p.data.count for p in partials),
                                   {"s": max(p.start_ms for p in partials)}, {}, batch_now_ms=now_ms),
                       lateness_ms={"s": 0}, now_ms=now_ms, retention_ms=retention_ms)


def test_change_records_older_than_the_longest_retention_are_dropped(store_backend):
    store = store_backend.create()
    _commit(store, 0, T0)
    _commit(store, 1, T0 + DAY)
    first = store.changes_since(0)
    assert {c.batch_id for c in first} == {0, 1}
    # Two days later, streams kept 1 and 1.5 days: batch 0's records (T0) are older than 1.5 days, batch 1's are not.
    _commit(store, 2, T0 + 2 * DAY, retention_ms={"s": DAY, "t": DAY + DAY // 2})
    kept = store.changes_since(0)
    assert {c.batch_id for c in kept} == {1, 2}
    assert [c for c in kept if c.batch_id == 1] == [c for c in first if c.batch_id == 1]
    assert store.changes_since(max(c.seq for c in kept)) == []
    _commit(store, 3, T0 + 2 * DAY)  # no retention run: nothing dropped
    assert {c.batch_id for c in store.changes_since(0)} == {1, 2, 3}

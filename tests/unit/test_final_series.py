"""A view asked again (a dashboard refreshing every second, the standard views) reuses its chunks
of final windows (store/series.py CHUNK windows, starting at multiples of CHUNK steps) while no
row under them changed (_chunk_validities, PointCache.final_chunks): one summed read instead of
every window's fingerprint and lookup, also when the view's range moved with the clock. Whatever
changes under a chunk (a straggler, retention) makes it computed again; the windows outside the
chunks (the range's ragged start, the provisional end) are computed or looked up at every query."""

from __future__ import annotations

import pytest

from store import BatchCommit
from store.point_cache import PointCache
from store.series import CHUNK, query_series
from store.tiers import TierLayout
from tests.unit.test_tiers import (LATENESS, LAYOUT, MINUTE, PANE, T0, answer, assert_same, commit_all,
                                   pane_rollup, store_at)

HOUR = 3_600_000
assert CHUNK * MINUTE == HOUR  # a chunk of 1-minute windows is an hour (T0 is an hour boundary)
# Three hours of events: the watermark ends 30 s before the last, so with 10-minute windows the
# second hour is the only chunk whose windows are all final (the first starts before the range).
HOURS = [(T0 + i * 7_000, {"a": "xy"[i % 2], "b": "pqr"[i % 3], "c": "mn"[i % 2]}, float(i % 97), f"u{i % 40}")
         for i in range(3 * 514)]


@pytest.mark.parametrize("stat", ["p90", "distinct", "count", "avg"])
@pytest.mark.parametrize("window, filters, group_by", [(MINUTE, {}, []), (10 * MINUTE, {}, []), (MINUTE, {"a": "x"}, []),
                                                      (MINUTE, {}, ["a"]), (10 * MINUTE, {"b": "q"}, ["a"])])
def test_chunks_of_final_windows_are_reused_until_a_row_under_them_changes(store_backend, stat, window, filters,
                                                                          group_by):
    """Sketch stats look for chunks once a query of the view left points in memory (or a process
    before kept them in the store); exact stats (summed by the store, nothing cached per window)
    from their first query on. A group-by's chunks hold every group's points (the first group,
    a = x, is the one the live and late events below are of)."""
    tiered, plain = store_at(store_backend, LAYOUT), store_at(store_backend, None)
    q = dict(stat=stat, start=T0 + 5 * MINUTE, end=T0 + 3 * HOUR, step=MINUTE, window=window, filters=filters,
             group_by=group_by)
    cache = PointCache()
    batches = 0

    def commit(events: list[tuple]) -> None:
        nonlocal batches
        for store in (tiered, plain):
            commit_all(store, [events], first_id=batches)
        batches += 1

    def asked(chunk_hits: int, **moved) -> list:
        ask = {**q, **moved}
        got = answer(tiered, **ask, cache=cache)
        assert_same(got, pane_rollup(plain, **ask), stat)
        assert cache.chunk_hits == chunk_hits
        return got[0].points

    try:
        commit(HOURS)
        if stat in ("p90", "distinct"):
            asked(0)  # cold: every window computed from its rows
        asked(0)  # warm: checked by every window's fingerprint; the second hour kept as a chunk
        points = asked(1)  # reused
        assert points[0].final and not points[-1].final
        asked(2, start=T0 + 6 * MINUTE, end=T0 + 3 * HOUR + MINUTE)  # the range moved a step: the same chunk
        commit([(T0 + 3 * HOUR - 2_000, {"a": "x", "b": "p", "c": "m"}, 500.0, "new")])  # live: provisional windows
        points = asked(3)
        assert points[-1].count == pane_rollup(plain, **q)[0].points[-1].count
        commit([(T0 + 10 * MINUTE + 1_000, {"a": "x", "b": "q", "c": "n"}, 5_000.0, "late")])  # before the chunk
        assert asked(4)[5].revision == 2  # the chunk reused, the straggler's window computed again
        commit([(T0 + HOUR + 5 * MINUTE + 1_000, {"a": "x", "b": "q", "c": "n"}, 5_000.0, "late")])  # in the chunk
        points = asked(4)  # its rows changed: not reused, computed and kept again
        assert points[60].revision == 2
        asked(5)  # corrected
        commit([(T0 + 5 * HOUR, {"a": "x", "b": "p", "c": "m"}, 1.0, "u1")])  # every window final now
        assert all(p.final for p in asked(6))  # the third hour is a chunk now: computed, then reused
        asked(8)
    finally:
        tiered.close()
        plain.close()


def test_rows_dropped_by_retention_under_a_chunk_are_not_served_again(store_backend):
    store = store_at(store_backend, TierLayout(PANE, HOUR, ((MINUTE, HOUR), (HOUR, 30 * HOUR)), ("",)))
    q = dict(stat="p90", start=T0, end=T0 + 2 * HOUR, step=MINUTE, window=MINUTE)
    cache = PointCache()
    try:
        commit_all(store, [HOURS[:1030]])  # two hours
        for _ in range(3):
            answer(store, **q, cache=cache)
        assert cache.chunk_hits == 1
        now = T0 + 2 * HOUR + 30 * MINUTE  # the panes and minutes of the first half hour dropped
        batch = BatchCommit("main", 1, [], 0, {}, {}, batch_now_ms=now)  # no event: the same windows final
        assert store.commit_batch(batch, lateness_ms={"s": LATENESS}, now_ms=now, retention_ms={"s": 2 * HOUR}).committed
        got = answer(store, **q, cache=cache)
        assert cache.chunk_hits == 1
        assert got == answer(store, **q) and got[0].points[0].count == 0
    finally:
        store.close()


@pytest.mark.parametrize("stat, group_by", [("count", []), ("p90", []), ("count", ["a"])])
def test_a_query_past_the_default_point_limit_keeps_chunks_as_it_answers_without(store_backend, stat, group_by):
    """query_max_points may be set above the default (11 000): a query of more windows than that
    kept its chunks through the empty points of the range, made at the default limit, and failed
    where the same query without a cache answered."""
    store = store_at(store_backend, LAYOUT)
    events = [(T0 + i * 600_000, {"a": "xy"[i % 2], "b": "p", "c": "m"}, 1.0, "u") for i in range(210)]
    commit_all(store, [events + [(T0 + 40 * HOUR, {"a": "x", "b": "p", "c": "m"}, 1.0, "u")]])
    q = dict(stat=stat, quantile=0.9 if stat == "p90" else None, value_field="v", distinct_field="u", start_ms=T0,
             end_ms=T0 + 12_000 * PANE, step_ms=PANE, window_ms=PANE, group_by=group_by, filters={},
             watermark_ms=store.watermarks()["s"], max_points=20_000, now_ms=T0)
    try:
        plain = query_series(store, "s", PANE, **q)
        cache = PointCache()
        for _ in range(3):  # computed and kept, then reused
            assert query_series(store, "s", PANE, **q, cache=cache) == plain
        assert cache.chunk_hits
    finally:
        store.close()

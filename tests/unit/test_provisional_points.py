"""Windows the watermark has not passed (provisional points) are kept in memory with their
fingerprint and the watermark they were computed under (store/point_cache.py): a view asked again
before the next batch (a dashboard's viewers, a refresh every second) reuses them instead of
merging each sliding window's sketches again; a batch that reaches a window's rows, or moves the
watermark, makes it computed again. Every answer equals the query's without a cache."""

from __future__ import annotations

import pytest

from store.point_cache import PointCache
from tests.unit.test_tiers import LAYOUT, MINUTE, T0, answer, assert_same, commit_all, pane_rollup, store_at

HOUR = 3_600_000
EVENTS = [(T0 + i * 9_000, {"a": "xy"[i % 2], "b": "pq"[i % 2], "c": "m"}, float(i % 89), f"u{i % 30}")
          for i in range(800)]  # two hours
LAST = EVENTS[-1][0]


@pytest.mark.parametrize("stat, group_by", [("p90", []), ("distinct", []), ("distinct", ["a"])])
def test_provisional_windows_are_reused_until_a_batch_reaches_them_or_moves_the_watermark(store_backend, stat,
                                                                                         group_by):
    store = store_at(store_backend, LAYOUT)
    q = dict(stat=stat, start=T0 + HOUR, end=T0 + 2 * HOUR, step=MINUTE, window=10 * MINUTE, group_by=group_by)
    cache = PointCache()
    batches = 0

    def commit(events) -> None:
        nonlocal batches
        commit_all(store, [events], first_id=batches)
        batches += 1

    def asked() -> tuple[list, int]:
        """The answer (checked against the query without a cache and the panes' roll-up), and the
        provisional points it reused."""
        before = cache.provisional_hits
        got = answer(store, **q, cache=cache)
        assert got == answer(store, **q)
        assert_same(got, pane_rollup(store, **q), stat)
        return got, cache.provisional_hits - before

    def live(series) -> int:  # provisional windows with rows, every group's
        return sum(not p.final and p.count > 0 for s in series for p in s.points)

    try:
        commit(EVENTS)
        got, reused = asked()  # computed (a cold query): its provisional windows kept
        assert reused == 0 and live(got) >= 10
        got, reused = asked()
        assert reused == live(got)  # nothing merged again
        # A straggler behind the watermark: the windows it lands in are computed again, only those.
        commit([(LAST - 4 * MINUTE, {"a": "x", "b": "p", "c": "m"}, 1_000.0, "late")])
        got, reused = asked()
        reached = sum(not p.final and p.t_ms <= LAST - 4 * MINUTE < p.t_ms + 10 * MINUTE
                      for s in got if s.group.get("a", "x") == "x" for p in s.points)
        assert reached and reused == live(got) - reached
        # A batch past the range's windows: their rows unchanged, but the watermark passed them all.
        commit([(T0 + 5 * HOUR, {"a": "x", "b": "p", "c": "m"}, 1.0, "u1")])
        got, reused = asked()
        assert reused == 0 and all(p.final for s in got for p in s.points)
    finally:
        store.close()


def test_a_view_whose_windows_are_all_provisional_reuses_them(store_backend):
    """A 1 h range of a 1 h window sliding by the minute: every window ends past the watermark, so
    the cache holds no final point of the view; its provisional ones are reused all the same."""
    store = store_at(store_backend, LAYOUT)
    try:
        commit_all(store, [EVENTS[::3]])  # fewer than a KLL's k (200) in a window: its merges are exact
        end = LAST - LAST % MINUTE + MINUTE
        q = dict(stat="p90", start=end - HOUR, end=end, step=MINUTE, window=HOUR)
        cache = PointCache()
        first = answer(store, **q, cache=cache)
        assert not any(p.final for s in first for p in s.points)
        assert answer(store, **q, cache=cache) == first == answer(store, **q)
        assert cache.provisional_hits == sum(p.count > 0 for s in first for p in s.points) == 60
    finally:
        store.close()

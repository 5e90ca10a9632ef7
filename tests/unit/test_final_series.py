"""A view asked again (a dashboard refreshing every second, the standard views) reuses its final
windows' points while no row under them changed (store/series.py _final_validity,
PointCache.final_series): one summed read instead of every window's fingerprint and lookup.
Whatever changes under them (a straggler, a window turning final, retention) is computed again,
and the provisional windows are computed at every query."""

from __future__ import annotations

import pytest

from store import BatchCommit
from store.point_cache import PointCache
from store.tiers import TierLayout
from tests.unit.test_tiers import (LATENESS, LAYOUT, MINUTE, PANE, T0, answer, assert_same, commit_all,
                                   pane_rollup, store_at)

HOUR = 3_600_000
# An hour of events: the watermark ends 30 s before the last, so the last minute is provisional.
AN_HOUR = [(T0 + i * 7_000, {"a": "xy"[i % 2], "b": "pqr"[i % 3], "c": "mn"[i % 2]}, float(i % 97), f"u{i % 40}")
           for i in range(514)]


@pytest.mark.parametrize("stat", ["p90", "distinct", "count", "avg"])
@pytest.mark.parametrize("window, filters", [(MINUTE, {}), (10 * MINUTE, {}), (MINUTE, {"a": "x"})])
def test_final_windows_are_reused_until_a_row_under_them_changes(store_backend, stat, window, filters):
    """Sketch stats keep a series once a warm query checked its windows' fingerprints; exact stats
    (summed by the store, nothing cached per window) from their first query on."""
    tiered, plain = store_at(store_backend, LAYOUT), store_at(store_backend, None)
    q = dict(stat=stat, start=T0, end=T0 + HOUR, step=MINUTE, window=window, filters=filters)
    cache = PointCache()
    batches = 0

    def commit(events: list[tuple]) -> None:
        nonlocal batches
        for store in (tiered, plain):
            commit_all(store, [events], first_id=batches)
        batches += 1

    def asked(series_hits: int) -> list:
        got = answer(tiered, **q, cache=cache)
        assert_same(got, pane_rollup(plain, **q), stat)
        assert cache.series_hits == series_hits
        return got[0].points

    try:
        commit(AN_HOUR)
        if stat in ("p90", "distinct"):
            asked(0)  # cold: every window computed from its rows
        asked(0)  # warm: checked by every window's fingerprint, then kept as a series
        points = asked(1)  # reused
        assert points[0].final and not points[-1].final
        commit([(T0 + HOUR - 2_000, {"a": "x", "b": "p", "c": "m"}, 500.0, "new")])  # live: provisional windows
        points = asked(2)
        assert points[-1].count == pane_rollup(plain, **q)[0].points[-1].count
        commit([(T0 + 5 * MINUTE + 1_000, {"a": "x", "b": "q", "c": "n"}, 5_000.0, "late")])  # a straggler
        points = asked(2)  # its window changed: the series is not reused, and is kept again
        assert points[5].revision == 2
        asked(3)  # corrected
        commit([(T0 + 2 * HOUR, {"a": "x", "b": "p", "c": "m"}, 1.0, "u1")])  # every window final now
        assert all(p.final for p in asked(3))
    finally:
        tiered.close()
        plain.close()


def test_rows_dropped_by_retention_under_final_windows_are_not_served_again(store_backend):
    store = store_at(store_backend, TierLayout(PANE, HOUR, ((MINUTE, HOUR), (HOUR, 30 * HOUR)), ("",)))
    q = dict(stat="p90", start=T0, end=T0 + HOUR, step=MINUTE, window=MINUTE)
    cache = PointCache()
    try:
        commit_all(store, [AN_HOUR])
        for _ in range(3):
            answer(store, **q, cache=cache)
        assert cache.series_hits == 1
        now = T0 + HOUR + 30 * MINUTE  # the panes and minutes of the first half hour dropped
        batch = BatchCommit("main", 1, [], 0, {}, {}, batch_now_ms=now)  # no event: the same windows final
        assert store.commit_batch(batch, lateness_ms={"s": LATENESS}, now_ms=now, retention_ms={"s": HOUR}).committed
        got = answer(store, **q, cache=cache)
        assert cache.series_hits == 1
        assert got == answer(store, **q) and got[0].points[0].count == 0
    finally:
        store.close()

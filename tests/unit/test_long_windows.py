"""A window as long as the API allows (36 500 days) costs what the rows in it cost, not what its
length in buckets would: the windows' counts, revisions (store/rollup.py `_slide_kll`) and
fingerprints (store/series.py `_fingerprints`) are summed over the buckets that hold rows.
Dense arrays of every bucket made `GET /api/v1/query?stat=p99&step=10s&window=36500d` take a
minute and gigabytes (315 M buckets of 10 s), and a dashboard panel of it made the point warmer
do that at every run."""

from __future__ import annotations

import tracemalloc

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sketches import KllSketch
from store import BatchCommit, PaneData, PanePartial, ValueStats
from store.point_cache import PointCache
from store.rollup import _range_max
from store.series import query_series
from store.tiers import TierLayout

PANE, MINUTE, HOUR, DAY = 10_000, 60_000, 3_600_000, 86_400_000
T0 = 1_700_000_000_000 - 1_700_000_000_000 % HOUR
LAYOUT = TierLayout(PANE, 7 * DAY, ((MINUTE, 7 * DAY), (HOUR, 7 * DAY)), ("",))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=40), st.lists(st.tuples(st.integers(0, 45), st.integers(0, 45)),
                                                           max_size=20))
def test_range_max_is_each_ranges_max(values, ranges):
    first = np.array([min(a, b) for a, b in ranges], dtype=np.int64).clip(0, len(values))
    last = np.array([max(a, b) for a, b in ranges], dtype=np.int64).clip(0, len(values))
    got = _range_max(np.array(values, dtype=np.int64), first, last).tolist()
    assert got == [max(values[a:b], default=0) for a, b in zip(first.tolist(), last.tolist())]


def test_a_century_long_window_costs_its_rows_not_its_length(store_backend):
    store = store_backend.create()  # each store backend (tests/store_backends.py)
    store.configure_tiers({"s": LAYOUT}, now_ms=T0)
    partials = []
    for i in range(30):
        kll = KllSketch()
        kll.update(float(i))
        partials.append(PanePartial("s", T0 + i * PANE, T0 + (i + 1) * PANE, {"a": "x"},
                                    PaneData(1, {"v": ValueStats(1, float(i), float(i), float(i), kll.to_bytes())})))
    store.commit_batch(BatchCommit("main", 0, partials, len(partials), {"s": T0 + HOUR}, {}), lateness_ms={"s": 0},
                       now_ms=T0 + HOUR)
    start, end = T0 - 10 * MINUTE, T0 + 10 * MINUTE  # 120 points of 10 s, each window 3 650 days long
    tracemalloc.start()
    try:
        for cache in (None, PointCache()):  # the roll-up's windows; with a cache, the fingerprints too
            (series,) = query_series(store, "s", PANE, stat="p99", quantile=0.99, value_field="v",
                                     distinct_field=None, start_ms=start, end_ms=end, step_ms=PANE,
                                     window_ms=3_650 * DAY, watermark_ms=T0 + HOUR, max_points=11_000, cache=cache)
            assert [p.count for p in series.points] == [max(0, 30 - max(0, (p.t_ms - T0) // PANE)) for p in series.points]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        store.close()
    assert peak < 64 * 2**20, f"peak {peak / 2**20:.0f} MiB"  # dense: 31.5 M buckets, ~250 MiB an array

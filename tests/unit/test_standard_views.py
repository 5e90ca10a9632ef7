"""The standard views (query/standard_views.py): which queries they are, how a run after the
first narrows to the newly final windows, and that the point warmer keeping them makes the first
query of an undeclared 24 h percentile, distinct or 1 h sliding view load kept points instead of
merging sketches (issue 27: the cold first run was the p99)."""

from __future__ import annotations

from api.point_warmer import PointWarmer
from catalog import load_catalog
from catalog.loader import parse_catalog
from query.standard_views import FULL_EVERY_MS, STANDARD_QUANTILES, StandardViews, standard_queries
from sketchboard.settings import DEFAULT_STREAMS
from store.final_points import FinalPoints
from store.point_cache import PointCache
from store.tiers import layout_for
from tests.unit.test_tiers import LATENESS, MINUTE, PANE, T0, answer, assert_same, commit_all, pane_rollup, store_at
from tests.unit.test_warm_points import asked

HOUR = 3_600_000
DAY = 86_400_000

# test_tiers' stream `s` (its LAYOUT: tiers 1m and 10m, group-bys a and a,b), as a catalog declares it.
CATALOG = parse_catalog("""
streams:
  s:
    key_field: u
    dimensions: [a, b, c]
    values: [v]
    distinct: [u]
    pane: 10s
    allowed_lateness: 30s
    retention: 7d
    tiers: [{every: 1m}, {every: 10m}]
    rollup_group_bys: [[a], [a, b]]
  panes_only:
    key_field: k
    values: [x]
    tiers: []
metrics:
  m: {stream: s, value: v, distinct: u}
  counted: {stream: s}
  x: {stream: panes_only, value: x}
""")


def shapes(queries):
    return sorted((q.metric, q.stats, q.step_ms, q.window_ms, q.group_by, q.filters) for q in queries)


def test_each_metric_with_a_sketch_gets_each_tier_granule_and_a_1h_sliding_window():
    assert layout_for(CATALOG.streams["s"]).granules == ((MINUTE, 7 * DAY), (10 * MINUTE, 7 * DAY))
    queries = standard_queries(CATALOG, now_ms=T0, max_points=11_000)
    stats = (*STANDARD_QUANTILES, "distinct", "count")
    # The total only; no view for a metric without a sketch, nor for a stream kept as panes only.
    assert shapes(queries) == [("m", stats, MINUTE, MINUTE, (), ()), ("m", stats, MINUTE, HOUR, (), ()),
                               ("m", stats, 10 * MINUTE, 10 * MINUTE, (), ())]
    ranges = {(q.step_ms, q.window_ms): q.range_at(T0) for q in queries}
    assert ranges[(MINUTE, MINUTE)] == (T0 - DAY, T0)  # a day of minutes
    assert ranges[(MINUTE, HOUR)] == (T0 - DAY, T0)
    assert ranges[(10 * MINUTE, 10 * MINUTE)][0] == T0 - 7 * DAY + 30 * MINUTE  # within the keep, not 10 days


def test_the_shipped_configuration_warms_the_issues_day_queries():
    catalog = load_catalog(DEFAULT_STREAMS)
    got = {(q.metric, q.step_ms, q.window_ms): q for q in standard_queries(catalog, now_ms=T0, max_points=11_000)}
    for step, window in ((MINUTE, MINUTE), (MINUTE, HOUR), (HOUR, HOUR)):
        assert got[("latency", step, window)].stats == (*STANDARD_QUANTILES, "count")
        assert got[("requests", step, window)].stats == ("distinct", "count")
        assert got[("latency", step, window)].range_at(T0)[0] <= T0 - DAY
    assert got[("latency", HOUR, HOUR)].range_at(T0)[0] <= T0 - 7 * DAY  # the week at 1-hour steps


def test_runs_after_the_first_cover_the_windows_final_since_and_a_whole_run_comes_back():
    views = StandardViews(lambda: CATALOG, max_points=11_000)
    first = views.plan(T0, {"s": T0 - LATENESS})
    assert first.full and all(q.range_at(T0)[0] <= T0 - DAY for q in first.queries if q.step_ms == MINUTE)
    assert views.plan(T0, {}).full  # not done yet: still the whole ranges
    views.done(first)
    now = T0 + 5 * MINUTE
    second = views.plan(now, {"s": now - LATENESS})
    assert not second.full
    starts = {(q.step_ms, q.window_ms): q.range_at(now)[0] for q in second.queries}
    # From the watermark warmed before, less a window and a granule: every window final since.
    # The watermark warmed before is T0 - 30 s: minus a window and a granule, floored to the step.
    assert starts == {(MINUTE, MINUTE): T0 - 3 * MINUTE, (MINUTE, HOUR): T0 - HOUR - 2 * MINUTE,
                      (10 * MINUTE, 10 * MINUTE): T0 - 30 * MINUTE}
    for q in second.queries:  # each up to its last final window (by less than a granule)
        lo, hi = q.range_at(now)
        assert hi - q.step_ms + q.window_ms <= now - LATENESS + q.step_ms and hi - lo >= 2 * q.step_ms
    views.done(second)
    assert views.plan(T0 + FULL_EVERY_MS, {"s": T0}).full  # an hour on: whole ranges again (revised long after)
    views.reset()
    assert views.plan(now, {}).full


def test_a_stream_without_a_watermark_has_no_view_and_one_ahead_of_the_clock_keeps_its_last_windows():
    """The review: a stream with no watermark (no traffic yet) was planned over its whole day at every
    run (0.45 s of CPU every 10 s for the shipped configuration's idle streams), and a producer's
    clock 4 minutes ahead put the 1-minute views' start after their end: skipped, never warmed."""
    assert standard_queries(CATALOG, now_ms=T0, max_points=11_000, watermarks={}) == []
    views = StandardViews(lambda: CATALOG, max_points=11_000)
    assert views.plan(T0, {}).queries == []
    ahead = T0 + 3 * MINUTE + 30_000  # the newest event 4 minutes ahead, less the lateness
    views.done(views.plan(T0, {"s": ahead}))
    now = T0 + 10_000
    later = views.plan(now, {"s": ahead + 10_000})
    ranges = {(q.step_ms, q.window_ms): q.range_at(now) for q in later.queries}
    # The windows up to the one holding now (final too: the watermark is ahead), not nothing.
    assert ranges[(MINUTE, MINUTE)] == (T0 - 2 * MINUTE, T0 + MINUTE)
    assert ranges[(10 * MINUTE, 10 * MINUTE)] == (T0 - 20 * MINUTE, T0 + 10 * MINUTE)


def test_the_warmer_keeps_standard_views_so_an_undeclared_first_query_computes_nothing(store_backend):
    """Nothing declared: the warmer's standard views alone keep a day of 1-minute p95s, distinct
    counts and a 1 h sliding window; a new process's first query of each (any range inside)
    reads them, equal to what the panes give; events after the run are kept by the next one."""
    day = [[(T0 - DAY + i * 90_000, {"a": "xy"[i % 2], "b": "pqr"[i % 3], "c": "mn"[i % 2]}, float(i % 97),
             f"u{i % 40}") for i in range(960)]]
    store, plain = store_at(store_backend, layout_for(CATALOG.streams["s"])), store_at(store_backend, None)
    for s in (store, plain):
        commit_all(s, day, now_ms=T0)
    kept = FinalPoints(store_backend.side_db(store))
    now = [T0]
    warmer = PointWarmer(store, lambda now_ms: [], interval_s=60, max_points=11_000, cache=PointCache(backing=kept),
                         clock=lambda: now[0] / 1000, standard=StandardViews(lambda: CATALOG, max_points=11_000))
    try:
        assert warmer.run_once() == 3
        for q in standard_queries(CATALOG, now_ms=T0, max_points=11_000):
            for stat in ("p95", "distinct"):
                lo, hi = q.range_at(T0)
                for start in (lo, hi - 6 * HOUR):  # the whole day, and the last 6 hours of it
                    ask = {**asked(q), "stat": stat, "start": start}
                    got, computed = _cold(store, kept, ask)
                    assert computed == 0, (q.step_ms, q.window_ms, stat, start)
                    assert_same(got, pane_rollup(plain, **ask), stat)
                # The count (exact, summed by the store): its chunks of final windows read, not summed.
                ask = {**asked(q), "stat": "count"}
                cache = PointCache(backing=kept)
                assert_same(answer(store, **ask, cache=cache), pane_rollup(plain, **ask), "count")
                assert cache.chunk_hits >= 1, (q.step_ms, q.window_ms)

        later = [[(T0 + i * 20_000, {"a": "x", "b": "p", "c": "m"}, float(i), f"v{i}") for i in range(30)]]
        for s in (store, plain):
            commit_all(s, later, now_ms=T0 + 10 * MINUTE, first_id=1)
        now[0] = T0 + 10 * MINUTE
        assert warmer.run_once() == 3  # the windows final since, not the whole day again
        minutes = {**asked(standard_queries(CATALOG, now_ms=now[0], max_points=11_000)[0]), "stat": "p95"}
        got, computed = _cold(store, kept, minutes)
        assert computed == 0
        assert_same(got, pane_rollup(plain, **minutes), "p95")
        assert got[0].points[-2].final and got[0].points[-2].count == 3  # T0 + 8 min: kept by the second run
    finally:
        kept.close()
        store.close()
        plain.close()


def _cold(store, kept, ask):
    """test_warm_points.cold for a view asked as a dict."""
    cache = PointCache(backing=kept)
    series = answer(store, **ask, cache=cache)
    return series, sum(p.final and p.count > 0 for s in series for p in s.points) - cache.hits  # empty: made as asked


def test_the_wired_api_warms_the_standard_views_unless_turned_off(tmp_path):
    from sketchboard.settings import Settings
    from sketchboard.wiring import build_api

    _, ctx = build_api(Settings(data_dir=tmp_path / "data", alerts_config=None))
    try:
        run = ctx.point_warmer.standard.plan(T0, {"http_requests": T0})
        assert {q.metric for q in run.queries} >= {"latency", "requests"}
    finally:
        ctx.store.close()
    _, off = build_api(Settings(data_dir=tmp_path / "off", alerts_config=None, point_warm_standard=False))
    try:
        assert off.point_warmer.standard is None and off.point_warmer.views(T0)  # the dashboards' panels still
    finally:
        off.store.close()

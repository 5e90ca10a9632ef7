"""Declared views computed ahead of their first query (query/warm.py): the points they keep are
the ones a query computes, a cold query (a new process: nothing in memory) computes no final
point of them, and a revision of a pane or tier row a kept point covers replaces that point."""

from __future__ import annotations

import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalog import load_catalog
from dashboard.model import Dashboard, Panel, definition
from dashboard.views import auto_step_ms, declared_queries, panel_queries
from query import Query
from query.warm import warm
from sketchboard.settings import DEFAULT_STREAMS
from store import BatchCommit
from store.final_points import FinalPoints
from store.point_cache import PointCache
from store.tiers import TierLayout
from tests.unit.test_tiers import (DIMS, LATENESS, LAYOUT, MINUTE, PANE, T0, answer, assert_same, batches, commit_all,
                                   pane_rollup, store_at)

HOUR = 3_600_000


def view(stat: str, start: int, end: int, step: int, window: int, group_by=(), filters=None) -> Query:
    """A declared view over tests/unit/test_tiers.py's stream `s` (value v, distinct u)."""
    return Query(metric="m", stream="s", stats=(stat,), quantiles=(0.9 if stat == "p90" else None,), unit="",
                 value_field="v", distinct_field="u", pane_ms=PANE, group_by=tuple(group_by),
                 filters=tuple(sorted((filters or {}).items())), from_text=str(start), to_text=str(end),
                 relative=False, step_ms=step, window_ms=window)


def asked(q: Query) -> dict:
    """The same view as test_tiers' answer()/pane_rollup() take it."""
    lo, hi = q.range_at(0)
    return dict(stat=q.stats[0], start=lo, end=hi, step=q.step_ms, window=q.window_ms, group_by=q.group_by,
                filters=dict(q.filters))


def cold(store, kept: FinalPoints, q: Query):
    """The view asked by a new process (empty memory, the kept points in the store): its answer,
    and how many of its final points were computed rather than read."""
    cache = PointCache(backing=kept)
    series = answer(store, **asked(q), cache=cache)
    finals = sum(p.final and p.count > 0 for s in series for p in s.points)  # an empty window is made as asked
    return series, finals - cache.hits


@st.composite
def views(draw):
    step = draw(st.sampled_from([PANE, MINUTE, 2 * MINUTE, 10 * MINUTE]))
    window = step * draw(st.sampled_from([1, 3, 6, 60 * MINUTE // step]))  # tumbling, hopping, 1 h sliding
    if draw(st.booleans()):
        window += PANE * draw(st.integers(0, 3))  # not a multiple of the step: gcd buckets
    start = T0 + step * draw(st.integers(-2, 3 * HOUR // step))
    start -= start % step
    end = start + step * draw(st.integers(1, 60))
    group_by = draw(st.lists(st.sampled_from(DIMS), unique=True, max_size=2))
    filters = draw(st.dictionaries(st.sampled_from(DIMS), st.sampled_from("xypqrmn"), max_size=1))
    return view(draw(st.sampled_from(["p90", "distinct"])), start, end, step, window, group_by, filters)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=batches, then=batches, declared=st.lists(views(), min_size=1, max_size=3))
def test_warmed_points_equal_computed_ones_after_late_events_and_corrections(store_backend, first, then, declared):
    tiered, plain = store_at(store_backend, LAYOUT), store_at(store_backend, None)
    kept = FinalPoints(store_backend.side_db(tiered))
    worker = PointCache(backing=kept)  # the warming process's cache, kept between its runs
    try:
        for batch_list, offset in ((first, 0), (then, len(first))):  # `then`: late events revise panes
            for store in (tiered, plain):
                commit_all(store, batch_list, first_id=offset)
            watermarks = tiered.watermarks()
            assert warm(tiered, declared, now_ms=T0, watermarks=watermarks, max_points=11_000, cache=worker) == len(declared)
            for q in declared:
                got, computed = cold(tiered, kept, q)
                assert computed == 0  # every final point was kept by the warm run
                assert_same(got, pane_rollup(plain, **asked(q)), q.stats[0])
                assert_same(got, answer(tiered, **asked(q)), q.stats[0])  # and is what no cache computes
    finally:
        kept.close()
        tiered.close()
        plain.close()


# Three hours, an event every 30 s: a 1 h window holds 120 values (fewer than KLL's k, so a
# percentile merged in any order is the same), then a batch that makes their windows final.
HOURS = [[(T0 + i * 30_000, {"a": "xy"[i % 2], "b": "pqr"[i % 3], "c": "mn"[i % 2]}, float(i % 97), f"u{i % 40}")
          for i in range(360)], [(T0 + 4 * HOUR, {"a": "x", "b": "p", "c": "m"}, 1.0, "u1")]]
SLIDING = view("p90", T0 + HOUR, T0 + 3 * HOUR, MINUTE, 60 * MINUTE)


def test_a_revision_of_a_covered_pane_replaces_the_kept_point(store_backend):
    store, plain = store_at(store_backend, LAYOUT), store_at(store_backend, None)
    for s in (store, plain):
        commit_all(s, HOURS)
    kept = FinalPoints(store_backend.side_db(store))
    worker = PointCache(backing=kept)
    try:
        warm(store, [SLIDING], now_ms=T0, watermarks=store.watermarks(), max_points=11_000, cache=worker)
        before, computed = cold(store, kept, SLIDING)
        assert computed == 0 and all(p.final for p in before[0].points)

        straggler = [[(T0 + 90 * MINUTE + 1_000, {"a": "x", "b": "q", "c": "n"}, 5_000.0, "u99")]]
        for s in (store, plain):
            commit_all(s, straggler, first_id=len(HOURS))  # long past the watermark: a correction
        warm(store, [SLIDING], now_ms=T0, watermarks=store.watermarks(), max_points=11_000, cache=worker)
        after, computed = cold(store, kept, SLIDING)
        assert computed == 0  # the revised windows were kept again by the warm run, not computed by the query
        assert_same(after, pane_rollup(plain, **asked(SLIDING)), "p90")
        covering = {p.t_ms for p in before[0].points if p.t_ms <= T0 + 90 * MINUTE < p.t_ms + 60 * MINUTE}
        assert len(covering) == 31  # the windows starting from 1:00 to 1:30 hold it (at 1:30:01)
        for old, new in zip(before[0].points, after[0].points):
            if old.t_ms in covering:
                assert (new.count, new.revision) == (old.count + 1, old.revision + 1) and new.value >= old.value
            else:
                assert new == old
    finally:
        kept.close()


def test_exact_views_keep_their_chunks_grouped_or_not(store_backend):
    """An exact stat keeps nothing per window (the store sums it), but a view's chunks of final
    windows are kept (store/series.py), every group's: a new process's first query reads them."""
    store, plain = store_at(store_backend, LAYOUT), store_at(store_backend, None)
    for s in (store, plain):
        commit_all(s, HOURS)
    kept = FinalPoints(store_backend.side_db(store))
    try:
        grouped = view("count", T0 + HOUR, T0 + 3 * HOUR, MINUTE, 60 * MINUTE, group_by=["a"])
        exact = view("count", T0 + HOUR, T0 + 3 * HOUR, MINUTE, 60 * MINUTE)
        assert warm(store, [grouped, exact], now_ms=T0, watermarks=store.watermarks(), max_points=11_000,
                    cache=PointCache(backing=kept)) == 2
        for q in (grouped, exact):
            cache = PointCache(backing=kept)  # a new process's
            got = answer(store, **asked(q), cache=cache)
            assert cache.chunk_hits == 2  # both hours from the store
            assert_same(got, pane_rollup(plain, **asked(q)), "count")
    finally:
        kept.close()


def test_ratios_are_not_warmed_they_keep_nothing():
    """A ratio is two sums of the store's at every query (query.compute.ratio_series): computing it
    ahead would keep nothing, so the warmer leaves it out of a view and skips a view of ratios only."""
    from dataclasses import replace

    from query.warm import kept_part

    both = replace(view("count", T0, T0 + HOUR, MINUTE, MINUTE), stats=("ratio", "count"), quantiles=(None, None))
    assert kept_part(both).stats == ("count",)
    assert kept_part(replace(both, stats=("ratio",), quantiles=(None,))) is None


CATALOG = load_catalog(DEFAULT_STREAMS)


def test_auto_step_is_the_pages():
    # dashboard/static/util.js: about 120 points, a nice step that is a whole number of panes.
    assert auto_step_ms(24 * HOUR, 10_000) == 15 * MINUTE
    assert auto_step_ms(HOUR, 10_000) == 30_000
    assert auto_step_ms(15 * MINUTE, 10_000) == 10_000
    assert auto_step_ms(400 * 86_400_000, 10_000) == 400 * 86_400_000 // 120  # past the nicest: whole panes
    assert auto_step_ms(401 * 86_400_000, 7_000) == -(-401 * 86_400_000 // 120 // 7_000) * 7_000


def test_a_dashboards_panels_are_its_declared_views():
    board = Dashboard(name="day", range="24h", panels=[
        Panel(metric="latency", stat="p99", step="1m", window="1h"),
        Panel(metric="latency", stat="band", kind="area"),
        Panel(metric="latency", stat="p99", step="1m", window="1h", title="the same query again"),
        Panel(metric="latency", stat="p99", kind="heatmap", group_by=["endpoint"], step="1m"),
    ])
    queries = panel_queries(board, CATALOG, now_ms=T0, max_points=11_000)
    assert [(q.stats, q.step_ms, q.window_ms, q.from_text) for q in queries] == [
        (("p99",), MINUTE, HOUR, "now-1d"), (("p50", "p95", "p99"), 15 * MINUTE, 15 * MINUTE, "now-1d"),
        (("p99",), MINUTE, HOUR, "now-1d"),
        (("p1", "p10", "p25", "p50", "p75", "p90", "p99", "count"), MINUTE, MINUTE, "now-1d")]  # as the page asks
    assert queries[-1].group_by == ()  # a heatmap is over all groups
    assert len(declared_queries([definition(board)], CATALOG, now_ms=T0, max_points=11_000)) == 3
    stale = {**definition(board), "panels": [{"metric": "gone", "stat": "p99"}]}  # saved under another catalog
    assert declared_queries([stale], CATALOG, now_ms=T0, max_points=11_000) == []
    many = Dashboard(name="week", range="7d", panels=[Panel(metric="latency", stat="p99", step="10s")])
    assert panel_queries(many, CATALOG, now_ms=T0, max_points=11_000) == []  # over the point limit: refused


def test_the_warmer_keeps_the_declared_views_points_from_a_worker_process(store_backend):
    """api/point_warmer.py as the API runs it: the views computed in a snapshot worker (its own
    process and store connection), their final points kept in the store for everyone's first query."""
    from functools import partial

    from api.point_warmer import PointWarmer
    from api.ws_workers import SnapshotWorkers
    from tests.api.test_ws import worker_state

    store = store_at(store_backend, LAYOUT)
    commit_all(store, HOURS)
    kept = FinalPoints(store_backend.side_db(store))
    where = store.dsn if store_backend.kind == "postgres" else str(store.path)
    workers = SnapshotWorkers(partial(worker_state, store_backend.kind, where))
    leading = [False]
    api_cache = PointCache(backing=kept)
    # Five views: handed to the worker in chunks (api/ws_workers.py WARM_CHUNK), their counts summed.
    warmer = PointWarmer(store, lambda now_ms: [SLIDING] * 5, interval_s=60, max_points=11_000,
                         cache=api_cache, workers=workers, clock=lambda: T0 / 1000, active=lambda: leading[0])
    try:
        assert warmer.run_once() is None  # another replica leads: it warms
        leading[0] = True
        assert warmer.run_once() is None  # it starts the workers; until they are ready it skips
        assert workers.wait_ready(120), "the snapshot worker did not start"
        assert warmer.run_once() == 5 and warmer.runs == 1
        got, computed = cold(store, kept, SLIDING)
        assert computed == 0 and len(got[0].points) == 120
        assert_same(got, answer(store, **asked(SLIDING)), "p90")

        api_cache.clear()  # a switch replaced the stream's rows: the kept points are deleted from the store
        assert warmer.run_once() == 5  # the worker forgets its own (the generation) and keeps them anew
        assert cold(store, kept, SLIDING)[1] == 0
    finally:
        workers.stop()
        kept.close()


def test_without_workers_the_warmer_computes_through_the_api_point_cache(store_backend):
    from api.point_warmer import PointWarmer

    store = store_at(store_backend, LAYOUT)
    commit_all(store, HOURS)
    kept = FinalPoints(store_backend.side_db(store))
    api_cache = PointCache(backing=kept)
    warmer = PointWarmer(store, lambda now_ms: [SLIDING], interval_s=60, max_points=11_000, cache=api_cache,
                         clock=lambda: T0 / 1000)
    try:
        warmer.interval_s = 0.05
        warmer.start()  # a first run at once, then every interval
        deadline = time.monotonic() + 30
        while warmer.runs < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        warmer.stop()
        assert len(api_cache) == 120  # the API's own first query reads them from memory
        _, computed = cold(store, kept, SLIDING)  # and another process from the store
        assert computed == 0
    finally:
        kept.close()


def test_the_wired_api_warms_its_dashboards_panels(tmp_path):
    from sketchboard.settings import Settings
    from sketchboard.wiring import build_api

    _, ctx = build_api(Settings(data_dir=tmp_path / "data", alerts_config=None))
    views = ctx.point_warmer.views(T0)
    assert ctx.point_warmer.interval_s == 10 and ctx.point_warmer.workers is ctx.snapshot_workers
    assert views and {q.metric for q in views} <= set(ctx.catalog.metrics)
    assert any(q.stats == ("p50", "p95", "p99") for q in views)  # the generated dashboard's percentile bands
    _, off = build_api(Settings(data_dir=tmp_path / "off", alerts_config=None, point_warm_interval=0))
    assert off.point_warmer is None


def test_the_wired_warmer_resolves_panels_as_the_served_output_is_built(tmp_path, store_backend):
    """Until a switch the dashboards' panels are answered from the served output, built with the
    stored definition (api/served_catalog.py): the warmer resolves them the same way, so it keeps
    the points queries read (10 s panes here, the configuration saying 5 s since), and a panel only
    the configured definition answers (a first_seen metric turned on since) is left to its query."""
    import yaml

    from sketchboard.definitions import pin_definitions
    from sketchboard.settings import Settings
    from sketchboard.wiring import build_api, open_catalog, open_store

    http = {"key_field": "user", "dimensions": ["endpoint"], "values": ["latency_ms"]}
    metrics = {"latency": {"stream": "http", "value": "latency_ms"}}
    config = tmp_path / "streams.yaml"
    config.write_text(yaml.safe_dump({"streams": {"http": http}, "metrics": metrics}))
    (tmp_path / "dashboards").mkdir()
    (tmp_path / "dashboards" / "http.yaml").write_text(yaml.safe_dump({"title": "HTTP", "panels": [
        {"title": "p50", "metric": "latency", "stat": "p50"},
        {"title": "new users", "metric": "new_users", "stat": "first_seen"}]}))
    extra = {}
    if store_backend.kind == "postgres":
        extra = {"store_backend": "postgres", "postgres_dsn": store_backend.create().dsn, "postgres_pool_size": 2}
    settings = Settings(data_dir=tmp_path / "data", streams_config=config, alerts_config=None,
                        dashboards_config=tmp_path / "dashboards", **extra)
    root = open_store(settings)
    pin_definitions(root, open_catalog(settings), "main")  # the served output is built with a 10 s pane
    root.close()
    config.write_text(yaml.safe_dump({"streams": {"http": {**http, "pane": "5s", "first_seen": {"field": "user"}}},
                                      "metrics": {**metrics, "new_users": {"stream": "http", "first_seen": True}}}))
    _, ctx = build_api(settings)
    try:
        assert ctx.catalog.streams["http"].pane == 5_000 and ctx.served_catalog().streams["http"].pane == 10_000
        views = ctx.point_warmer.views(T0)
        assert [(q.metric, q.pane_ms) for q in views] == [("latency", 10_000)]
    finally:
        ctx.store.close()


def test_a_view_past_a_tiers_keep_is_warmed_from_the_rows_its_query_reads(store_backend):
    """A tier may be kept for less than a finer one (here the hours 3 days, the minutes 10): 5 days
    on, a view over the old hours is answered from the minute rows. The warm run read the dropped
    hour rows (nothing): it kept points its query never reuses, so the query computed them all."""
    day = 86_400_000
    layout = TierLayout(PANE, 2 * day, ((MINUTE, 10 * day), (HOUR, 3 * day)), ("",))
    store = store_at(store_backend, layout)
    commit_all(store, [[(T0 + i * 600_000, {"a": "x"}, float(i), "u") for i in range(36)]])
    now = T0 + 5 * day
    assert store.commit_batch(BatchCommit("main", 1, [], 0, {}, {}, batch_now_ms=now), lateness_ms={"s": LATENESS},
                              now_ms=now, retention_ms={"s": layout.retention_ms}).committed
    hours = view("p90", T0, T0 + 6 * HOUR, HOUR, HOUR)
    kept = FinalPoints(store_backend.side_db(store))
    try:
        warm(store, [hours], now_ms=now, watermarks=store.watermarks(), max_points=11_000, cache=PointCache(backing=kept))
        cache = PointCache(backing=kept)  # a new process's
        series = answer(store, **asked(hours), cache=cache, now_ms=now)
        assert [p.count for p in series[0].points] == [6] * 6
        finals = sum(p.final for p in series[0].points)
        assert finals == 5 and cache.hits == finals  # no final point computed again (the last hour is not final)
    finally:
        kept.close()
        store.close()

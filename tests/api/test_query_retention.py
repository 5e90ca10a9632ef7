"""Queries over a range past a finer tier's keep: retention has dropped the panes and the minute
rows of http_requests there (kept 8 d), the hour rows (kept 90 d) hold the events. Every step
answers the events or is refused naming the smallest step that can, and the default step is
one that can: never 0 events marked final (docs/event-time.md, "Tiers and retention"). On
SQLite and on PostgreSQL."""

from __future__ import annotations

import pytest

from store import BatchCommit
from tests.api.conftest import NOW_MS
from tests.api.test_corrections import STREAM, pane

HOUR, DAY = 3_600_000, 86_400_000
OLD = [NOW_MS - 8 * DAY - 18 * HOUR + i * 600_000 for i in range(72)]  # one event every 10 min, 12 h


@pytest.fixture
def pane_store(store_backend):
    """Every test here on SQLite and on PostgreSQL (tests/api/conftest.py)."""
    return store_backend.create()


@pytest.fixture
def aged(ctx, clock):
    """The old events committed while they were recent, then a batch at now whose retention run
    drops their panes and minute rows."""
    lateness = {name: s.allowed_lateness for name, s in ctx.catalog.streams.items()}
    clock.now = (NOW_MS - 8 * DAY - 5 * HOUR) / 1000
    partials = [pane(t, [10.0], ["u"]) for t in OLD]
    assert ctx.store.commit_batch(BatchCommit("main", 0, partials, len(OLD), max_event_ms={STREAM: OLD[-1]},
                                              read_by_stream={STREAM: len(OLD)}, dead_by_stream={}),
                                  lateness_ms=lateness, now_ms=ctx.now_ms()).committed
    clock.now = NOW_MS / 1000
    assert ctx.store.commit_batch(BatchCommit("main", 1, [], 0, {}, {}, batch_now_ms=NOW_MS),
                                  lateness_ms=lateness, now_ms=NOW_MS).committed
    assert ctx.store.read_tier(STREAM, 60_000, "", OLD[0], OLD[-1] + 1, pane_ms=10_000) == []  # dropped


def counted(body) -> int:
    return sum(p["count"] for s in body["series"] for p in s["points"])


def in_range(body) -> int:
    return sum(1 for t in OLD if body["start"] <= t < body["end"])


def test_the_default_step_is_one_a_kept_granule_answers(client, aged):
    r = client.get("/api/v1/query", params={"metric": "requests", "stat": "count", "from": "now-9d", "to": "now-8d"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["step_ms"] == HOUR  # 5m for a day's range, but only the hours are kept there
    assert counted(body) == in_range(body) == len(OLD)


@pytest.mark.parametrize("step", ["1h", "2h", "12h"])
def test_steps_of_a_kept_granule_count_every_event(client, aged, step):
    r = client.get("/api/v1/query", params={"metric": "requests", "stat": "count", "from": "now-9d", "to": "now-8d",
                                            "step": step})
    assert r.status_code == 200, r.text
    assert counted(r.json()) == in_range(r.json()) == len(OLD)


@pytest.mark.parametrize("params", [{"step": "5m"}, {"step": "30m"}, {"step": "1h", "window": "90m"},
                                    {"step": "90m", "to": str(NOW_MS - 8 * DAY - 10 * HOUR - HOUR // 2 + 1),
                                     "from": str(NOW_MS - 8 * DAY - 10 * HOUR - HOUR // 2)}])
def test_a_step_finer_than_what_is_kept_is_refused_naming_one_that_answers(client, aged, params):
    r = client.get("/api/v1/query", params={"metric": "requests", "stat": "count", "from": "now-9d", "to": "now-8d",
                                            **params})
    assert r.status_code == 400, r.text
    assert r.json()["param"] == "step"
    assert "the smallest step that can answer this range is 1h" in r.json()["detail"]


def test_a_range_the_minutes_still_keep_reads_them(client, aged):
    r = client.get("/api/v1/query", params={"metric": "requests", "stat": "count", "from": "now-1d", "to": "now",
                                            "step": "1m"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("start", ["0", "now-400d", "now-30d"])
def test_a_range_reaching_past_every_tiers_keep_defaults_to_a_step_that_answers(client, aged, start):
    """Past every granule's horizon nothing is kept at any step (the stream's retention, answered
    empty); the rest of the range is answered at the default step, from the hour rows."""
    r = client.get("/api/v1/query", params={"metric": "requests", "stat": "count", "from": start, "to": "now"})
    assert r.status_code == 200, r.text
    assert r.json()["step_ms"] % HOUR == 0
    assert counted(r.json()) == len(OLD)


@pytest.mark.parametrize("step", ["5m", "10m"])
def test_a_range_as_long_as_the_retention_is_answered_at_the_steps_kept_over_it(client, aged, clock, step):
    """"Last 8 days" on a stream kept 8 days: its start, floored to the step, falls a little before
    the minutes' horizon. That sliver of the first bucket is the retention's edge, not a step too
    fine: the range is answered at 5 m and 10 m (a dashboard at those steps was refused)."""
    clock.now = (NOW_MS + 37_000) / 1000  # a clock between steps, as a dashboard's is
    r = client.get("/api/v1/query", params={"metric": "requests", "stat": "count", "from": "now-8d", "to": "now",
                                            "step": step, "group_by": "endpoint"})
    assert r.status_code == 200, r.text


def test_an_alert_rule_whose_window_retention_dropped_shows_error_not_0(ctx, aged):
    """A rule whose window lies where only the hour rows are left (a watermark this stale: the
    pipeline saw no events since): a 5-minute window cannot be cut out of them. REST refuses that
    step; the rule read the dropped minutes and panes as 0 events, and `count < 1` fired. It is
    Error now, naming why; a window the hour rows fit reads them, as REST does."""
    from alerts.kinds import evaluate_rule
    from alerts.rules import parse_rule
    from alerts.source import StoreAlertData

    data = StoreAlertData(ctx.catalog, ctx.store)
    rule = parse_rule({"name": "quiet", "kind": "threshold", "metric": "requests", "stat": "count", "op": "<",
                       "threshold": 1, "window": "5m", "stale_after": "10d"}, ctx.catalog)
    outcome = evaluate_rule(rule, data, ctx.catalog, NOW_MS)
    assert outcome.samples == [] and outcome.error is not None, outcome
    assert "needs rows retention has dropped" in outcome.error and "1h rows" in outcome.error
    hour = OLD[0] - OLD[0] % HOUR + HOUR
    (value,) = data.window_values("requests", "count", hour, hour + 2 * HOUR, (), {}, now_ms=NOW_MS)
    assert value.value == sum(1 for t in OLD if hour <= t < hour + 2 * HOUR) > 0
    with pytest.raises(ValueError, match="needs rows retention has dropped"):
        data.window_values("requests", "count", hour + 10_000, hour + HOUR + 10_000, (), {}, now_ms=NOW_MS)
    with pytest.raises(ValueError, match="older than the stream keeps any rows"):
        data.window_values("requests", "count", NOW_MS - 100 * DAY, NOW_MS - 99 * DAY, (), {}, now_ms=NOW_MS)


AHEAD = 2 * HOUR  # how far the pipeline's clock runs ahead of the API's
EDGE = [NOW_MS - 8 * DAY + i * 600_000 for i in range(12)]  # two hours from the panes' horizon at the API's clock


@pytest.fixture
def ahead(ctx, clock):
    """EDGE's events committed while recent, then a batch of a pipeline whose clock runs AHEAD of
    the API's: its retention run dropped their panes and minute rows (they end before its clock
    minus 8 days), which the API's own clock still counts as kept."""
    lateness = {name: s.allowed_lateness for name, s in ctx.catalog.streams.items()}
    clock.now = (EDGE[-1] + HOUR) / 1000
    partials = [pane(t, [10.0], ["u"]) for t in EDGE]
    assert ctx.store.commit_batch(BatchCommit("main", 0, partials, len(EDGE), max_event_ms={STREAM: EDGE[-1]},
                                              read_by_stream={STREAM: len(EDGE)}, dead_by_stream={}),
                                  lateness_ms=lateness, now_ms=ctx.now_ms()).committed
    assert ctx.store.commit_batch(BatchCommit("main", 1, [], 0, {}, {}, batch_now_ms=NOW_MS + AHEAD),
                                  lateness_ms=lateness, now_ms=NOW_MS + AHEAD).committed
    clock.now = NOW_MS / 1000  # the API's
    assert ctx.store.read_tier(STREAM, 60_000, "", EDGE[0], EDGE[-1] + 1, pane_ms=10_000) == []  # dropped
    assert ctx.store.newest_commit_ms() == NOW_MS + AHEAD


def test_retention_is_measured_at_the_newest_batchs_clock_when_the_pipelines_is_ahead(ctx, client, ahead):
    """The planner measured the minutes' horizon at the API's clock, 2 h behind the pipeline's: it
    read the minute rows the pipeline had dropped and answered 0 events, final. At the later of the
    two clocks those windows are refused, naming the step the hour rows answer; that step counts
    every event, and so does an alert rule's window the hours fit."""
    from alerts.source import StoreAlertData

    params = {"metric": "requests", "stat": "count", "from": str(EDGE[0]), "to": str(EDGE[0] + 2 * HOUR)}
    r = client.get("/api/v1/query", params={**params, "step": "5m"})
    assert r.status_code == 400, r.text
    assert "the smallest step that can answer this range is 1h" in r.json()["detail"]
    r = client.get("/api/v1/query", params={**params, "step": "1h"})
    assert r.status_code == 200, r.text
    assert counted(r.json()) == len(EDGE)
    r = client.get("/api/v1/query", params=params)  # the default step is one that answers
    assert r.status_code == 200 and counted(r.json()) == len(EDGE), r.text
    data = StoreAlertData(ctx.catalog, ctx.store)
    with pytest.raises(ValueError, match="needs rows retention has dropped"):
        data.window_values("requests", "count", EDGE[0], EDGE[0] + 30 * 60_000, (), {}, now_ms=NOW_MS)
    (value,) = data.window_values("requests", "count", EDGE[0], EDGE[0] + 2 * HOUR, (), {}, now_ms=NOW_MS)
    assert value.value == len(EDGE)


def test_the_newest_commit_is_the_latest_over_every_pipeline(pane_store):
    """What the retention clock reads: each pipeline's newest batch (its key), the latest of them."""
    assert pane_store.newest_commit_ms() is None
    for pipeline, batch_id, at in (("main", 0, 5_000), ("main", 1, 9_000), ("run-b", 0, 7_000), ("a", 3, 2_000)):
        assert pane_store.commit_batch(BatchCommit(pipeline, batch_id, [], 0, {}, {}), lateness_ms={},
                                       now_ms=at).committed
    assert pane_store.newest_commit_ms() == 9_000
    assert pane_store.commit_batch(BatchCommit("run-b", 1, [], 0, {}, {}), lateness_ms={}, now_ms=12_000).committed
    assert pane_store.newest_commit_ms() == 12_000


def test_a_pipeline_clock_stepped_back_after_running_ahead_keeps_its_retention_clock(ctx, client, ahead):
    """The ahead clock corrected (an NTP step back of 30 min): the next batch's retention clock is
    held at the last commit's (aggregates/batch_clock.py) while the store's clock at its commit is
    the corrected one. Recorded at that, the newest batch forgot how far the one before had
    dropped rows, and the minutes it dropped were read again: 0 events, final."""
    lateness = {name: s.allowed_lateness for name, s in ctx.catalog.streams.items()}
    assert ctx.store.commit_batch(BatchCommit("main", 2, [], 0, {}, {}, batch_now_ms=NOW_MS + AHEAD),
                                  lateness_ms=lateness, now_ms=NOW_MS + 1_000).committed
    assert ctx.store.newest_commit_ms() == NOW_MS + AHEAD
    r = client.get("/api/v1/query", params={"metric": "requests", "stat": "count", "from": str(EDGE[0]),
                                            "to": str(EDGE[0] + 2 * HOUR), "step": "5m"})
    assert r.status_code == 400, r.text

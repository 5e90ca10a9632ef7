"""The lag panel and the query health in the status strip, fed by the real feeds (no JVM): the
real app on loopback with a real lag monitor and health store wired as in production, so the
page gets `lag.feed.LagFeed`'s messages and `store.health.query_health`'s `query` object, not
hand-written ones. The page must show what the API's own report says."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from api.app import create_app
from api.context import ApiContext
from api.ws_hub import HubConfig
from ingest.log import SqliteEventLog
from lag.report import LagMonitor
from lag.sampler import LagSampler
from lag.sources import EventLogLagSource, StoreCommitted
from store import BatchCommit, PaneData, PanePartial, SqlitePaneStore
from store.health import SqliteHealthStore
from store.lag import SqliteLagStore
from tests.api.test_ws import Server
from tests.api.test_ws_support import drain_log_into_store

pytestmark = pytest.mark.browser

NUMBER = r"\d+(\.\d+)?"
TRACES = "(id) => document.getElementById(id).data.map((t) => ({name: t.name, y: Array.from(t.y)}))"


@pytest.fixture
def lagged(tmp_path, demo_catalog):
    log = SqliteEventLog(tmp_path / "log.db", synchronous="OFF")
    for stream in demo_catalog.streams.values():
        log.ensure_topic(stream)
    store = SqlitePaneStore(tmp_path / "store.db", synchronous="OFF")
    lag_store = SqliteLagStore(tmp_path / "store.db", synchronous="OFF")
    health = SqliteHealthStore(tmp_path / "store.db", synchronous="OFF")
    source = EventLogLagSource(log)
    # Sampled by hand (no thread); a long interval so that samples stay fresh while the page looks.
    sampler = LagSampler(source, StoreCommitted(store, "main"), lag_store, pipeline="main",
                         streams=list(demo_catalog.streams), interval_s=10.0, clock=time.time)
    monitor = LagMonitor(lag_store, "main", lambda: [(n, p) for n in demo_catalog.streams
                                                     for p in source.end_offsets(n)],
                         window=2, interval_s=10.0, clock=time.time, sampler=sampler)
    ctx = ApiContext(catalog=demo_catalog, log=log, store=store, clock=time.time, lag=monitor, health=health)
    app = create_app(ctx, hub_config=HubConfig(poll_interval_s=0.1, heartbeat_interval_s=2, feed_interval_s=0.2))
    with Server(app) as server:
        yield server, ctx, sampler, monitor
    lag_store.close()
    health.close()
    store.close()
    log.close()


def sample_round(sampler) -> None:
    sampler.sample_and_store()
    time.sleep(0.01)  # rounds are told apart by their time (ms)


def assert_panel_matches(page, message: dict) -> None:
    """The badge, the reason and the newest point of each partition's trace, against a message."""
    assert page.get_attribute("#lag-status", "data-status") == message["status"]
    assert page.text_content("#lag-status") == message["status"]
    # The reason says how long ago things happened, as of the report: compare it without numbers.
    assert re.sub(NUMBER, "N", page.text_content("#lag-reason")) == re.sub(NUMBER, "N", message["reason"])
    expected = {f"{stream}/{p}": (part["lag_events"], part["lag_seconds"])
                for stream, s in message["streams"].items() for p, part in s["partitions"].items()}
    events = {t["name"]: t["y"][-1] for t in page.evaluate(TRACES, "lag-chart-events")}
    seconds = {t["name"]: t["y"][-1] for t in page.evaluate(TRACES, "lag-chart-seconds")}
    assert events == {k: v[0] for k, v in expected.items()}
    assert seconds == {k: v[1] for k, v in expected.items()}


def assert_panel_shows(page, message: dict, timeout_s: float = 10.0) -> None:
    """assert_panel_matches once the page shows `message`'s round: the feed pushes each report that
    changed (every 0.2 s here), so the badge may already read STOP from the round before while the
    last round's figures are on their way (a fresh clone's run, session 60)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            assert_panel_matches(page, message)
            return
        except AssertionError:
            page.wait_for_timeout(100)
    assert_panel_matches(page, message)


def test_lag_panel_and_query_health_from_the_real_feeds(lagged, watched_page, artifacts):
    server, ctx, sampler, monitor = lagged
    now = int(time.time() * 1000)
    r = httpx.post(f"{server.http}/api/v1/events", params={"stream": "orders"},
                   json=[{"time": now, "customer_id": f"c{i}", "amount": 1.0} for i in range(40)], timeout=10)
    assert r.status_code == 200 and r.json()["accepted"] == 40

    page, watch = watched_page(server.http, "/")
    page.wait_for_selector("#status-connection[data-state=open]", timeout=15_000)
    # The query never started (the page's first state is data-state=none too: wait for the text).
    page.wait_for_selector("#status-query[data-state=none]:has-text('query not started')", timeout=10_000)

    # Never committed, lag > 0 and the window (2 samples) full: STOP, per partition.
    sample_round(sampler)
    sample_round(sampler)
    stop = monitor.report().to_message()
    assert stop["status"] == "STOP" and stop["streams"]["orders"]["lag_events"] == 40
    page.wait_for_selector("#lag-status[data-status=STOP]", timeout=10_000)
    assert_panel_shows(page, stop)

    # The pipeline's query starts and reports a batch: the status strip shows it.
    ctx.health.started("main", "q1", "r1", "sketchboard-main", now)
    ctx.health.progress("main", "r1", 0, {"batchId": 0, "numInputRows": 40, "inputRowsPerSecond": 80.0,
                                          "processedRowsPerSecond": 250.5, "batchDuration": 160,
                                          "durationMs": {"triggerExecution": 160}}, int(time.time() * 1000))
    page.wait_for_selector("#status-query[data-state=running]", timeout=10_000)
    assert page.text_content("#status-query") == "query running · batch 160 ms · 250.5 rows/s"

    # It commits everything: lag 0, OK.
    drain_log_into_store(ctx.catalog, ctx.log, ctx.store, int(time.time() * 1000))
    sample_round(sampler)
    ok = monitor.report().to_message()
    assert ok["status"] == "OK" and ok["lag_events"] == 0
    page.wait_for_selector("#lag-status[data-status=OK]", timeout=10_000)
    assert_panel_shows(page, ok)

    # The query stops.
    ctx.health.terminated("main", "r1", None, int(time.time() * 1000))
    page.wait_for_selector("#status-query[data-state=stopped]", timeout=10_000)
    assert page.text_content("#status-query").startswith("query stopped at ")
    page.wait_for_timeout(500)
    page.screenshot(path=str(artifacts / "lag-panel-feeds.png"), full_page=True)
    assert watch.errors == [], watch.errors
    assert watch.foreign == [], watch.foreign


def test_the_status_strip_names_the_partition_holding_the_watermark_while_behind(lagged, watched_page):
    """A batch read all of orders/0 and half of orders/1: orders/1 holds the watermark back
    (store/watermarks.py). Once the lag status says the pipeline is behind, the strip says so."""
    server, ctx, sampler, monitor = lagged
    now = int(time.time() * 1000)
    r = httpx.post(f"{server.http}/api/v1/events", params={"stream": "orders"},
                   json=[{"time": now - i, "customer_id": f"c{i}", "amount": 1.0} for i in range(40)], timeout=10)
    assert r.status_code == 200
    ends = {p: o.end for p, o in ctx.log.offsets("orders").items()}
    read = {0: ends[0], 1: ends[1] // 2}
    start = now // 10_000 * 10_000
    commit = BatchCommit("main", 0, [PanePartial("orders", start, start + 10_000, {}, PaneData(count=sum(read.values())))],
                         sum(read.values()), {"orders": now}, end_offsets={"orders": read},
                         read_by_stream={"orders": sum(read.values())},
                         partition_max_event_ms={"orders": {0: now, 1: now - 39}}, log_end_offsets={"orders": ends})
    lateness = {name: s.allowed_lateness for name, s in ctx.catalog.streams.items()}
    assert ctx.store.commit_batch(commit, lateness_ms=lateness, now_ms=now).committed

    page, watch = watched_page(server.http, "/")
    page.wait_for_selector("#status-connection[data-state=open]", timeout=15_000)
    sample_round(sampler)
    sample_round(sampler)
    assert monitor.report().to_message()["status"] != "OK"  # committed offsets stand still with lag
    page.wait_for_selector("#status-lag-events[data-held-by='orders/1']", timeout=10_000)
    assert page.text_content("#status-lag-events").endswith("· watermark held by orders/1")
    assert watch.errors == [], watch.errors


def test_the_lag_panel_lists_every_consumer_of_the_log(lagged, watched_page, tmp_path):
    """Fan-out: a second named pipeline (in the consumer registry) gets a row of its own with its
    status and committed offsets, beside the serving pipeline's."""
    from lag.sources import RegistryCommitted
    from store.consumers import ConsumerRegistry

    server, ctx, sampler, monitor = lagged
    registry = ConsumerRegistry(tmp_path / "store.db")
    registry.register("main", "", "earliest", 0)
    registry.register("audit", "audit", "latest", 1)
    sampler.others = lambda: {"audit": RegistryCommitted(registry, "audit")}
    monitor.registry = registry
    now = int(time.time() * 1000)
    r = httpx.post(f"{server.http}/api/v1/events", params={"stream": "orders"},
                   json=[{"time": now, "customer_id": f"c{i}", "amount": 1.0} for i in range(30)], timeout=10)
    assert r.status_code == 200
    drain_log_into_store(ctx.catalog, ctx.log, ctx.store, now)
    ends = {p: o.end for p, o in ctx.log.offsets("orders").items()}
    registry.record_commit("audit", 0, now, {"orders": {0: ends[0], 1: 0}})

    page, watch = watched_page(server.http, "/")
    page.wait_for_selector("#status-connection[data-state=open]", timeout=15_000)
    sample_round(sampler)
    sample_round(sampler)
    page.wait_for_selector("#lag-consumers tr[data-consumer=audit]", timeout=10_000)
    # The audit consumer's status depends on the time since its commit: under load it may turn from
    # OK to STALL between the round the page shows and the monitor's answer here (a fresh clone's
    # run, session 59). Another round pushes the newer status; the page and the monitor then agree.
    deadline = time.time() + 15
    while True:
        rows = page.evaluate("""() => Array.from(document.querySelectorAll('#lag-consumers tbody tr')).map((tr) =>
            ({name: tr.dataset.consumer, cells: Array.from(tr.cells).map((td) => td.textContent)}))""")
        reports = {c["name"]: c for c in monitor.consumers()}
        shown = {row["name"]: row["cells"][1] for row in rows}
        if shown == {name: reports[name]["status"] for name in shown} or time.time() > deadline:
            break
        sample_round(sampler)
        time.sleep(0.3)
    assert [row["name"] for row in rows] == ["main", "audit"]
    main, audit = (row["cells"] for row in rows)
    assert main[0] == "main (serving) · from earliest" and main[1] == reports["main"]["status"] == "OK"
    assert audit[0] == "audit · from latest" and audit[1] == reports["audit"]["status"]
    assert audit[2] == str(ends[1]) and main[2] == "0"
    assert "http_requests " in audit[4] and f"orders 0:{ends[0]} 1:0" in audit[4]
    assert watch.errors == [], watch.errors

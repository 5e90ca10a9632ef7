"""GET /api/v1/lag, the health section of /api/v1/pipeline and the lag, query and HTTP metrics
of /metrics, over a real log and store with the lag monitor wired as in production."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from catalog import load_catalog
from lag.report import LagMonitor
from lag.sampler import LagSampler
from lag.sources import EventLogLagSource, StoreCommitted
from store import BatchCommit
from store.health import SqliteHealthStore
from store.lag import SqliteLagStore
from tests.api.conftest import CONFIG

NOW_MS = 1_800_000_000_000  # the fake clock of conftest


@pytest.fixture
def lagged(ctx, tmp_path, clock):
    """The context with a lag monitor (window 3 samples of 1 s) and a health store."""
    lag_store = SqliteLagStore(tmp_path / "store.db", synchronous="OFF")
    source = EventLogLagSource(ctx.log)
    sampler = LagSampler(source, StoreCommitted(ctx.store, ctx.pipeline_name), lag_store,
                         pipeline=ctx.pipeline_name, streams=list(ctx.catalog.streams), interval_s=1.0, clock=clock)
    ctx.lag = LagMonitor(lag_store, ctx.pipeline_name,
                         lambda: [(n, p) for n in ctx.catalog.streams for p in source.end_offsets(n)],
                         window=3, interval_s=1.0, clock=clock, sampler=sampler)
    ctx.health = SqliteHealthStore(tmp_path / "store.db", synchronous="OFF")
    yield sampler
    ctx.lag, ctx.health = None, None
    lag_store.close()


def post_orders(client, n: int, time_ms: int):
    r = client.post("/api/v1/events", params={"stream": "orders"},
                    json=[{"time": time_ms, "customer_id": f"c{i}"} for i in range(n)])
    assert r.status_code == 200, r.text


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_lag_without_a_monitor_is_503(client):
    r = client.get("/api/v1/lag")
    assert r.status_code == 503 and "not configured" in r.json()["detail"]


def test_lag_before_any_sample_is_err(client, lagged):
    body = client.get("/api/v1/lag").json()
    assert body["status"] == "ERR" and "no lag samples" in body["reason"]
    assert body["window"] == {"samples": 3, "interval_seconds": 1.0, "seconds": 3.0}
    assert set(body["streams"]) == set(load_catalog(CONFIG).streams)
    assert body["series"]["pipeline"] == []


def test_lag_grows_then_stops_then_drains(client, ctx, lagged, clock):
    sampler = lagged
    for i in range(4):  # the producer sends, nothing commits
        post_orders(client, 5, NOW_MS)
        sampler.sample_and_store()
        clock.now += 1
    body = client.get("/api/v1/lag", params={"stream": "orders"}).json()
    assert body["status"] == "STOP" and "no batch committed yet" in body["reason"]
    assert body["lag_events"] == 20 and body["lag_seconds"] == 3.0  # as of the newest sample
    assert set(body["streams"]) == {"orders"}
    totals = body["series"]["streams"]["orders"]
    assert [p["lag_events"] for p in totals] == [5, 10, 15, 20]
    assert [p["lag_seconds"] for p in totals] == [0.0, 1.0, 2.0, 3.0]
    assert [p["lag_events"] for p in body["series"]["pipeline"]] == [5, 10, 15, 20]
    assert set(body["series"]["partitions"]["orders"]) <= {"0", "1"}

    ends = {p: o.end for p, o in ctx.log.offsets("orders").items()}
    ctx.store.commit_batch(BatchCommit("main", 0, [], 20, {}, {"orders": ends}), lateness_ms={},
                           now_ms=ctx.now_ms())
    sampler.sample_and_store()
    body = client.get("/api/v1/lag").json()
    assert body["status"] == "OK" and body["lag_events"] == 0 and body["lag_seconds"] == 0.0
    assert body["streams"]["orders"]["status"] == "OK"


def test_lag_reports_every_consumer_of_the_log(client, ctx, lagged, clock, tmp_path):
    """Fan-out: the serving pipeline's offsets come from its store, another named pipeline's from
    the copies it makes in the consumer registry; each gets its own samples and status."""
    from lag.sources import RegistryCommitted
    from store.consumers import ConsumerRegistry

    sampler = lagged
    registry = ConsumerRegistry(tmp_path / "store.db")
    registry.register("main", "", "earliest", NOW_MS)
    registry.register("audit", "audit", "latest", NOW_MS)
    sampler.others = lambda: {"audit": RegistryCommitted(registry, "audit")}
    ctx.lag.registry = registry
    ctx.lag.pane_store = ctx.store  # as build_lag_monitor wires it
    post_orders(client, 12, NOW_MS)
    ends = {p: o.end for p, o in ctx.log.offsets("orders").items()}
    ctx.store.commit_batch(BatchCommit("main", 0, [], 12, {}, {"orders": ends}), lateness_ms={}, now_ms=ctx.now_ms())
    half = {p: end // 2 for p, end in ends.items()}
    registry.record_commit("audit", 0, NOW_MS, {"orders": half})
    for _ in range(3):
        sampler.sample_and_store()
        clock.now += 1
    body = client.get("/api/v1/lag", params={"stream": "orders"}).json()
    assert body["pipeline"] == "main" and body["lag_events"] == 0  # the existing fields: the serving pipeline
    main, audit = body["consumers"]
    assert (main["name"], main["serving"], main["namespace"], main["status"]) == ("main", True, None, "OK")
    assert main["last_commit_ms"] is not None
    # Its batch id too, from its store (it copies nothing into the registry): it was always null.
    assert main["last_batch_id"] == 0 and main["last_commit_ms"] == ctx.store.last_commit_ms("main")
    assert (audit["name"], audit["serving"], audit["namespace"], audit["started_from"]) == \
        ("audit", False, "audit", "latest")
    assert audit["lag_events"] == sum(ends.values()) - sum(half.values()) > 0
    assert audit["status"] == "STALL"  # committed offsets stand still with lag, though it commits
    partitions = audit["streams"]["orders"]["partitions"]
    assert {int(p): v["committed"] for p, v in partitions.items()} == half
    assert {int(p): v["lag_events"] for p, v in partitions.items()} == {p: ends[p] - half[p] for p in ends}
    # The same in Prometheus, by pipeline label.
    metrics = families(client.get("/metrics").text)
    codes = {s.labels["pipeline"]: s.value for s in metrics["sketchboard_pipeline_lag_status_code"].samples}
    assert codes == {"main": 0, "audit": 2}  # OK, STALL
    lagging = {(s.labels["pipeline"], s.labels["partition"]): s.value
               for s in metrics["sketchboard_consumer_lag_events"].samples if s.labels["stream"] == "orders"}
    assert lagging == {**{("main", str(p)): 0 for p in ends}, **{("audit", str(p)): ends[p] - half[p] for p in ends}}
    registry.close()


def test_a_run_whose_stream_was_removed_is_listed_as_err_in_rest_and_metrics_alike(client, ctx, lagged, tmp_path):
    """GET /api/v1/lag left it out of `consumers` while /metrics reported it ERR: one rule now,
    listed in both with the reason, until its output is dropped."""
    from aggregates.reprocess import streams_read
    from lag.sources import RegistryCommitted
    from store.consumers import ConsumerRegistry
    from store.definitions import DefinitionStore

    sampler = lagged
    registry = ConsumerRegistry(tmp_path / "store.db")
    definitions = DefinitionStore(tmp_path / "store.db")
    run = "reprocess-legacy-0123abcd"  # a run of stream 'legacy', since removed from the configuration
    registry.register("main", "", "earliest", NOW_MS)
    registry.register(run, run, "earliest", NOW_MS + 1)
    registry.record_commit(run, 3, NOW_MS, {"legacy": {0: 10}})
    ctx.lag.registry = registry
    ctx.lag.reads = sampler.reads = lambda p: streams_read(definitions, registry, p)
    sampler.others = lambda: {run: RegistryCommitted(registry, run)}
    sampler.sample_and_store()
    consumers = {c["name"]: c for c in client.get("/api/v1/lag").json()["consumers"]}
    assert set(consumers) == {"main", run}
    assert consumers[run]["status"] == "ERR" and "legacy, no longer in the configuration" in consumers[run]["reason"]
    assert consumers[run]["last_batch_id"] == 3 and consumers[run]["streams"] == {}
    assert [c["name"] for c in client.get("/api/v1/lag", params={"stream": "orders"}).json()["consumers"]] == ["main"]
    metrics = families(client.get("/metrics").text)
    codes = {s.labels["pipeline"]: s.value for s in metrics["sketchboard_pipeline_lag_status_code"].samples}
    assert codes[run] == 5
    assert ctx.lag.report(pipeline=run).verdict.reason == consumers[run]["reason"]
    registry.close()
    definitions.close()


def test_lag_parameters_are_checked(client, lagged):
    assert client.get("/api/v1/lag", params={"stream": "nope"}).status_code == 404
    r = client.get("/api/v1/lag", params={"from": "yesterday"})
    assert r.status_code == 400
    r = client.get("/api/v1/lag", params={"from": "now", "to": "now-1m"})
    assert r.status_code == 400 and "must be after" in r.json()["detail"]


def test_pipeline_has_a_health_section(client, ctx, lagged, clock):
    body = client.get("/api/v1/pipeline").json()
    assert body["health"] == {"query": None, "lag": body["health"]["lag"], "store": None}
    assert body["health"]["lag"]["status"] == "ERR"
    ctx.health.started("main", "q", "r", "sketchboard-main", NOW_MS)
    ctx.health.progress("main", "r", 7, {"batchId": 7, "inputRowsPerSecond": 10.0, "processedRowsPerSecond": 20.0,
                                         "batchDuration": 250, "durationMs": {"addBatch": 200}}, NOW_MS)
    q = client.get("/api/v1/pipeline").json()["health"]["query"]
    assert q["running"] and q["batch_id"] == 7 and q["batch_duration_ms"] == 250


def test_pipeline_health_is_null_when_not_wired(client):
    assert client.get("/api/v1/pipeline").json()["health"] == {"query": None, "lag": None, "store": None}


def test_metrics_parse_and_have_lag_gauges(client, ctx, lagged, clock):
    post_orders(client, 6, NOW_MS)
    lagged.sample_and_store()
    clock.now += 2
    ctx.health.started("main", "q", "r", "sketchboard-main", NOW_MS)
    ctx.health.progress("main", "r", 1, {"batchId": 1, "inputRowsPerSecond": 10.0, "processedRowsPerSecond": 20.0,
                                         "batchDuration": 1500, "durationMs": {"addBatch": 1200, "getBatch": 3}},
                        NOW_MS)
    text = client.get("/metrics").text
    f = families(text)
    seconds = {(s.labels["stream"], s.labels["partition"]): s.value for s in f["sketchboard_lag_seconds"].samples}
    assert len(seconds) == sum(s.partitions for s in ctx.catalog.streams.values()) and max(seconds.values()) == 0.0  # sampled at the post: 0 s old then
    sampled = {k: s.value for s in f["sketchboard_lag_sampled_events"].samples
               for k in [(s.labels["stream"], s.labels["partition"])]}
    assert sum(v for (stream, _), v in sampled.items() if stream == "orders") == 6
    status = [s for s in f["sketchboard_lag_status"].samples if s.value == 1]
    assert len(status) == sum(s.partitions for s in ctx.catalog.streams.values()) and all(s.labels["sketchboard_lag_status"] == "OK" for s in status)
    assert [s.value for s in f["sketchboard_pipeline_lag_status_code"].samples] == [0]
    events_in = {s.labels["stream"]: s.value for s in f["sketchboard_events_in"].samples}
    assert events_in == {**{name: 0.0 for name in ctx.catalog.streams}, "orders": 6.0}
    assert f["sketchboard_events_in"].type == "counter"
    assert {s.labels["stream"]: s.value for s in f["sketchboard_events_dead_lettered"].samples} == {
        name: 0.0 for name in ctx.catalog.streams}
    assert [s.value for s in f["sketchboard_batch_duration_seconds"].samples] == [1.5]
    parts = {s.labels["part"]: s.value for s in f["sketchboard_batch_duration_part_seconds"].samples}
    assert parts == {"addBatch": 1.2, "getBatch": 0.003}
    assert [s.value for s in f["sketchboard_query_running"].samples] == [1]
    rates = {s.labels["kind"]: s.value for s in f["sketchboard_query_rows_per_second"].samples}
    assert rates == {"input": 10.0, "processed": 20.0}


def test_metrics_have_http_request_durations_by_route_template(client, lagged):
    client.get("/api/v1/lag", params={"stream": "orders"})
    client.get("/api/v1/lag", params={"stream": "nope"})
    client.get("/no/such/page")
    f = families(client.get("/metrics").text)
    counts = {(s.labels["method"], s.labels["route"], s.labels["status"]): s.value
              for s in f["sketchboard_http_request_duration_seconds"].samples if s.name.endswith("_count")}
    assert counts[("GET", "/api/v1/lag", "200")] >= 1
    assert counts[("GET", "/api/v1/lag", "404")] >= 1
    assert counts[("GET", "<unmatched>", "404")] >= 1
    assert not any(route == "/no/such/page" for _, route, _ in counts)


def test_app_wires_the_lag_feed_and_query_health_into_the_websocket_hub(ctx, lagged, clock):
    from api.app import create_app

    sampler = lagged
    ctx.health.started("main", "q", "r", "sketchboard-main", NOW_MS)
    app = create_app(ctx)
    feeds = {feed.topic: feed for feed in app.state.hub.feeds}
    assert set(feeds) >= {"pipeline", "lag"}
    sampler.sample_and_store()
    (lag,) = feeds["lag"].poll()
    assert lag["type"] == "lag" and set(lag["streams"]) == set(ctx.catalog.streams)
    (pipeline,) = feeds["pipeline"].poll()
    assert pipeline["query"]["running"] and pipeline["query"]["name"] == "sketchboard-main"
    app.state.hub.stop()

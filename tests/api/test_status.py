"""Health, readiness, pipeline progress and lag, Prometheus metrics, OpenAPI and the index page."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from store import BatchCommit, PaneData, PanePartial, pane_start

NOW_MS = 1_800_000_000_000  # the fake clock of conftest
EVENT_MS = NOW_MS - 45_000


@pytest.fixture
def pane_store(store_backend):
    """Every test here on SQLite and on PostgreSQL (tests/api/conftest.py)."""
    return store_backend.create()


@pytest.fixture
def ingested(client, ctx):
    """12 events in http_requests and 3 in orders, written through the API."""
    r = client.post("/api/v1/events", params={"stream": "http_requests"},
                    json=[{"time": EVENT_MS, "user_id": f"u{i}"} for i in range(12)])
    assert r.status_code == 200 and r.json()["accepted"] == 12, r.text
    r = client.post("/api/v1/events", params={"stream": "orders"},
                    json=[{"time": EVENT_MS, "customer_id": f"c{i}", "amount": 9.5} for i in range(3)])
    assert r.status_code == 200 and r.json()["accepted"] == 3, r.text
    return {"http_requests": 12, "orders": 3}


def log_ends(ctx) -> dict[str, dict[int, int]]:
    return {name: {p: o.end for p, o in ctx.log.offsets(name).items()} for name in ctx.catalog.streams}


def commit(ctx, batch_id: int, end_offsets: dict, counts: dict[str, int], now_ms: int = NOW_MS):
    start = pane_start(EVENT_MS, 10_000)
    partials = [PanePartial(stream, start, start + 10_000, {}, PaneData(count=n)) for stream, n in counts.items() if n]
    lateness = {name: s.allowed_lateness for name, s in ctx.catalog.streams.items()}
    result = ctx.store.commit_batch(
        BatchCommit(ctx.pipeline_name, batch_id, partials, sum(counts.values()),
                    {stream: EVENT_MS for stream, n in counts.items() if n}, end_offsets),
        lateness_ms=lateness, now_ms=now_ms,
    )
    assert result.committed


def metric_samples(text: str) -> dict[str, list]:
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


# -- liveness and readiness -----------------------------------------------------------


def test_healthz(client):
    r = client.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


def test_readyz(client):
    r = client.get("/readyz")
    assert r.status_code == 200
    assert r.json() == {"status": "ready", "checks": {"log": "ok", "store": "ok"}}


def test_readyz_is_503_when_the_store_fails(client, ctx):
    ctx.store.close()
    r = client.get("/readyz")
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "not ready"
    assert body["checks"]["log"] == "ok"
    assert body["checks"]["store"].startswith("error:")


# -- pipeline progress ----------------------------------------------------------------


def test_pipeline_before_any_batch(client, ctx):
    status = client.get("/api/v1/pipeline").json()
    assert status["pipeline"] == "main"
    assert status["last_batch_id"] is None and status["last_commit_ms"] is None
    assert status["seconds_since_last_commit"] is None
    assert status["batches"] == 0 and status["events_read"] == 0 and status["lag_events"] == 0
    assert set(status["streams"]) == set(ctx.catalog.streams)  # the demo's, and the generated session streams
    assert len(status["streams"]["http_requests"]["partitions"]) == 4
    assert len(status["streams"]["orders"]["partitions"]) == 2


def test_pipeline_lag_is_the_log_before_any_commit(client, ctx, ingested):
    status = client.get("/api/v1/pipeline").json()
    assert status["lag_events"] == 15
    assert status["batches"] == 0
    ends = log_ends(ctx)
    for name, n in ingested.items():
        s = status["streams"][name]
        assert s["events_in_log"] == n
        assert s["lag_events"] == n
        assert s["events_aggregated"] == 0 and s["panes"] == 0
        assert s["watermark_ms"] is None and s["max_event_ms"] is None
        for p, part in s["partitions"].items():
            end = ends[name][int(p)]
            assert part == {"log_start": 0, "log_end": end, "committed": 0, "lag_events": end,
                            "max_event_ms": None, "watermark_ms": None, "watermark_state": None}


def test_pipeline_lag_is_zero_after_committing_up_to_the_log_ends(client, ctx, ingested, clock):
    commit(ctx, 0, log_ends(ctx), ingested)
    clock.now += 5
    status = client.get("/api/v1/pipeline").json()
    assert status["lag_events"] == 0
    assert status["last_batch_id"] == 0
    assert status["batches"] == 1
    assert status["events_read"] == 15
    assert status["last_commit_ms"] == NOW_MS
    assert status["seconds_since_last_commit"] == 5.0
    for name, n in ingested.items():
        s = status["streams"][name]
        assert s["lag_events"] == 0
        assert s["events_in_log"] == n
        assert s["events_aggregated"] == n
        assert s["panes"] == 1
        assert s["max_event_ms"] == EVENT_MS
        assert s["watermark_ms"] == EVENT_MS - ctx.catalog.streams[name].allowed_lateness
        for p, part in s["partitions"].items():
            assert part["committed"] == part["log_end"]
            assert part["lag_events"] == 0


def test_pipeline_shows_each_partitions_watermark_and_which_one_holds_the_stream_back(client, ctx, ingested):
    """Every partition of http_requests read to its end with newer events, but one only half-way:
    that one holds the stream's watermark at its own (store/watermarks.py)."""
    ends = log_ends(ctx)["http_requests"]
    half = max(ends, key=ends.get)
    full = next(p for p, e in ends.items() if p != half and e > 0)
    read = sum(ends.values()) - ends[half] + 1
    lateness = ctx.catalog.streams["http_requests"].allowed_lateness
    start = pane_start(EVENT_MS, 10_000)
    batch = BatchCommit(
        ctx.pipeline_name, 0, [PanePartial("http_requests", start, start + 10_000, {}, PaneData(count=read))],
        read, {"http_requests": EVENT_MS + 5_000},
        end_offsets={"http_requests": {**ends, half: 1}},
        read_by_stream={"http_requests": read},
        partition_max_event_ms={"http_requests": {**{p: EVENT_MS + 5_000 for p, e in ends.items() if e}, half: EVENT_MS}},
        log_end_offsets={"http_requests": ends},
    )
    assert ctx.store.commit_batch(batch, lateness_ms={"http_requests": lateness}, now_ms=NOW_MS).committed
    s = client.get("/api/v1/pipeline").json()["streams"]["http_requests"]
    assert s["max_event_ms"] == EVENT_MS + 5_000
    assert s["watermark_ms"] == EVENT_MS - lateness  # not EVENT_MS + 5 s - lateness: `half` has unread events
    assert s["watermark_held_by_partition"] == half
    parts = s["partitions"]
    assert parts[str(full)]["watermark_state"] == "caught_up"
    assert parts[str(full)]["watermark_ms"] == EVENT_MS + 5_000 - lateness
    assert parts[str(half)]["watermark_state"] == "active" and parts[str(half)]["watermark_ms"] == EVENT_MS - lateness


def test_pipeline_lag_counts_what_the_committed_offsets_leave(client, ctx, ingested):
    ends = log_ends(ctx)
    partition, end = next((p, e) for p, e in ends["http_requests"].items() if e > 0)
    commit(ctx, 0, {"http_requests": {partition: end}}, {"http_requests": end})
    status = client.get("/api/v1/pipeline").json()
    assert status["streams"]["http_requests"]["lag_events"] == 12 - end
    assert status["streams"]["http_requests"]["partitions"][str(partition)]["lag_events"] == 0
    assert status["streams"]["orders"]["lag_events"] == 3
    assert status["lag_events"] == 15 - end

    # new events after the commit show up as lag again
    r = client.post("/api/v1/events", params={"stream": "orders"},
                    json=[{"time": EVENT_MS, "customer_id": "c9"}])
    assert r.status_code == 200
    assert client.get("/api/v1/pipeline").json()["streams"]["orders"]["lag_events"] == 4


def test_pipeline_lag_ignores_events_dropped_by_retention(client, ctx, ingested):
    dropped = ctx.log.apply_retention(now_ms=NOW_MS + 7_200_000, max_age_ms=3_600_000, max_bytes_per_partition=1 << 30)
    assert dropped == 15
    status = client.get("/api/v1/pipeline").json()
    assert status["lag_events"] == 0
    for name in ingested:
        s = status["streams"][name]
        assert s["events_in_log"] == 0 and s["lag_events"] == 0
        for part in s["partitions"].values():
            assert part["log_start"] == part["log_end"] == part["committed"]


# -- Prometheus -----------------------------------------------------------------------


def zeros(ctx) -> dict[str, float]:
    """0 for every stream of the catalog (the demo's, and those its `sessions:` generate)."""
    return {name: 0.0 for name in ctx.catalog.streams}


def partitions(ctx) -> int:
    return sum(s.partitions for s in ctx.catalog.streams.values())


def test_prometheus_metrics_before_commit(client, ctx, ingested):
    r = client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    families = metric_samples(r.text)

    log_events = {s.labels["stream"]: s.value for s in families["sketchboard_log_events"]}
    assert log_events == {**zeros(ctx), "http_requests": 12.0, "orders": 3.0}

    lag = {(s.labels["stream"], s.labels["partition"]): s.value for s in families["sketchboard_lag_events"]}
    ends = log_ends(ctx)
    assert lag == {(name, str(p)): float(e) for name, parts in ends.items() for p, e in parts.items()}
    assert len(lag) == partitions(ctx)

    aggregated = {s.labels["stream"]: s.value for s in families["sketchboard_events_aggregated"]}
    assert aggregated == zeros(ctx)
    assert [s.value for s in families["sketchboard_batches_committed"]] == [0.0]
    assert families["sketchboard_watermark_seconds"] == []  # no watermark yet


def test_prometheus_metrics_after_commit(client, ctx, ingested):
    commit(ctx, 0, log_ends(ctx), ingested)
    families = metric_samples(client.get("/metrics").text)
    assert all(s.value == 0.0 for s in families["sketchboard_lag_events"])
    assert len(families["sketchboard_lag_events"]) == partitions(ctx)
    assert [s.value for s in families["sketchboard_batches_committed"]] == [1.0]
    aggregated = {s.labels["stream"]: s.value for s in families["sketchboard_events_aggregated"]}
    assert aggregated == {**zeros(ctx), "http_requests": 12.0, "orders": 3.0}
    watermarks = {s.labels["stream"]: s.value for s in families["sketchboard_watermark_seconds"]}
    assert watermarks == {"http_requests": (EVENT_MS - 30_000) / 1000, "orders": (EVENT_MS - 60_000) / 1000}


def test_prometheus_metrics_with_an_empty_log(client, ctx):
    families = metric_samples(client.get("/metrics").text)
    assert {s.labels["stream"]: s.value for s in families["sketchboard_log_events"]} == zeros(ctx)
    assert len(families["sketchboard_lag_events"]) == partitions(ctx)


def test_metrics_without_the_log_still_export_every_other_source(client, ctx, monkeypatch):
    """The brokers away made /metrics a 503 whole: Prometheus lost every series."""
    from ingest.log import LogUnavailable

    client.get("/healthz")
    before = metric_samples(client.get("/metrics").text)
    assert {s.labels["source"]: s.value for s in before["sketchboard_scrape_source_up"]} == \
        {"pipeline": 1.0, "query": 1.0, "device_clocks": 1.0}

    def down(stream):
        raise LogUnavailable("offsets at broker1:9092: KafkaError{code=_TRANSPORT}")

    monkeypatch.setattr(ctx.log, "offsets", down)
    r = client.get("/metrics")
    assert r.status_code == 200
    families = metric_samples(r.text)
    assert {s.labels["source"]: s.value for s in families["sketchboard_scrape_source_up"]} == \
        {"pipeline": 0.0, "query": 1.0, "device_clocks": 1.0}
    assert "sketchboard_log_events" not in families and "sketchboard_events_in" not in families
    assert families["sketchboard_query_running"] and families["sketchboard_http_request_duration_seconds"]


def test_a_made_up_http_method_is_one_other_series_not_one_per_method(client):
    for i in range(20):
        client.request(f"X{i}", "/healthz")
        client.request(f"Y{i}", "/no/such/path")
    client.request("OPTIONS", "/healthz")
    families = metric_samples(client.get("/metrics").text)
    methods = {s.labels["method"] for s in families["sketchboard_http_request_duration_seconds"]}
    assert {"other", "OPTIONS", "GET"} <= methods and not any(m.startswith(("X", "Y")) for m in methods)
    counts = {(s.labels["method"], s.labels["route"]): s.value
              for s in families["sketchboard_http_request_duration_seconds"] if s.name.endswith("_count")}
    assert counts[("other", "/healthz")] >= 20 and counts[("other", "<unmatched>")] >= 20


# -- documentation and the index page ------------------------------------------------


def test_openapi_lists_the_api(client):
    r = client.get("/openapi.json")
    assert r.status_code == 200
    paths = r.json()["paths"]
    for path in ("/api/v1/events", "/api/v1/query", "/api/v1/streams", "/api/v1/metrics", "/api/v1/pipeline"):
        assert path in paths
    assert "post" in paths["/api/v1/events"]
    assert "get" in paths["/api/v1/query"]
    names = {p["name"] for p in paths["/api/v1/query"]["get"]["parameters"]}
    assert {"metric", "stat", "from", "to", "step", "window", "group_by", "filter"} <= names
    assert "/" not in paths  # the index page is not part of the API


def test_docs_page(client):
    r = client.get("/docs")
    assert r.status_code == 200
    assert "text/html" in r.headers["content-type"]


def test_index_is_html(client):
    r = client.get("/")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert "<html" in r.text and "Sketchboard" in r.text
    assert "/api/v1/query" in r.text


def test_only_get_pipeline_counts_the_panes(client, ctx, ingested, monkeypatch):
    """Counting the panes and corrections reads every pane (~130 ms at a day of 3 M events, on
    SQLite behind the lock the queries share): GET /api/v1/pipeline shows the counts; what polls
    progress — the websocket's pipeline feed every second, /metrics scrapes, lag rounds, the dead
    letters' counts — asks without them."""
    from api.feeds import PipelineFeed
    from lag.sources import StoreCommitted

    commit(ctx, 0, log_ends(ctx), ingested)
    asked, progress = [], ctx.store.progress

    def spy(pipeline, **kwargs):
        asked.append(kwargs.get("row_counts", True))
        return progress(pipeline, **kwargs)

    monkeypatch.setattr(ctx.store, "progress", spy)
    assert PipelineFeed(ctx.store, ctx.log, ctx.catalog).poll()[0]["last_batch_id"] == 0
    assert client.get("/metrics").status_code == 200
    assert StoreCommitted(ctx.store, ctx.pipeline_name).committed() is not None
    assert client.get("/api/v1/dead-letters").status_code == 200
    assert asked and not any(asked)
    status = client.get("/api/v1/pipeline").json()["streams"]["http_requests"]
    assert asked[-1] is True and (status["panes"], status["corrections"]) == (1, 0)

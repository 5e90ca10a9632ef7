"""Real Spark, a real log and a real store, as a deployment has them: the embedded log file with a
SQLite store, or the scale-out pair, a real Kafka broker's topics (read by Spark's Kafka source)
with a real PostgreSQL server (one parametrization of the `log_backend` and `store_backend`
fixtures). Events in through the API, numbers out through the API, compared with an exact
computation over the same events."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from aggregates.checkpoint_moves import logged_batches
from aggregates.driver_batch import rows_at_most
from aggregates.pipeline import Pipeline
from api.app import create_app
from api.context import ApiContext
from ingest.kafka_offset_json import spark_offsets_json
from tests.log_backends import ON_BOTH_STACKS, TestLog
from tests.spark.events import T0, assert_panes_exact, frame, http_events, rank_interval

pytestmark = [
    pytest.mark.spark,
    ON_BOTH_STACKS,
]

HLL_BOUND = 3 * 0.0162  # the quality bar: within 3 x 1.62 % (lg_k 12)
KLL_BOUND = 0.0133  # the quality bar: rank within +/- 1.33 % (k 200)


class Service:
    """The API and the pipeline over one data directory, as `sketchboard up` wires them."""

    def __init__(self, log: TestLog, catalog, spark, store_backend):
        root = log.root
        self.root, self.catalog, self.spark, self.test_log, self.backend = root, catalog, spark, log, store_backend
        self.log = log.open(catalog)
        self.store = store_backend.create()
        self.ctx = ApiContext(catalog=catalog, log=self.log, store=self.store, clock=lambda: (T0 + 600_000) / 1000)
        self.client = TestClient(create_app(self.ctx))

    def post(self, stream: str, events: list[dict], chunk: int = 5000) -> None:
        for i in range(0, len(events), chunk):
            answer = self.client.post(f"/api/v1/events?stream={stream}", content=json.dumps(events[i : i + chunk]),
                                      headers={"content-type": "application/json"})
            assert answer.status_code == 200, answer.text
            assert answer.json()["rejected"] == []

    def pipeline(self, max_records_per_batch: int = 1_000_000) -> Pipeline:
        config = self.test_log.pipeline_config(max_records_per_batch=max_records_per_batch, max_records_per_task=20_000)
        # The pipeline process's own store over the same data, as `sketchboard up` opens it.
        return Pipeline(self.spark, self.catalog, self.backend.reopen(self.store), config, log=self.test_log.open(self.catalog))

    def query(self, **params) -> dict:
        answer = self.client.get("/api/v1/query", params=params)
        assert answer.status_code == 200, answer.text
        return answer.json()



@pytest.fixture
def service(tmp_path, demo_catalog, spark, log_backend, store_backend):
    service = Service(log_backend.new(tmp_path), demo_catalog, spark, store_backend)
    yield service
    service.log.close()


def test_api_to_pipeline_to_query_is_exact_and_within_sketch_bounds(service: Service):
    events = http_events(40_000, seed=1)
    service.post("http_requests", events)
    # Several micro-batches, so panes are merged across batches as well as within one.
    service.pipeline(max_records_per_batch=15_000).run_until_drained()

    assert_panes_exact(service.store, events)
    progress = service.client.get("/api/v1/pipeline").json()
    assert progress["batches"] >= 3
    assert progress["streams"]["http_requests"]["events_aggregated"] == len(events)
    assert progress["lag_events"] == 0

    df = frame(events)
    start, end = T0, T0 + 300_000
    # Counts, sums, min and max per 1-minute tumbling window through the query API.
    for stat, column, fn in (("count", "latency_ms", "count"), ("sum", "latency_ms", "sum"),
                             ("min", "latency_ms", "min"), ("max", "latency_ms", "max")):
        answer = service.query(metric="latency", stat=stat, **{"from": start, "to": end}, step="1m")
        exact = df.groupby(df["time"] - df["time"] % 60_000)[column].agg(fn)
        points = {p["t"]: p["value"] for p in answer["series"][0]["points"]}
        assert set(points) == set(exact.index)
        for t, value in exact.items():
            assert points[t] == pytest.approx(value, rel=1e-9), (stat, t)
            assert answer["series"][0]["points"][0]["error"] is None

    # Distinct users over the whole range and per endpoint: within 3 x 1.62 %.
    answer = service.query(metric="requests", stat="distinct", **{"from": start, "to": end}, step="5m",
                           group_by="endpoint")
    for series in answer["series"]:
        exact = df[df["endpoint"] == series["group"]["endpoint"]]["user_id"].nunique()
        point = series["points"][0]
        assert abs(point["value"] - exact) / exact <= HLL_BOUND
        assert point["error"]["kind"] == "hll" and point["error"]["lower"] <= point["value"] <= point["error"]["upper"]

    # Percentiles: the rank of each reported value in the exact data is within +/- 1.33 % of the asked rank.
    latencies = np.sort(df["latency_ms"].to_numpy())
    for q in (0.5, 0.9, 0.95, 0.99):
        answer = service.query(metric="latency", stat=f"p{q * 100:g}", **{"from": start, "to": end}, step="5m")
        point = answer["series"][0]["points"][0]
        lo, hi = rank_interval(latencies, point["value"])
        assert lo - KLL_BOUND <= q <= hi + KLL_BOUND, (q, lo, hi)
        assert point["error"]["kind"] == "kll" and point["error"]["rank_error"] == pytest.approx(KLL_BOUND, abs=1e-3)


def test_stop_mid_stream_and_restart_from_checkpoint_loses_nothing_and_counts_nothing_twice(service: Service):
    first, second = http_events(20_000, seed=2), http_events(15_000, seed=3)
    service.post("http_requests", first)
    # Run with a timed trigger and small batches; stop after the first committed batch.
    query = service.pipeline(max_records_per_batch=4_000).start()
    try:
        deadline = 120
        while service.store.last_batch_id("main") is None and deadline > 0:
            query.awaitTermination(1)
            deadline -= 1
    finally:
        query.stop()
    done = service.store.progress("main").events_read
    assert 0 < done < len(first), "stopped mid-stream"
    # Spark's own query planned batch 0 (on Kafka its source logged where it started): its size is known.
    start, end = service.pipeline().logged_offsets(0)
    assert 0 < rows_at_most(start, end) <= 4_000, (start, end)

    # More events arrive while the pipeline is down; a new pipeline resumes from the checkpoint.
    service.post("http_requests", second)
    service.pipeline(max_records_per_batch=1_000_000).run_until_drained()

    assert_panes_exact(service.store, first + second)
    assert service.store.progress("main").events_read == len(first) + len(second)
    if service.test_log.kafka:  # the offsets as Spark's Kafka source wrote them, reproduced byte for byte
        offsets = service.root / "checkpoints" / "main" / "offsets"
        lines = [(offsets / str(b)).read_text().splitlines()[2] for b in logged_batches(offsets)]
        assert len(lines) >= 2 and len(json.loads(lines[0])) == len(service.catalog.streams)  # 16 topics: 32 buckets
        assert all(line == spark_offsets_json(json.loads(line)) for line in lines), lines


def test_batch_replayed_after_a_crash_is_skipped(service: Service):
    events = http_events(10_000, seed=4)
    service.post("http_requests", events)
    service.pipeline(max_records_per_batch=4_000).run_until_drained()
    last = service.store.last_batch_id("main")
    # Batch 0's start is known on every log (the embedded source pins it, Spark's Kafka source logs
    # it in its own file), so its size is: a small first batch takes the driver's path too.
    start, end = service.pipeline().logged_offsets(0)
    assert 0 < rows_at_most(start, end) <= 4_000 and service.pipeline().fits_driver(0), (start, end)
    changes_before = len(service.store.changes_since(0, limit=10**6))

    # A crash after the store commit but before Spark wrote its own commit log: Spark re-runs
    # the batch with the same id and offsets on restart. Simulate it by removing that entry.
    commit_log = service.root / "checkpoints" / "main" / "commits" / str(last)
    assert commit_log.exists()
    commit_log.unlink()
    commit_log.with_name(f".{last}.crc").unlink(missing_ok=True)  # Hadoop's checksum sidecar
    pipeline = service.pipeline()
    pipeline.run_until_drained()

    assert pipeline.last_result is not None and pipeline.last_result.committed is False
    assert service.store.last_batch_id("main") == last
    assert len(service.store.changes_since(0, limit=10**6)) == changes_before
    assert_panes_exact(service.store, events)

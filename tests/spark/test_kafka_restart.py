"""A broker restart in the middle of a run: the API produces into Kafka (through the wiring, as
`sketchboard api` does) and the pipeline reads it with Spark's Kafka source (1 s trigger), both
running; the Kafka process is stopped and started again (same ports, same data).

While it is down the API answers 503 with the broker's reason and reports nothing accepted; once
it is back the API accepts again and the running query resumes by itself (no restart of the
pipeline). Exact oracle: every event carries a unique id, the topic holds exactly the accepted
events (nothing accepted is lost, nothing refused was written), and the store's panes count
and sum exactly those events."""

from __future__ import annotations

import json
import threading
import time
import warnings
from collections import Counter

import pytest

from aggregates.pipeline import Pipeline
from ingest.log.records import EXTRA
from sketchboard.settings import Settings
from store import SqlitePaneStore
from tests.log_backends import LogBackend
from tests.spark.events import amounts_by_pane_and_country, stored_amounts_by_pane_and_country

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

STREAM = "orders"


class Producer(threading.Thread):
    """Posts requests of 50 events back to back, each under `gate`: the test stops and starts the
    broker holding it, so no request straddles a stop or a start and each answer is unambiguous."""

    def __init__(self, client: TestClient, gate: threading.Lock, now_ms: int):
        super().__init__(daemon=True)
        self.client, self.gate, self.now_ms = client, gate, now_ms
        self.accepted: list[dict] = []
        self.refused: list[tuple[int, str]] = []  # (events, reason) of each 503
        self.other: list[str] = []  # any other answer: a failure of the test
        self.stopped = threading.Event()
        self.seq = 0

    def run(self) -> None:
        while not self.stopped.is_set():
            with self.gate:
                events = [{"time": self.now_ms + (self.seq + i) % 50_000, "customer_id": f"c{(self.seq + i) % 17}",
                           "country": ["DE", "FR", "US"][(self.seq + i) % 3], "amount": float((self.seq + i) % 100),
                           "order_id": f"o{self.seq + i}"} for i in range(50)]
                self.seq += len(events)
                try:
                    r = self.client.post("/api/v1/events", params={"stream": STREAM}, json=events)
                except Exception as exc:  # noqa: BLE001 - recorded, the test fails on it
                    self.other.append(repr(exc))
                    continue
                if r.status_code == 200 and r.json()["accepted"] == len(events):
                    self.accepted += events
                elif r.status_code == 503:
                    self.refused.append((len(events), r.json()["detail"]))
                else:
                    self.other.append(f"{r.status_code}: {r.text[:300]}")
            time.sleep(0.05)

    def wait_for(self, accepted: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.accepted) < accepted and time.monotonic() < deadline and not self.other:
            time.sleep(0.1)
        assert len(self.accepted) >= accepted and not self.other, (len(self.accepted), self.other[:3])


def written_order_ids(log, stream) -> Counter:
    """The order ids of every record in the topic, read back by the log's own reader (the
    undeclared field travels in the record's extra fields)."""
    ids: Counter = Counter()
    for partition, o in log.offsets(stream.name).items():
        for batch in log.read(stream, partition, o.start, o.end):
            ids.update(json.loads(extra)["order_id"] for extra in batch.column(EXTRA).to_pylist())
    return ids


def test_broker_restart_mid_run_api_answers_503_pipeline_resumes_counts_exact(tmp_path, demo_catalog, spark,
                                                                              kafka_broker, monkeypatch):
    from sketchboard.wiring import build_api

    monkeypatch.chdir(tmp_path)
    test_log = LogBackend("kafka", kafka_broker.bootstrap).new(tmp_path)
    settings = Settings(data_dir=tmp_path / "data", log_backend="kafka", kafka_bootstrap_servers=kafka_broker.bootstrap,
                        kafka_topic_prefix=test_log.prefix, kafka_replication_factor=1, kafka_produce_timeout="2s",
                        kafka_request_timeout="2s", alerts_config=None)
    app, ctx = build_api(settings)
    store = SqlitePaneStore(tmp_path / "store.db")
    pipeline = Pipeline(spark, demo_catalog, store, test_log.pipeline_config(trigger_interval="1 second"))
    query = pipeline.start()
    gate = threading.Lock()
    now_ms = int(time.time() * 1000)
    producer = None
    try:
        with TestClient(app, base_url="http://127.0.0.1") as client:
            producer = Producer(client, gate, now_ms)
            producer.start()
            producer.wait_for(1_000, timeout_s=60)
            # The pipeline is reading: it committed some of them before the broker goes away.
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and not _read(store):
                time.sleep(0.5)
            assert _read(store) > 0 and query.isActive, query.exception()

            with gate:
                kafka_broker.stop()
            try:
                time.sleep(8)  # the producer keeps posting: each request is refused after 2 s
                assert query.isActive, query.exception()  # the query waits out the outage
                refused_while_down = list(producer.refused)
                assert refused_while_down and not producer.other, producer.other[:3]
                for _, reason in refused_while_down:
                    assert "none is reported accepted" in reason and "did not acknowledge" in reason, reason
                accepted_before_restart = len(producer.accepted)
            finally:
                with gate:
                    if not kafka_broker.running:
                        kafka_broker.start()
            # Accepting again once the broker is back.
            producer.wait_for(accepted_before_restart + 1_000, timeout_s=90)
            producer.stopped.set()
            producer.join(30)
        accepted = producer.accepted
        assert not producer.other, producer.other[:3]

        # The running query resumes by itself and reads every accepted event.
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and query.isActive and _read(store) < len(accepted):
            time.sleep(0.5)
        assert query.isActive and query.exception() is None, query.exception()
        assert _read(store) >= len(accepted), (_read(store), len(accepted), query.status, query.recentProgress[-2:])
        time.sleep(3)  # a few more triggers: nothing beyond the accepted events arrives
    finally:
        if producer is not None:
            producer.stopped.set()
        query.stop()
        if not kafka_broker.running:  # the broker is the session's: never leave it down
            kafka_broker.start()

    # The topic holds exactly the accepted events: nothing lost, nothing refused written.
    stream = demo_catalog.stream(STREAM)
    assert written_order_ids(ctx.log, stream) == Counter(e["order_id"] for e in accepted)
    # The store: every record read, all aggregated, exact counts and sums per pane and country.
    s = store.progress("main").streams[STREAM]
    assert s.events_read == len(accepted) == s.events_aggregated and s.events_dead_lettered == 0
    want, sums = amounts_by_pane_and_country(((e["time"], e["country"], e["amount"]) for e in accepted), stream.pane)
    got, got_sums = stored_amounts_by_pane_and_country(store, STREAM)
    assert got == want
    assert got_sums == sums  # integral amounts: sums are exact
    store.close()
    ctx.log.close()


def _read(store) -> int:
    s = store.progress("main").streams.get(STREAM)
    return 0 if s is None else s.events_read

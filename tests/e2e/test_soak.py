"""A soak under mixed load, with real processes (the API and the Spark pipeline as `sketchboard`
processes on loopback, tests/procs.py): ingest at a fixed rate (with Idempotency-Keys, retried
on failure), 100 websocket clients of which 10 never read, queries, alert-rule changes, and one
pipeline restart in the middle. Then every accepted event must be aggregated exactly once, no
request may have been answered 5xx, and the API's resident memory must have stayed under its
bound. Prints its figures.

Short in `make test` (SKETCHBOARD_SOAK_SECONDS, default 30); a longer run:
`SKETCHBOARD_SOAK_SECONDS=600 .venv/bin/python -m pytest -s tests/e2e/test_soak.py`."""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
import uuid

import httpx
import pytest
from websockets.sync.client import connect

from tests.api.test_ws import NeverReadingClient

pytestmark = [pytest.mark.e2e, pytest.mark.soak]

SECONDS = float(os.environ.get("SKETCHBOARD_SOAK_SECONDS", "30"))
RATE = 400  # events per second: 40 every 100 ms
READERS, NEVER_READING = 90, 10
API_RSS_BOUND_MB = 600  # measured ~180-250 MB here (docs/robustness.md)


class Load:
    """The threads that make the load, each counting what it did and what went wrong."""

    def __init__(self, base: str, port: int):
        self.base, self.port = base, port
        self.stop = threading.Event()
        self.accepted = 0
        self.retries = 0
        self.server_errors: list[str] = []  # 5xx anywhere, and rule changes that did not take
        self.query_ms: list[float] = []
        self.ws_messages = 0
        self.rule_changes = 0
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        for target in (self._produce, self._query, self._change_rules, *([self._read_ws] * READERS)):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self.threads.append(thread)

    def join(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def _server_error(self, what: str, response: httpx.Response) -> None:
        if response.status_code >= 500:
            self.server_errors.append(f"{what}: {response.status_code} {response.text[:200]}")

    def _produce(self) -> None:
        n = 0
        with httpx.Client(base_url=self.base, timeout=10) as client:
            while not self.stop.is_set():
                started = time.monotonic()
                now = int(time.time() * 1000)
                events = [{"time": now - i, "endpoint": f"/e{(n + i) % 7}", "status": 200, "region": "eu",
                           "latency_ms": float((n + i) % 250), "user_id": f"u{(n + i) % 1000}"} for i in range(40)]
                n += 40
                body, key = json.dumps(events), uuid.uuid4().hex
                while True:  # retried with the same key until answered: a timeout must not duplicate
                    try:
                        r = client.post("/api/v1/events", params={"stream": "http_requests"}, content=body,
                                        headers={"content-type": "application/json", "idempotency-key": key})
                    except httpx.HTTPError:
                        self.retries += 1
                        continue
                    self._server_error("ingest", r)
                    if r.status_code == 200:
                        self.accepted += r.json()["accepted"]
                        break
                    self.retries += 1
                    time.sleep(0.1)
                self.stop.wait(max(0.0, 0.1 - (time.monotonic() - started)))

    def _query(self) -> None:
        with httpx.Client(base_url=self.base, timeout=30) as client:
            while not self.stop.is_set():
                started = time.perf_counter()
                r = client.get("/api/v1/query", params={"metric": "latency", "stat": "p99", "from": "now-5m",
                                                        "step": "10s", "group_by": "endpoint"})
                self.query_ms.append((time.perf_counter() - started) * 1000)
                self._server_error("query", r)
                self.stop.wait(0.2)

    def _change_rules(self) -> None:
        rule = {"name": "soak", "kind": "threshold", "metric": "latency", "stat": "p99", "window": "1m",
                "threshold": 200}
        with httpx.Client(base_url=self.base, timeout=30) as client:
            i = 0
            while not self.stop.is_set():  # create, change, delete, over and over
                if i % 3 == 0:
                    r = client.post("/api/v1/alerts/rules", json=rule)
                elif i % 3 == 1:
                    r = client.put("/api/v1/alerts/rules/soak", json={**rule, "threshold": 100 + i})
                else:
                    r = client.delete("/api/v1/alerts/rules/soak")
                if r.status_code >= 300:
                    self.server_errors.append(f"rules: {r.status_code} {r.text[:200]}")  # every change must take
                self.rule_changes += 1
                i += 1
                self.stop.wait(0.5)

    def _read_ws(self) -> None:
        with connect(f"ws://127.0.0.1:{self.port}/api/v1/ws", open_timeout=30) as ws:
            ws.send(json.dumps({"type": "subscribe", "id": "s", "query": {
                "metric": "latency", "stats": ["count", "p99"], "from": "now-2m", "step": "10s"}}))
            while not self.stop.is_set():
                try:
                    ws.recv(timeout=0.5)
                    self.ws_messages += 1
                except TimeoutError:
                    continue


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def test_a_soak_under_mixed_load_aggregates_every_event_exactly_once(service_factory):
    service = service_factory(spark_driver_memory="1g")
    service.start_api()
    service.start_pipeline()
    service.wait_for(lambda: service.get("/api/v1/pipeline")["health"]["query"], 240, "the pipeline's query to start")
    never_reading = [NeverReadingClient(service.port) for _ in range(NEVER_READING)]
    for client in never_reading:
        client.send_text(json.dumps({"type": "subscribe", "id": "n", "query": {
            "metric": "latency", "stats": ["count", "p99"], "from": "now-2m", "step": "10s", "group_by": "endpoint"}}))
    load = Load(service.base, service.port)
    api_pid = service.procs["api"].pid
    rss = [_rss_mb(api_pid)]
    started = time.monotonic()
    load.start()
    restarted = False
    while time.monotonic() - started < SECONDS:
        time.sleep(1)
        rss.append(_rss_mb(api_pid))
        if not restarted and time.monotonic() - started >= SECONDS / 2:
            assert service.stop("pipeline") == 0  # one restart in the middle, under load
            service.start_pipeline()
            restarted = True
    load.join()
    elapsed = time.monotonic() - started

    def drained():
        stream = service.get("/api/v1/pipeline")["streams"]["http_requests"]
        return stream["events_aggregated"] + stream["events_dead_lettered"] >= load.accepted and stream

    stream = service.wait_for(drained, 300, "every accepted event to be aggregated")
    for client in never_reading:
        client.close()
    summary = {
        "seconds": round(elapsed, 1), "events_accepted": load.accepted,
        "events_per_s": round(load.accepted / elapsed), "ingest_retries": load.retries,
        "queries": len(load.query_ms),
        "query_p50_ms": round(statistics.median(load.query_ms), 1) if load.query_ms else None,
        "query_p99_ms": round(statistics.quantiles(load.query_ms, n=100)[98], 1) if len(load.query_ms) > 1 else None,
        "ws_messages_read": load.ws_messages, "rule_changes": load.rule_changes,
        "api_rss_mb_start": round(rss[0]), "api_rss_mb_max": round(max(rss)),
    }
    print("\nsoak:", json.dumps(summary))
    assert load.server_errors == []
    assert stream["events_aggregated"] == load.accepted and stream["events_dead_lettered"] == 0
    assert restarted and load.accepted > 0 and load.ws_messages > 0 and load.rule_changes > 0
    assert max(rss) < API_RSS_BOUND_MB, summary

"""bench/http_wire.py, the benchmarks' load-generator client, against the real API over loopback:
the answers it reads are the ones httpx reads, on one keep-alive connection, and a connection the
server closes is opened again."""

from __future__ import annotations

import json

import httpx
import pytest

from api.app import create_app
from bench.http_wire import WireClient
from bench.ingest_api import run_bench
from tests.api.test_ws import Server

STREAM = "http_requests"


def body(now_ms: int, n: int, first: int = 0) -> bytes:
    return json.dumps([{"time": now_ms - i, "user_id": f"u{i}", "endpoint": "/cart", "method": "GET",
                        "status": "200", "region": "eu", "latency_ms": 1.5, "response_bytes": 10}
                       for i in range(first, first + n)]).encode()


def test_the_wire_client_reads_what_httpx_reads(ctx, now_ms):
    headers = {"content-type": "application/json"}
    with Server(create_app(ctx)) as server, WireClient(server.http) as wire, \
            httpx.Client(base_url=server.http) as http:
        head = wire.request_head("POST", f"/api/v1/events?stream={STREAM}", headers)
        answers = [wire.send(head(len(b)), b) for b in (body(now_ms, 50), body(now_ms, 40, first=100), b"[1")]
        wrong = wire.send(wire.request_head("POST", "/api/v1/events?stream=nope", headers)(2), b"[]")
        by_httpx = http.post("/api/v1/events", params={"stream": STREAM}, content=body(now_ms, 30, first=200),
                             headers=headers)
    assert [status for status, _ in answers] == [200, 200, 400]
    assert [json.loads(answer)["accepted"] for _, answer in answers[:2]] == [50, 40]
    assert wrong[0] == 404 and "unknown stream" in json.loads(wrong[1])["detail"]
    assert set(json.loads(answers[0][1])) == set(by_httpx.json())  # the same answer's fields


def test_the_wire_client_opens_a_connection_the_server_closed(ctx, now_ms):
    with Server(create_app(ctx)) as server, WireClient(server.http) as wire:
        head = wire.request_head("POST", f"/api/v1/events?stream={STREAM}",
                                 {"content-type": "application/json", "connection": "close"})
        answers = [wire.send(head(len(b)), b) for b in (body(now_ms, 5), body(now_ms, 5, first=10))]
    assert [status for status, _ in answers] == [200, 200]


def test_the_benchmark_counts_the_same_with_either_client(ctx, now_ms):
    bodies = [(20, body(now_ms, 20, first=20 * k)) for k in range(10)]
    with Server(create_app(ctx)) as server:
        results = {client: run_bench(server.http, STREAM, bodies, 3, client=client) for client in ("httpx", "wire")}
    for result in results.values():
        assert (result.accepted, result.requests, result.failed_requests) == (200, 10, 0)


def test_only_plain_http_urls():
    with pytest.raises(ValueError, match="plain http"):
        WireClient("https://example.org")

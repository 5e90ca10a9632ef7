"""Idempotency-Key on POST /api/v1/events (and a changelog table's writes) over real HTTP on loopback (uvicorn in a thread,
httpx), with the real SQLite log and store: a retried request appends nothing and gets the first
answer back, across a restart of the API too; a key reused for other events is refused; a
refused request frees its key; concurrent retries append once. Without the header every POST
appends (the producer's retry duplicates), which is what the header is for."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest

from api.app import create_app
from tests.api.conftest import wired
from tests.api.test_ws import Server

EVENTS = "/api/v1/events?stream=orders"


def orders(now_ms: int, n: int = 3, amount: float = 3.5) -> list[dict]:
    return [{"time": now_ms - i, "customer_id": f"c{i}", "amount": amount} for i in range(n)]


def appended(ctx) -> int:
    return sum(o.end - o.start for o in ctx.log.offsets("orders").values())


@pytest.fixture
def http(wired_ctx):
    with Server(create_app(wired_ctx)) as server, httpx.Client(base_url=server.http, timeout=10) as client:
        yield client


def test_a_retry_with_the_same_key_appends_nothing_and_gets_the_first_answer(http, wired_ctx, now_ms):
    first = http.post(EVENTS, json=orders(now_ms), headers={"Idempotency-Key": "batch-0001"})
    assert first.status_code == 200 and first.json()["accepted"] == 3
    assert "idempotent-replayed" not in first.headers
    retry = http.post(EVENTS, json=orders(now_ms), headers={"Idempotency-Key": "batch-0001"})
    assert retry.status_code == 200 and retry.json() == first.json()
    assert retry.headers["idempotent-replayed"] == "true"
    assert appended(wired_ctx) == 3
    # A new key is new events.
    assert http.post(EVENTS, json=orders(now_ms), headers={"Idempotency-Key": "batch-0002"}).status_code == 200
    assert appended(wired_ctx) == 6


def test_without_a_key_a_retry_appends_again(http, wired_ctx, now_ms):
    for _ in range(2):
        assert http.post(EVENTS, json=orders(now_ms)).status_code == 200
    assert appended(wired_ctx) == 6


def test_the_same_key_with_other_events_is_refused_and_writes_nothing(http, wired_ctx, now_ms):
    assert http.post(EVENTS, json=orders(now_ms), headers={"Idempotency-Key": "k"}).status_code == 200
    other = http.post(EVENTS, json=orders(now_ms, amount=9.0), headers={"Idempotency-Key": "k"})
    assert other.status_code == 422 and other.json()["param"] == "Idempotency-Key"
    assert "different request" in other.json()["detail"]
    # Another stream, or atomic=true, is another request too.
    assert http.post(EVENTS + "&atomic=true", json=orders(now_ms), headers={"Idempotency-Key": "k"}).status_code == 422
    assert appended(wired_ctx) == 3


def test_a_refused_request_frees_its_key(http, wired_ctx, now_ms):
    bad = [{"time": now_ms, "customer_id": "c1", "amount": "not a number"}]
    refused = http.post(EVENTS + "&atomic=true", json=bad, headers={"Idempotency-Key": "fix-and-retry"})
    assert refused.status_code == 422 and appended(wired_ctx) == 0
    fixed = http.post(EVENTS + "&atomic=true", json=orders(now_ms), headers={"Idempotency-Key": "fix-and-retry"})
    assert fixed.status_code == 200 and appended(wired_ctx) == 3


@pytest.mark.parametrize("key", ["", "has space", "x" * 256, "caf\u00e9"])
def test_a_malformed_key_is_refused_naming_the_header(http, wired_ctx, now_ms, key):
    r = http.post(EVENTS, json=orders(now_ms), headers={"Idempotency-Key": key.encode("utf-8")})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["header", "Idempotency-Key"]
    assert appended(wired_ctx) == 0


def test_concurrent_retries_append_once(http, wired_ctx, now_ms):
    body = orders(now_ms, n=200)

    def post(_):
        return http.post(EVENTS, json=body, headers={"Idempotency-Key": "racing"})

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(post, range(16)))
    ok = [a for a in answers if a.status_code == 200]
    assert {a.status_code for a in answers} <= {200, 409}
    assert all(a.headers["retry-after"] == "1" for a in answers if a.status_code == 409)
    assert ok and all(a.json() == ok[0].json() for a in ok)
    assert appended(wired_ctx) == 200


def test_answers_are_kept_across_a_restart_of_the_api(ctx, tmp_path, clock, now_ms):
    with wired(ctx, tmp_path, clock) as first_ctx, Server(create_app(first_ctx)) as server:
        first = httpx.post(server.http + EVENTS, json=orders(now_ms), headers={"Idempotency-Key": "k"})
    assert first.status_code == 200
    with wired(ctx, tmp_path, clock) as second_ctx, Server(create_app(second_ctx)) as server:
        retry = httpx.post(server.http + EVENTS, json=orders(now_ms), headers={"Idempotency-Key": "k"})
    assert retry.json() == first.json() and retry.headers["idempotent-replayed"] == "true"
    assert appended(ctx) == 3


def test_a_key_expires_after_its_ttl(http, wired_ctx, clock, now_ms):
    assert http.post(EVENTS, json=orders(now_ms), headers={"Idempotency-Key": "k"}).status_code == 200
    clock.now += wired_ctx.idempotency.ttl_ms / 1000
    again = http.post(EVENTS, json=orders(now_ms), headers={"Idempotency-Key": "k"})
    assert again.status_code == 200 and "idempotent-replayed" not in again.headers
    assert appended(wired_ctx) == 6


def rows_appended(ctx) -> int:
    return sum(o.end - o.start for o in ctx.log.offsets("users").values())


def test_a_tables_writes_take_the_key_as_events_do(http, wired_ctx):
    # The header was ignored on a table's routes: each retry appended the rows again.
    rows = [{"user_id": "u1", "plan": "pro"}, {"user_id": "u2", "_deleted": True}]
    first = http.post("/api/v1/tables/users", json=rows, headers={"Idempotency-Key": "rows-1"})
    assert first.status_code == 200 and first.json()["upserts"] == 1 and "idempotent-replayed" not in first.headers
    retry = http.post("/api/v1/tables/users", json=rows, headers={"Idempotency-Key": "rows-1"})
    assert retry.status_code == 200 and retry.json() == first.json()
    assert retry.headers["idempotent-replayed"] == "true"
    assert rows_appended(wired_ctx) == 2
    other = http.post("/api/v1/tables/users", json=rows[:1], headers={"Idempotency-Key": "rows-1"})
    assert other.status_code == 422 and other.json()["param"] == "Idempotency-Key"
    # A delete too; the same key on another request (a delete of another key) is refused.
    gone = [http.delete("/api/v1/tables/users/u1", headers={"Idempotency-Key": "del-1"}) for _ in range(2)]
    assert [g.status_code for g in gone] == [200, 200] and gone[1].json() == gone[0].json()
    assert gone[1].headers["idempotent-replayed"] == "true" and gone[0].json()["deletes"] == 1
    assert http.delete("/api/v1/tables/users/u2", headers={"Idempotency-Key": "del-1"}).status_code == 422
    assert rows_appended(wired_ctx) == 3
    # Without a key every write appends, as for events.
    assert http.post("/api/v1/tables/users", json=rows).status_code == 200
    assert rows_appended(wired_ctx) == 5

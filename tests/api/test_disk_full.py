"""Disk full while ingesting, over real HTTP on loopback: SQLite's `max_page_count` makes the
real log (or store) file full. The API answers 503 with the reason, nothing is half-written
(the log's offsets do not move), and once there is room again the same request goes through."""

from __future__ import annotations

import random

import httpx
import pytest

from api.app import create_app
from tests.api.test_ws import Server

EVENTS = "/api/v1/events?stream=orders"


def orders(now_ms: int, n: int) -> list[dict]:
    return [{"time": now_ms - i, "customer_id": f"customer-{i:06d}-" + "x" * 20, "amount": 1.5} for i in range(n)]


def incompressible_orders(now_ms: int, n: int) -> list[dict]:
    """Orders with random ids: the segments they make are larger than one of the log's 16 KiB pages
    (LZ4 cannot shrink them), so room left in the pages the file has cannot take them."""
    rng = random.Random(7)
    return [{"time": now_ms - i, "customer_id": rng.randbytes(40).hex(), "amount": 1.5} for i in range(n)]


def offsets(ctx) -> dict:
    return {p: (o.start, o.end) for p, o in ctx.log.offsets("orders").items()}


def fill(conn) -> int:
    """Cap the SQLite file at the pages it has now: the next write that needs a page is SQLITE_FULL."""
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")
    return pages


@pytest.fixture
def http(wired_ctx):
    with Server(create_app(wired_ctx)) as server, httpx.Client(base_url=server.http, timeout=10) as client:
        yield client


def test_a_full_log_is_a_503_that_writes_nothing_and_the_retry_goes_through(http, wired_ctx, now_ms):
    before = offsets(wired_ctx)
    pages = fill(wired_ctx.log._conn)  # the log's own connection: where appends are written
    body = incompressible_orders(now_ms, 400)  # ~53 KB of JSON, under the test API's 64 KiB
    full = http.post(EVENTS, json=body, headers={"Idempotency-Key": "k1"})
    assert full.status_code == 503, full.text
    assert "cannot write" in full.json()["detail"] and "full" in full.json()["detail"]
    assert offsets(wired_ctx) == before
    wired_ctx.log._conn.execute(f"PRAGMA max_page_count = {pages * 1000}")  # space is back
    again = http.post(EVENTS, json=body, headers={"Idempotency-Key": "k1"})  # the 503 freed the key
    assert again.status_code == 200 and again.json()["accepted"] == 400
    assert sum(end - start for start, end in offsets(wired_ctx).values()) == 400
    # What made the first append need a new page: a segment larger than a page (were pages to grow
    # past it, the room left in the file's pages could take the append, and this test would not
    # test a full log).
    page = wired_ctx.log._conn.execute("PRAGMA page_size").fetchone()[0]
    assert max(size for (size,) in wired_ctx.log._conn.execute("SELECT bytes FROM segments WHERE stream = 'orders'")) > page


def test_a_full_store_is_a_503_before_anything_is_appended(http, wired_ctx, now_ms):
    before = offsets(wired_ctx)
    pages = fill(wired_ctx.idempotency._conn.conn)  # the store file the key is recorded in
    for i in range(50):  # enough keys to need a new page
        r = http.post(EVENTS, json=orders(now_ms, 1), headers={"Idempotency-Key": f"key-{i:04d}-" + "y" * 200})
        if r.status_code == 503:
            break
    assert r.status_code == 503 and "full" in r.json()["detail"] and r.headers["retry-after"] == "5"
    assert f"the store ({wired_ctx.store.path})" in r.json()["detail"]  # the file to make room for
    appended_before_full = sum(e - s for s, e in offsets(wired_ctx).values()) - sum(e - s for s, e in before.values())
    assert appended_before_full == i  # the refused request appended nothing
    wired_ctx.idempotency._conn.conn.execute(f"PRAGMA max_page_count = {pages * 1000}")
    assert http.post(EVENTS, json=orders(now_ms, 1), headers={"Idempotency-Key": "after"}).status_code == 200


def test_a_store_full_after_the_append_still_answers_what_was_appended(http, wired_ctx, now_ms):
    """The key's claim fits, the events are appended, then recording the (large) answer finds
    the store full: the client gets the append's answer, not a 503 saying nothing changed; the
    key stays claimed, so a retry at once is a 409 and appends nothing."""
    from api.idempotency import RECORD_FAILURES

    before = sum(e - s for s, e in offsets(wired_ctx).values())
    failures = RECORD_FAILURES._value.get()
    conn = wired_ctx.idempotency._conn.conn
    pages = fill(conn)
    # Many rejected events make an answer too large for the pages left; the claim's row fits.
    body = orders(now_ms, 1) + [{"time": now_ms, "customer_id": "c", "amount": "bad-" + "z" * 50}] * 300
    first = http.post(EVENTS, json=body, headers={"Idempotency-Key": "k-full"})
    assert first.status_code == 200, first.text
    assert first.json()["accepted"] == 1
    assert sum(e - s for s, e in offsets(wired_ctx).values()) == before + 1
    assert RECORD_FAILURES._value.get() == failures + 1
    assert conn.execute("SELECT state FROM idempotency_keys WHERE idem_key = 'k-full'").fetchall() == [("in_flight",)]
    conn.execute(f"PRAGMA max_page_count = {pages * 1000}")
    retry = http.post(EVENTS, json=body, headers={"Idempotency-Key": "k-full"})
    assert retry.status_code == 409
    assert sum(e - s for s, e in offsets(wired_ctx).values()) == before + 1

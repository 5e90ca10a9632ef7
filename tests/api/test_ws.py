"""WS /api/v1/ws over a real uvicorn server on loopback: subscribe, ingest through the API,
commit to the store (the in-process stand-in for Spark), receive the changed points; errors
for malformed messages with the socket still usable; heartbeats; topic feeds; a client that
never reads stays within its queue bound."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import struct
import threading
import time

import httpx
import pytest
import uvicorn
from websockets.sync.client import connect

from api.app import create_app
from api.ws_hub import ClientQueue, HubConfig, PointsBatch, QueuedMessage, QueuedPoints, Subscription
from api.ws_protocol import QueryIn, resolve_query
from sketchboard.http_protocol import served_as_the_api
from tests.api.conftest import NOW_MS
from tests.api.test_ws_support import drain_log_into_store
from tests.support.loops import run_on_own_loop

STREAM = "http_requests"


@pytest.fixture
def pane_store(store_backend):
    """Every test here on SQLite and on PostgreSQL (where NOTIFY wakes the hub)."""
    return store_backend.create()


class Server:
    """uvicorn serving an app on 127.0.0.1, port 0, in a thread."""

    def __init__(self, app):
        self.app = app
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.sock = sock
        # The service's HTTP protocol and loop (sketchboard/cli.py `server_config`)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", **served_as_the_api()))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}/api/v1/ws"


class ListFeed:
    """A feed that broadcasts the messages put into it (as a producer module's feed would)."""

    def __init__(self, topic: str):
        self.topic = topic
        self.pending: list[dict] = []
        self.lock = threading.Lock()

    def put(self, msg: dict) -> None:
        with self.lock:
            self.pending.append(msg)

    def poll(self) -> list[dict]:
        with self.lock:
            out, self.pending = self.pending, []
        return out


@pytest.fixture
def corrections_feed():
    return ListFeed("corrections")


@pytest.fixture
def server(ctx, corrections_feed):
    config = HubConfig(poll_interval_s=0.05, heartbeat_interval_s=0.5, queue_size=16, feed_interval_s=0.05,
                       send_timeout_s=5)
    app = create_app(ctx, feeds=[corrections_feed], hub_config=config)
    with Server(app) as s:
        yield s


def recv_until(ws, predicate, timeout: float = 10.0) -> dict:
    """Messages are read (and ignored) until one matches; fails after `timeout`."""
    deadline = time.monotonic() + timeout
    seen = []
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"no matching message within {timeout} s; got types {[m['type'] for m in seen]}"
        try:
            msg = json.loads(ws.recv(timeout=left))
        except TimeoutError:
            continue
        if predicate(msg):
            return msg
        seen.append(msg)


def post(server, events, stream=STREAM):
    r = httpx.post(f"{server.http}/api/v1/events", params={"stream": stream}, json=events, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] == len(events)


def ev(t_ms: int, endpoint: str = "/api/cart", latency: float = 10.0, user: str = "u1", region: str = "eu") -> dict:
    return {"time": t_ms, "endpoint": endpoint, "method": "GET", "status": 200, "region": region,
            "latency_ms": latency, "user_id": user}


def subscribe(ws, sub_id: str, **query) -> dict:
    ws.send(json.dumps({"type": "subscribe", "id": sub_id, "query": query}))
    return recv_until(ws, lambda m: m["type"] in ("snapshot", "error") and m.get("id") == sub_id)


def test_subscribe_ingest_commit_then_changed_points_are_pushed(server, ctx, now_ms, store_backend):
    with connect(server.ws) as ws:
        snap = subscribe(ws, "a", metric="latency", stats=["count", "p50", "avg"], **{"from": "now-5m"},
                         step="1m", group_by="endpoint")
        assert snap["result"]["metric"] == "latency" and snap["result"]["series"] == []
        assert snap["result"]["step_ms"] == 60_000 and snap["result"]["stats"] == ["count", "p50", "avg"]

        t0 = now_ms - 90_000  # the window [now-2m, now-1m)
        post(server, [ev(t0 + i, "/api/cart", latency=float(i)) for i in range(10)])
        post(server, [ev(t0 + 5, "/api/search", latency=300.0)])
        assert drain_log_into_store(ctx.catalog, ctx.log, ctx.store, now_ms) == 11

        msg = recv_until(ws, lambda m: m["type"] == "points" and m["id"] == "a")
        got = {(s["stat"], s["group"]["endpoint"]): s["points"] for s in msg["series"]}
        window = t0 - t0 % 60_000
        # The changed window, plus the (empty) windows the first watermark made final; not the whole range.
        cart = {p["t"]: p for p in got[("count", "/api/cart")]}
        assert window in cart and all(p["final"] and p["value"] == 0 for t, p in cart.items() if t != window)
        assert all(t + 60_000 <= msg["watermark_ms"] for t in cart if t != window)
        assert cart[window]["value"] == 10.0 and cart[window]["revision"] == 1 and cart[window]["final"] is False
        assert [p for p in got[("avg", "/api/cart")] if p["t"] == window][0]["value"] == pytest.approx(4.5)
        assert [p for p in got[("count", "/api/search")] if p["t"] == window][0]["value"] == 1.0
        p50 = [p for p in got[("p50", "/api/cart")] if p["t"] == window][0]
        assert p50["error"]["kind"] == "kll" and p50["error"]["lower"] <= p50["value"] <= p50["error"]["upper"]
        assert msg["start"] <= window < msg["end"]
        hub = server.app.state.hub
        # On PostgreSQL the commit's NOTIFY woke the hub (store/postgres/notify.py); SQLite is polled.
        assert (hub.listening, hub.stats.notified >= 1) == ((True, True) if store_backend.kind == "postgres"
                                                             else (False, False))

        # A second commit to the same pane: a new point value for that window and group only.
        post(server, [ev(t0 + 20, "/api/cart", latency=100.0)])
        drain_log_into_store(ctx.catalog, ctx.log, ctx.store, now_ms)
        msg = recv_until(ws, lambda m: m["type"] == "points" and m["id"] == "a")
        got = {(s["stat"], s["group"]["endpoint"]): s["points"] for s in msg["series"]}
        assert set(got) == {("count", "/api/cart"), ("p50", "/api/cart"), ("avg", "/api/cart")}
        assert [p["t"] for p in got[("count", "/api/cart")]] == [window]  # the watermark did not move
        assert got[("count", "/api/cart")][0]["value"] == 11.0
        # Still provisional (the watermark did not pass it): a new value, not a correction.
        assert got[("count", "/api/cart")][0]["revision"] == 1 and not got[("count", "/api/cart")][0]["final"]

        # The same query again over REST answers the same values.
        rest = httpx.get(f"{server.http}/api/v1/query", params={
            "metric": "latency", "stat": "count", "from": "now-5m", "step": "1m", "group_by": "endpoint"}).json()
        by_group = {s["group"]["endpoint"]: s["points"] for s in rest["series"]}
        assert [p for p in by_group["/api/cart"] if p["t"] == window][0]["value"] == 11.0


def test_filters_keep_other_panes_out_and_watermark_flips_are_pushed(server, ctx, now_ms):
    with connect(server.ws) as ws:
        subscribe(ws, "eu", metric="requests", stat="count", **{"from": "now-10m"}, step="10s",
                  filter=["region=eu"])
        t_old = now_ms - 300_000
        post(server, [ev(t_old, region="us")])
        drain_log_into_store(ctx.catalog, ctx.log, ctx.store, now_ms)
        post(server, [ev(t_old, region="eu")])
        drain_log_into_store(ctx.catalog, ctx.log, ctx.store, now_ms)
        t_win = t_old - t_old % 10_000
        msg = recv_until(ws, lambda m: m["type"] == "points" and any(
            p["t"] == t_win for s in m["series"] for p in s["points"]))
        (series,) = msg["series"]
        (point,) = [p for p in series["points"] if p["t"] == t_win]
        assert point["value"] == 1.0 and point["final"] is False  # the 'us' event is filtered out

        # A newer event moves the watermark past that window: the point is re-sent as final.
        post(server, [ev(now_ms - 10_000, region="us")])
        drain_log_into_store(ctx.catalog, ctx.log, ctx.store, now_ms)
        msg = recv_until(ws, lambda m: m["type"] == "points" and any(
            p["t"] == t_old - t_old % 10_000 and p["final"] for s in m["series"] for p in s["points"]))
        assert msg["watermark_ms"] == now_ms - 10_000 - 30_000


def test_malformed_messages_get_errors_and_the_socket_stays_usable(server):
    with connect(server.ws) as ws:
        cases = [
            ("not json", None, "not JSON"),
            ('{"type": "ping", "x": ' + "1" * 5000 + "}", None, "not JSON: Exceeds the limit"),  # was: socket dropped
            ("[" * 20_000 + "]" * 20_000, None, "nested too deeply"),  # under the frame limit; was: socket dropped
            ("[1, 2]", None, "JSON object"),
            (json.dumps({"type": "dance"}), None, "unknown message type"),
            (json.dumps({"type": "subscribe", "id": "x"}), "x", "query"),
            (json.dumps({"type": "subscribe", "id": "x", "query": {"metric": "nope"}}), "x", "nope"),
            (json.dumps({"type": "subscribe", "id": "x", "query": {"metric": "requests", "stat": "p99"}}), "x",
             "percentiles"),
            (json.dumps({"type": "subscribe", "id": "x", "query": {"metric": "latency", "step": "7s"}}), "x",
             "multiple of the pane"),
            (json.dumps({"type": "subscribe", "id": "x", "query": {"metric": "latency", "group_by": "planet"}}),
             "x", "unknown dimension"),
            (json.dumps({"type": "subscribe", "id": "x", "query": {"metric": "latency", "filters": {"endpoint": "a\x00"}}}),
             "x", "NUL character"),  # PostgreSQL cannot bind it: refused before any store
            (json.dumps({"type": "subscribe", "id": "x", "query": {"metric": "latency", "from": "now",
                                                                   "to": "now-1h"}}), "x", "must be after"),
            # One dimension in `filters` and `filter` with two values: was the second, the first dropped.
            (json.dumps({"type": "subscribe", "id": "x", "query": {"metric": "latency", "filters": {"region": "eu"},
                                                                   "filter": ["region=us"]}}), "x", "names 'region' twice"),
            (json.dumps({"type": "topics", "topics": ["weather"]}), None, "unknown topics"),
            (json.dumps({"type": "unsubscribe", "id": "never"}), "never", "no subscription"),
        ]
        for text, err_id, reason in cases:
            ws.send(text)
            msg = recv_until(ws, lambda m: m["type"] == "error")
            assert msg["id"] == err_id and reason in msg["reason"], (text, msg)
        ws.send(b"\x00\x01binary")
        assert "binary frames" in recv_until(ws, lambda m: m["type"] == "error")["reason"]
        ws.send(json.dumps({"type": "ping"}))
        pong = recv_until(ws, lambda m: m["type"] in ("pong", "error"))
        assert pong["type"] == "pong"
        # The message limits, which the page paces its messages by (dashboard/static/connection.js).
        assert (pong["message_rate"], pong["message_burst"]) == (20.0, 50)
        snap = subscribe(ws, "ok", metric="latency", stat="p99")
        assert snap["type"] == "snapshot"
        ws.send(json.dumps({"type": "unsubscribe", "id": "ok"}))
        assert recv_until(ws, lambda m: m["type"] == "unsubscribed")["id"] == "ok"


def test_heartbeats_and_topic_feeds(server, ctx, corrections_feed, now_ms):
    with connect(server.ws) as ws:
        beat = recv_until(ws, lambda m: m["type"] == "heartbeat", timeout=5)
        assert beat["at_ms"] == NOW_MS
        pipeline = recv_until(ws, lambda m: m["type"] == "pipeline", timeout=5)
        assert pipeline["pipeline"] == "main" and pipeline["lag_events"] == 0
        corrections_feed.put({"type": "correction", "id": 1, "stream": STREAM})
        assert recv_until(ws, lambda m: m["type"] == "correction")["id"] == 1
        # Only the topics asked for: corrections no more.
        ws.send(json.dumps({"type": "topics", "topics": ["pipeline"]}))
        recv_until(ws, lambda m: m["type"] == "topics")
        corrections_feed.put({"type": "correction", "id": 2, "stream": STREAM})
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                msg = json.loads(ws.recv(timeout=0.1))
            except TimeoutError:
                continue
            assert msg["type"] != "correction"


class NeverReadingClient:
    """A websocket client on a raw socket with a tiny receive buffer that, after the
    handshake and its subscribe frames, never reads: the server's sends block."""

    def __init__(self, port: int):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect(("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /api/v1/ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                           ).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        assert head.startswith(b"HTTP/1.1 101"), head

    def send_text(self, text: str) -> None:
        payload = text.encode()
        mask = os.urandom(4)
        n = len(payload)
        header = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack("!H", n))
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("store_backend", ["sqlite"], indirect=True)  # the queue's bound, not the store's
def test_a_client_that_never_reads_stays_within_its_queue_bound(server, ctx, now_ms):
    """A real socket that subscribes, then never reads: the server's queue for it stays at its
    bound (16 here), points coalesce per subscription, the rest is dropped and counted."""
    hub = server.app.state.hub
    client_sock = NeverReadingClient(server.port)
    try:
        for i in range(3):
            client_sock.send_text(json.dumps({"type": "subscribe", "id": f"s{i}", "query": {
                "metric": "latency", "stats": ["count", "p99"], "from": "now-30m", "step": "10s",
                "group_by": "endpoint"}}))
        time.sleep(0.5)
        # Flood: many commits, each changing many windows and groups, while pipeline messages
        # keep coming; the client reads nothing, its socket buffers fill, and its queue must hold.
        # Up to 30 rounds, but once the queue has begun dropping, 5 more rounds of it are enough
        # to see it hold its bound under a flood that goes on (the rounds before that only fill
        # the socket buffers).
        dropping_since = None
        for round_ in range(30):
            events = [ev(now_ms - 1_700_000 + (i * 997) % 1_690_000, endpoint=f"/e{i % 40}", latency=float(i),
                         user=f"u{i}") for i in range(round_ * 400, round_ * 400 + 400)]
            post(server, events)
            drain_log_into_store(ctx.catalog, ctx.log, ctx.store, now_ms)
            time.sleep(0.1)
            if dropping_since is None and any(c.queue.dropped_total > 0 for c in list(hub._clients)):
                dropping_since = round_
            if dropping_since is not None and round_ >= dropping_since + 5:
                break
        time.sleep(0.5)
        (client,) = list(hub._clients)
        assert client.queue.dropped_total > 0  # the sends did block: coalesced or dropped, and counted
        assert client.queue.high_water <= 16
        assert len(client.queue) <= 16
        # Coalesced points hold at most one point per (subscription, stat, group, window).
        for item in client.queue.items:
            if hasattr(item, "batch"):
                assert sum(len(s["points"]) for s in item.batch.series) <= 2 * 40 * 180
    finally:
        client_sock.close()
    deadline = time.monotonic() + 10  # the server notices the closed socket and forgets the client
    while hub.clients and time.monotonic() < deadline:
        time.sleep(0.1)
    assert hub.clients == 0


def test_queue_bound_coalescing_and_dropped_notice():
    """The per-client queue alone: bounded, points coalesce per subscription keeping the
    newest value of each point, topic messages are dropped, and the count is reported."""

    async def scenario():
        q = ClientQueue(bound=4)
        from catalog import load_catalog
        from tests.api.conftest import CONFIG
        rq = resolve_query(QueryIn(metric="latency"), load_catalog(CONFIG), NOW_MS, 1000)
        sub_a, sub_b = Subscription("a", rq, 1, ready=True), Subscription("b", rq, 2, ready=True)

        def points(sub, t, value):
            return QueuedPoints(sub, PointsBatch([{"stat": "count", "group": {}, "points": [
                {"t": t, "value": value}]}], {"start": 0, "end": 1, "watermark_ms": None}))

        for i in range(1000):
            q.put(points(sub_a, i % 7, float(i)))
            q.put(points(sub_b, 0, float(i)))
            q.put(QueuedMessage({"type": "pipeline", "n": i}, droppable=True))
            assert len(q) <= 4
        texts = []
        while (text := await q.get(0.01)) is not None:
            texts.append(json.loads(text))
        assert texts[0]["type"] == "dropped" and texts[0]["count"] > 2000
        last_a = {}
        for m in texts:
            if m["type"] == "points" and m["id"] == "a":
                for p in m["series"][0]["points"]:
                    last_a[p["t"]] = p["value"]
        assert last_a == {t: float(max(i for i in range(1000) if i % 7 == t)) for t in range(7)}
        assert max(m["series"][0]["points"][0]["value"] for m in texts if m.get("id") == "b") == 999.0

        # Points for a subscription whose snapshot is not queued yet wait, then follow it.
        sub_c = Subscription("c", rq, 3)
        q.put(points(sub_c, 0, 1.0))
        assert await q.get(0.01) is None
        q.put(QueuedMessage({"type": "snapshot", "id": "c"}, droppable=False))
        q.release(sub_c)
        assert json.loads(await q.get(0.01))["type"] == "snapshot"
        assert json.loads(await q.get(0.01))["type"] == "points"

    run_on_own_loop(scenario())


def record_switch_then_commit(server, ctx, now_ms) -> None:
    """A switch's record in the change feed, then a commit after it (on PostgreSQL its NOTIFY wakes the hub)."""
    from store.switch import SWITCHED_REVISION

    db = ctx.store.side_db()
    db.execute("INSERT INTO changes (stream, start_ms, dims, revision, batch_id, count_added, at_ms)"
               " VALUES (?, 0, '{}', ?, -1, 0, ?)", (STREAM, SWITCHED_REVISION, now_ms))
    db.close()
    post(server, [ev(now_ms - 50_000)])
    drain_log_into_store(ctx.catalog, ctx.log, ctx.store, now_ms)


def test_a_switched_stream_reloads_its_subscribers(server, ctx, now_ms):
    """A switch (store/switch.py) writes one `switched` record into the change feed: each
    subscriber of the stream gets a whole new snapshot, not points (docs/reprocessing.md)."""
    with connect(server.ws) as ws:
        subscribe(ws, "a", metric="requests", stat="count", **{"from": "now-10m"}, step="10s")
        subscribe(ws, "other", metric="orders", stat="count", **{"from": "now-10m"}, step="10s")
        post(server, [ev(now_ms - 60_000)])
        drain_log_into_store(ctx.catalog, ctx.log, ctx.store, now_ms)
        recv_until(ws, lambda m: m["type"] == "points" and m["id"] == "a")
        record_switch_then_commit(server, ctx, now_ms)
        reload = recv_until(ws, lambda m: m["type"] == "snapshot" and m.get("reason") == "switched")
        assert reload["id"] == "a" and reload["result"]["metric"] == "requests"
        assert sum(p["count"] for s in reload["result"]["series"] for p in s["points"]) >= 1  # the served rows now


def test_a_switch_resolves_its_subscriptions_again_against_the_served_definition(server, ctx, now_ms):
    """Before the switch the served output is built with a stored definition of the stream (a pane
    of 5 s, a dimension `datacenter` the configuration has removed since): subscriptions resolve
    against it. The switch serves the configured one: a subscription is resolved again (its reload
    reads 10 s panes, not the replaced output's 5 s), and one grouped by the removed dimension ends
    with an error naming why, as a new one would be refused (it kept reading by the old query)."""
    from api.served_catalog import ServedCatalog
    from catalog.versions import definition_version, stream_document

    configured = ctx.catalog.streams[STREAM]
    doc = stream_document(configured)
    stored = {STREAM: ("a-version-before", {**doc, "pane": "5s", "dimensions": [*doc["dimensions"], "datacenter"]})}
    # Read once an hour: only the hub's own read on the switch can see it in time.
    ctx.served = ServedCatalog(lambda: dict(stored), refresh_s=3600)
    hub = server.app.state.hub
    with connect(server.ws) as ws:
        assert subscribe(ws, "plain", metric="requests", stat="count", **{"from": "now-10m"}, step="10s")["type"] == "snapshot"
        assert subscribe(ws, "by_dc", metric="requests", stat="count", **{"from": "now-10m"}, step="10s",
                         group_by="datacenter")["type"] == "snapshot"
        assert {s.query.pane_ms for c in hub._clients for s in c.subs.values()} == {5_000}

        stored[STREAM] = (definition_version(configured), stream_document(configured))  # the switch
        record_switch_then_commit(server, ctx, now_ms)
        ended = recv_until(ws, lambda m: m["type"] == "error" and m["id"] == "by_dc")
        assert "no longer resolves" in ended["reason"] and "datacenter" in ended["reason"], ended
        reload = recv_until(ws, lambda m: m.get("reason") == "switched" and m["id"] == "plain")
        assert reload["result"]["metric"] == "requests"
        subs = [s for c in hub._clients for s in c.subs.values()]
        assert [(s.id, s.query.pane_ms) for s in subs] == [("plain", 10_000)]
        ws.send(json.dumps({"type": "unsubscribe", "id": "by_dc"}))
        assert recv_until(ws, lambda m: m["type"] == "error" and m["id"] == "by_dc")["reason"].startswith("no subscription")


def test_identical_subscriptions_share_one_snapshot_until_the_feed_moves(server, ctx, now_ms):
    """Many clients on one view: one snapshot computation (and one JSON encoding) while the hub has
    read no new change; after a commit the next subscriber gets a fresh one with the new rows."""
    post(server, [ev(now_ms - 120_000)])
    drain_log_into_store(ctx.catalog, ctx.log, ctx.store, now_ms)
    hub = server.app.state.hub
    view = dict(metric="requests", stat="count", **{"from": "now-10m"}, step="1m")
    with connect(server.ws) as first:
        deadline = time.monotonic() + 10
        while hub._seq is None:  # the tailer has found its place in the change feed (a thread's start)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        before = hub.stats.snapshots
        snaps = [subscribe(first, f"s{i}", **view) for i in range(3)]
        results = [s["result"] for s in snaps]
        assert results[0] == results[1] == results[2]
        assert sum(p["count"] for s in results[0]["series"] for p in s["points"]) == 1
        assert hub.stats.snapshots - before == 1  # the hub's change feed position did not move
        with connect(server.ws) as second:
            subscribe(second, "x", **view)
            assert hub.stats.snapshots - before == 1

            post(server, [ev(now_ms - 60_000)])
            drain_log_into_store(ctx.catalog, ctx.log, ctx.store, now_ms)
            recv_until(first, lambda m: m["type"] == "points" and m["id"] == "s0")  # the hub read the commit
            fresh = subscribe(second, "y", **view)["result"]
            assert hub.stats.snapshots - before == 2
            assert sum(p["count"] for s in fresh["series"] for p in s["points"]) == 2


def worker_state(kind: str, where: str):
    """A snapshot worker's store and point cache (api/ws_workers.py), opened in the worker process
    as sketchboard.wiring.snapshot_worker_state opens them: its own connection to the test's store."""
    from store.final_points import FinalPoints
    from store.point_cache import PointCache

    if kind == "postgres":
        from store.postgres import PostgresPaneStore

        store = PostgresPaneStore(where, pool_size=2)
    else:
        from store import SqlitePaneStore

        store = SqlitePaneStore(where)
    return store, PointCache(backing=FinalPoints(store.side_db(), writer=store.side_db()))


def no_state():
    """A snapshot worker's state when the test computes no snapshot (picklable: a module's function)."""
    return None, None


def test_a_snapshot_worker_ignores_ctrl_c_which_the_api_process_stops_it_for(capfd):
    """Ctrl-C of `make run` reaches the whole process group: each worker printed a KeyboardInterrupt
    traceback (and died under the API process, which stops the pool itself)."""
    from api.ws_workers import SnapshotWorkers

    workers = SnapshotWorkers(no_state)
    workers.start()
    try:
        assert workers.wait_ready(120), "the snapshot worker did not start"
        pid = workers._pool.submit(os.getpid).result(timeout=30)
        os.kill(pid, signal.SIGINT)
        time.sleep(1.0)
        assert workers._pool.submit(os.getpid).result(timeout=30) == pid  # alive, and still working
    finally:
        workers.stop()
    assert "KeyboardInterrupt" not in capfd.readouterr().err


def test_snapshots_computed_in_a_worker_process_equal_the_api_process_ones(ctx, now_ms, store_backend):
    """With snapshot workers the API process only waits on a pipe for the snapshot's text: the same
    result as GET /api/v1/query's body, and the final points the worker computed are kept in the
    store, where the API process's point cache finds them."""
    from functools import partial

    from api.ws_workers import SnapshotWorkers
    from query import compute
    from store.final_points import FinalPoints
    from store.point_cache import PointCache

    t0 = now_ms - 10 * 60_000
    events = [ev(t0 + i * 4_000, latency=float(i * 7 % 31), endpoint=("/a", "/b")[i % 2]) for i in range(120)]
    http = httpx.Client()
    kept = FinalPoints(ctx.store.side_db())
    ctx.point_cache = PointCache(backing=kept)
    where = ctx.store.dsn if store_backend.kind == "postgres" else str(ctx.store.path)
    ctx.snapshot_workers = workers = SnapshotWorkers(partial(worker_state, store_backend.kind, where))
    config = HubConfig(poll_interval_s=0.05, heartbeat_interval_s=0.5, feed_interval_s=0.05, send_timeout_s=5)
    try:
        with Server(create_app(ctx, hub_config=config)) as server:
            post(server, events)
            post(server, [ev(now_ms - 5_000)])  # the watermark passes the first windows: their points are final
            drain_log_into_store(ctx.catalog, ctx.log, ctx.store, now_ms)
            view = dict(metric="latency", stat="p90", **{"from": "now-15m"}, step="1m", group_by="endpoint")
            with connect(server.ws) as ws:
                assert workers.wait_ready(120), "the snapshot worker did not start"
                snap = subscribe(ws, "a", **view)["result"]
            assert workers.computed == 1  # in the worker, not here
            rest = http.get(f"{server.http}/api/v1/query", params={**view, "to": "now"}).json()
            assert snap == rest
            # Final windows with rows (those without are made as asked, never kept: store/series.py).
            finals = sum(p["final"] and p["count"] > 0 for s in snap["series"] for p in s["points"])
            assert finals >= 2 * 8
            # The worker's final points reach the store (written in its background); a new API process
            # (an empty cache over the same store) then reads them instead of computing them.
            deadline = time.monotonic() + 20
            while True:
                cache = PointCache(backing=kept)
                q = resolve_query(QueryIn.model_validate({**view, "to": "now"}), ctx.catalog, now_ms, 11_000)
                lo, hi = q.range_at(now_ms)
                compute(ctx.store, q, lo, hi, watermark_ms=ctx.store.watermarks().get(STREAM), max_points=11_000,
                        cache=cache)
                if cache.hits >= finals or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert cache.hits >= finals
    finally:
        http.close()
        kept.close()


def test_the_wired_service_computes_snapshots_in_its_worker_and_survives_its_death(tmp_path):
    """`sketchboard api` as wired: the snapshot comes from the worker process (which must outlive
    the thread that started it); a killed worker leaves snapshots to the API process."""
    import signal

    from fastapi.testclient import TestClient

    from sketchboard.settings import Settings
    from sketchboard.wiring import build_api

    app, ctx = build_api(Settings(data_dir=tmp_path / "data", alerts_config=None))
    query = {"metric": "latency", "stat": "p99", "from": "now-1h", "step": "1m"}
    with TestClient(app) as client, client.websocket_connect("ws://127.0.0.1:8000/api/v1/ws") as ws:
        ws.send_text(json.dumps({"type": "topics", "topics": []}))
        assert ctx.snapshot_workers.wait_ready(120)
        for sub_id in ("a", "b"):
            ws.send_text(json.dumps({"type": "subscribe", "id": sub_id, "query": query}))
            while (msg := json.loads(ws.receive_text()))["type"] != "snapshot":
                pass
            assert msg["id"] == sub_id and len(msg["result"]["series"][0]["points"]) in (60, 61)  # as now falls
            if sub_id == "a":
                assert ctx.snapshot_workers.computed == 1
                for pid in list(ctx.snapshot_workers._pool._processes):
                    os.kill(pid, signal.SIGKILL)
        assert ctx.snapshot_workers.computed == 1  # "b" was computed here, after the worker died


def messages_for(ws, seconds: float) -> list[dict]:
    """Every message that arrives within `seconds`."""
    out = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            out.append(json.loads(ws.recv(timeout=left)))
        except TimeoutError:
            break
    return out


@pytest.mark.parametrize("store_backend", ["sqlite"], indirect=True)  # the protocol, not the store
def test_a_subscribe_for_an_id_in_use_ends_its_previous_subscription(server, ctx, now_ms, monkeypatch, tmp_path):
    """A subscribe message for an id in use replaces that subscription, whatever the new one's fate:
    a version's snapshot (no live points) or a refusal leaves no live subscription under the id.
    The version's output is a second store standing in for a run's (versioned_output patched)."""
    import api.query_routes
    from store import SqlitePaneStore
    from store.tiers import catalog_layouts

    other = SqlitePaneStore(tmp_path / "other.db")
    other.configure_tiers(catalog_layouts(ctx.catalog), now_ms=now_ms)
    monkeypatch.setattr(api.query_routes, "versioned_output", lambda c, metric, version: (other, c.catalog))
    view = dict(metric="requests", stat="count", **{"from": "now-5m"}, step="10s")
    try:
        with connect(server.ws) as ws:
            ws.send(json.dumps({"type": "topics", "topics": []}))
            for sub_id in ("a", "b", "control"):
                assert subscribe(ws, sub_id, **view)["type"] == "snapshot"
            assert subscribe(ws, "a", **view, version="old")["result"]["series"][0]["points"]
            refused = subscribe(ws, "b", **{**view, "stat": "p101"})
            assert refused["type"] == "error" and "previously under id 'b' has ended" in refused["reason"]

            post(server, [ev(now_ms - 100_000)])
            drain_log_into_store(ctx.catalog, ctx.log, ctx.store, now_ms)
            seen = []
            recv_until(ws, lambda m: seen.append(m) or (m["type"] == "points" and m["id"] == "control"))
            assert [m for m in seen + messages_for(ws, 0.5) if m.get("id") in ("a", "b")] == []
            # Neither id holds a subscription now.
            for sub_id in ("a", "b"):
                ws.send(json.dumps({"type": "unsubscribe", "id": sub_id}))
                assert recv_until(ws, lambda m: m.get("id") == sub_id)["type"] == "error"
    finally:
        other.close()


@pytest.mark.parametrize("store_backend", ["sqlite"], indirect=True)  # the hub's queues, not the store
def test_a_switched_reload_is_tied_to_its_subscription(ctx, now_ms):
    """A `switched` reload belongs to its subscription: one computed for a subscription that ends
    before it is delivered is not sent, one queued is removed when it ends (no snapshot after
    `unsubscribed`), and one for a subscription whose first snapshot is not queued yet follows it."""
    from api.ws_hub import Hub

    hub = Hub(ctx.store, ctx.clock, HubConfig())
    rq = resolve_query(QueryIn.model_validate({"metric": "requests", "stat": "count", "from": "now-5m",
                                               "step": "10s"}), ctx.catalog, now_ms, 1000)

    async def scenario():
        client = hub.connect()
        queue = client.queue
        sub = hub.subscribe(client, "a", rq)
        queue.release(sub)
        reloads = hub._reloads([(client, sub)], {STREAM})
        assert hub.unsubscribe(client, "a")
        hub._deliver(reloads)  # computed before the unsubscribe, delivered after it
        assert len(queue) == 0

        sub = hub.subscribe(client, "b", rq)
        queue.release(sub)
        hub._deliver(hub._reloads([(client, sub)], {STREAM}))
        assert len(queue) == 1
        hub.unsubscribe(client, "b")  # queued, not sent yet
        assert len(queue) == 0

        sub = hub.subscribe(client, "c", rq)  # its snapshot is being computed
        hub._deliver(hub._reloads([(client, sub)], {STREAM}))
        assert len(queue) == 0
        queue.put(QueuedMessage({"type": "snapshot", "id": "c"}, droppable=False))
        queue.release(sub)
        first, second = json.loads(await queue.get(0.01)), json.loads(await queue.get(0.01))
        assert (first.get("reason"), second["reason"]) == (None, "switched")

    run_on_own_loop(scenario())


def test_coalescing_keeps_points_after_a_reload_of_their_subscription():
    """Points queued after a subscription's `switched` reload are never merged into its points
    queued before it: the client would apply them, then the older whole snapshot over them."""

    async def scenario():
        q = ClientQueue(bound=4)
        sub = Subscription("a", None, 1, ready=True)

        def points(value):
            return QueuedPoints(sub, PointsBatch([{"stat": "count", "group": {}, "points": [
                {"t": 0, "value": value}]}], {"start": 0, "end": 1, "watermark_ms": None}))

        reload = {"type": "snapshot", "id": "a", "reason": "switched",
                  "result": {"series": [{"stat": "count", "group": {}, "points": [{"t": 0, "value": 5.0}]}]}}
        q.put(points(1.0))
        q.put(QueuedMessage(reload, False, sub=sub))
        q.put(points(6.0))
        q.put(QueuedMessage({"type": "pipeline"}, True))
        q.put(QueuedMessage({"type": "lag"}, True))  # the queue is full: compacted
        value = None
        while (text := await q.get(0.01)) is not None:
            m = json.loads(text)
            if m["type"] in ("points", "snapshot"):
                value = (m["series"] if m["type"] == "points" else m["result"]["series"])[0]["points"][0]["value"]
        assert value == 6.0  # the newest value computed, not the reload's

    run_on_own_loop(scenario())


def test_points_are_never_evicted_and_a_client_too_slow_for_its_replies_is_closed():
    """More subscriptions than the queue's bound (ws_queue_size 8 with 32 subscriptions is allowed):
    one tick's points for all of them are all kept, merged per subscription once the queue is full,
    and the merges are counted. Snapshots and replies are never evicted: past the bound plus the
    headroom the queue is closed (the connection then closes with 1008) rather than lose one."""
    from api.ws_hub import QueueClosed

    async def scenario():
        q = ClientQueue(bound=8, headroom=32)
        subs = [Subscription(f"s{i}", None, i, ready=True) for i in range(12)]

        def points(sub, t, value):
            return QueuedPoints(sub, PointsBatch([{"stat": "count", "group": {}, "points": [
                {"t": t, "value": value}]}], {"start": 0, "end": 1, "watermark_ms": None}))

        for t in range(3):  # three ticks' points, nothing read meanwhile
            for sub in subs:
                q.put(points(sub, t, float(t)))
        got: dict[str, set] = {}
        dropped = 0
        while (text := await q.get(0.01)) is not None:
            m = json.loads(text)
            if m["type"] == "dropped":
                dropped += m["count"]
            else:
                got.setdefault(m["id"], set()).update(p["t"] for s in m["series"] for p in s["points"])
        assert got == {sub.id: {0, 1, 2} for sub in subs}
        assert dropped == q.dropped_total > 0

        q = ClientQueue(bound=8)
        q.put(QueuedMessage({"type": "snapshot", "id": "b", "result": {}}, False))
        for i in range(8):
            q.put(QueuedMessage({"type": "pong", "at_ms": i}, False))
        with pytest.raises(QueueClosed, match="too slow"):
            await q.get(0.01)

    run_on_own_loop(scenario())


def client_view(snapshot: dict, messages: list[dict], sub_id: str) -> dict:
    """(stat, group, t) -> point, as a client holds them: its snapshot, then its points messages."""
    view = {}
    for series in [snapshot["result"]["series"], *(m["series"] for m in messages
                                                   if m["type"] == "points" and m["id"] == sub_id)]:
        for s in series:
            for p in s["points"]:
                view[(s["stat"], tuple(sorted(s["group"].items())), p["t"])] = p
    return view


def rest_view(server, stats, **params) -> dict:
    view = {}
    for stat in stats:
        body = httpx.get(f"{server.http}/api/v1/query", params={**params, "stat": stat}, timeout=10).json()
        for s in body["series"]:
            for p in s["points"]:
                view[(stat, tuple(sorted(s["group"].items())), p["t"])] = p
    return view


def test_the_watermark_passing_windows_makes_every_group_final_there(server, ctx, now_ms):
    """With group_by, a group without rows in the windows the watermark passes gets its points
    there too (empty, final), as REST answers them: it was left with final: false for good."""
    post(server, [ev(now_ms - 300_000, "/api/a", latency=1.0), ev(now_ms - 60_000, "/api/b", latency=2.0)])
    drain_log_into_store(ctx.catalog, ctx.log, ctx.store, now_ms)
    stats = ["count", "p50", "avg", "max"]
    view = dict(metric="latency", **{"from": "now-6m"}, step="10s", group_by="endpoint")
    with connect(server.ws) as ws:
        ws.send(json.dumps({"type": "topics", "topics": []}))
        snap = subscribe(ws, "a", stats=stats, **view)
        post(server, [ev(now_ms - 10_000, "/api/b", latency=3.0)])  # the watermark moves 50 s on
        drain_log_into_store(ctx.catalog, ctx.log, ctx.store, now_ms)
        seen = []
        recv_until(ws, lambda m: seen.append(m) or (m["type"] == "points" and m["watermark_ms"] == now_ms - 40_000))
        client = client_view(snap, seen + messages_for(ws, 0.3), "a")
    rest = rest_view(server, stats, **view)
    flipped = [k for k, p in rest.items() if k[1] == (("endpoint", "/api/a"),) and p["final"]
               and now_ms - 90_000 <= k[2] < now_ms - 40_000]
    assert len(flipped) == 4 * 5  # /api/a has no rows there: its points there are final too
    assert client == rest


def test_windows_sliding_into_a_relative_range_are_pushed_with_their_rows(server, ctx, clock, now_ms):
    """A relative range slides with time: the windows that enter it are pushed, for every group,
    without any commit meanwhile: `to=now-10m` reaching a window that holds rows, and `to=now`
    reaching one with an event stamped ahead (within max_future_skew)."""
    post(server, [ev(now_ms - 9 * 60_000, "/api/a"), ev(now_ms + 60_000, "/api/a"),
                  ev(now_ms - 20 * 60_000, "/api/b")])
    drain_log_into_store(ctx.catalog, ctx.log, ctx.store, now_ms)
    views = {"past": dict(metric="requests", **{"from": "now-30m"}, to="now-10m", step="1m", group_by="endpoint"),
             "now": dict(metric="requests", **{"from": "now-30m"}, step="1m", group_by="endpoint")}
    with connect(server.ws) as ws:
        ws.send(json.dumps({"type": "topics", "topics": []}))
        snaps = {sub_id: subscribe(ws, sub_id, stats=["count"], **view) for sub_id, view in views.items()}
        clock.advance(180)  # no commit: only time passes
        seen = []
        recv_until(ws, lambda m: seen.append(m) or {x["id"] for x in seen if x["type"] == "points"} == set(views))
        seen += messages_for(ws, 0.3)
    later = now_ms + 180_000
    for sub_id, view in views.items():
        client = client_view(snaps[sub_id], seen, sub_id)
        rest = rest_view(server, ["count"], **view)
        # Every point with rows is held, and every point held in the range is REST's (a group that
        # entered the range with its rows is shown where it changed, as a new group is by a commit).
        assert all(client.get(k) == p for k, p in rest.items() if p["count"] or k in client), sub_id
        entered = {k for k in rest if k[2] >= later - (10 * 60_000 if sub_id == "past" else 0) - 3 * 60_000}
        assert entered <= set(client), sub_id  # the windows that entered, for every group
        event = now_ms - 9 * 60_000 if sub_id == "past" else now_ms + 60_000
        assert rest[("count", (("endpoint", "/api/a"),), event - event % 60_000)]["count"] == 1  # entered, held


@pytest.mark.parametrize("store_backend", ["sqlite"], indirect=True)  # the hub's start, not the store
def test_a_commit_right_after_the_first_snapshot_is_pushed_while_the_hub_is_still_starting(
        server, ctx, now_ms, monkeypatch):
    """The hub's tailer starts in its own thread at the first connection and first sets up the
    store's commit signal (on PostgreSQL a LISTEN connection). A snapshot computed before the
    tailer read where the change feed stands, then a commit, used to be taken as the tailer's
    starting point: the commit's points were never sent (CI saw it in test_replicas)."""
    real_signal = ctx.store.change_signal

    def slow_signal():
        time.sleep(1.0)  # a listener slow to connect
        return real_signal()

    monkeypatch.setattr(ctx.store, "change_signal", slow_signal)
    with connect(server.ws) as ws:
        snap = subscribe(ws, "a", metric="requests", stats=["count"], **{"from": "now-5m"}, step="1m")
        assert snap["type"] == "snapshot"
        assert_next_commit_pushed(server, ctx, ws, now_ms)


def assert_next_commit_pushed(server, ctx, ws, now_ms) -> None:
    """An event posted and committed now reaches subscription "a" (requests, count, 1m steps) as points."""
    post(server, [ev(now_ms - 90_000)])
    assert drain_log_into_store(ctx.catalog, ctx.log, ctx.store, now_ms) == 1
    msg = recv_until(ws, lambda m: m["type"] == "points" and m["id"] == "a", timeout=5)
    window = (now_ms - 90_000) // 60_000 * 60_000
    assert {p["t"]: p["value"] for s in msg["series"] for p in s["points"]}[window] == 1.0


@pytest.mark.parametrize("store_backend", ["sqlite"], indirect=True)  # the hub's start, not the store
def test_a_commit_after_the_first_snapshot_is_pushed_when_the_hubs_first_read_failed(server, ctx, now_ms,
                                                                                      monkeypatch):
    """The same race when the tailer's first read of the change feed fails (a store briefly away):
    snapshots went on at once, and the tailer's next read took the commit after them as its start."""
    real = ctx.store.changes_since
    calls = []

    def flaky(seq, limit=1000):
        calls.append(seq)
        if len(calls) == 1:
            raise OSError("the store is away for a moment")
        if len(calls) == 2:
            time.sleep(1.0)  # the retry, slow: the test's commit lands meanwhile
        return real(seq, limit)

    monkeypatch.setattr(ctx.store, "changes_since", flaky)
    with connect(server.ws) as ws:
        subscribe(ws, "a", metric="requests", stats=["count"], **{"from": "now-5m"}, step="1m")
        assert_next_commit_pushed(server, ctx, ws, now_ms)


@pytest.mark.parametrize("store_backend", ["sqlite"], indirect=True)  # the hub's memory, not the store
def test_a_quiet_store_keeps_a_bounded_number_of_finished_snapshots(ctx, now_ms):
    """While nothing was committed, every distinct snapshot (a day of minutes: ~115 KB) stayed in
    the hub for identical subscriptions to come: a dashboard reopened with a sliding range made a
    new one at every step, and the API's memory grew without bound."""
    from api.ws_hub import SNAPSHOTS_KEPT, Hub

    hub = Hub(ctx.store, ctx.clock, HubConfig())

    def query(i: int):
        return resolve_query(QueryIn.model_validate({"metric": "requests", "stat": "count", "from": now_ms - 3_600_000 - i,
                                                     "to": now_ms - i, "step": "1m"}), ctx.catalog, now_ms, 1000)

    for i in range(3 * SNAPSHOTS_KEPT):
        hub.snapshot_message("a", query(i))
    assert len(hub._snapshots) <= SNAPSHOTS_KEPT

"""Corrections end to end over the websocket, with the built-in CorrectionsFeed: a straggler
merged into a pane that is already final is pushed as a `correction` message (old and new
value, so a client can undo exactly) and as a changed point with a higher revision."""

from __future__ import annotations

import pytest
from websockets.sync.client import connect

from api.app import create_app
from api.ws_hub import HubConfig
from tests.api.test_ws import Server, ev, post, recv_until, subscribe
from tests.api.test_ws_support import drain_log_into_store


@pytest.fixture
def pane_store(store_backend):
    """Every test here on SQLite and on PostgreSQL (tests/api/conftest.py)."""
    return store_backend.create()


def test_a_straggler_into_a_final_pane_is_pushed_as_a_correction(ctx, now_ms):
    config = HubConfig(poll_interval_s=0.05, heartbeat_interval_s=0.5, feed_interval_s=0.05)
    app = create_app(ctx, hub_config=config)  # no test feeds: the real corrections feed
    assert {feed.topic for feed in app.state.hub.feeds} >= {"pipeline", "corrections"}
    t0 = now_ms - 600_000
    pane = t0 - t0 % 10_000
    with Server(app) as server, connect(server.ws) as ws:
        # The pane gets 3 events, then a newer event moves the watermark past it: final.
        post(server, [ev(t0 + i, "/api/cart", latency=10.0) for i in range(3)] + [ev(now_ms - 1_000, "/api/cart")])
        drain_log_into_store(ctx.catalog, ctx.log, ctx.store, now_ms)
        subscribe(ws, "c", metric="requests", stat="count", **{"from": "now-15m"}, step="10s")

        post(server, [ev(t0 + 5, "/api/cart", latency=50.0), ev(t0 + 6, "/api/cart", latency=70.0)])
        drain_log_into_store(ctx.catalog, ctx.log, ctx.store, now_ms)

        # Both come, in either order: the changed point and the correction record. A push of the
        # pane as it was before the straggler may come first on a slow machine (a poll between
        # the subscription's snapshot and the second commit): the revised point is the one awaited.
        def revised(m: dict) -> bool:
            return any(p["t"] == pane and p["revision"] >= 2 for s in m["series"] for p in s["points"])

        got: dict[str, dict] = {}
        while len(got) < 2:
            m = recv_until(ws, lambda m: m["type"] == "correction" or (m["type"] == "points" and m["id"] == "c"))
            if m["type"] == "correction" or revised(m):
                got[m["type"]] = m
        msg = got["correction"]
        assert msg["stream"] == "http_requests" and msg["pane_start_ms"] == pane
        assert (msg["revision_from"], msg["revision_to"], msg["events_added"]) == (1, 2, 2)
        assert msg["old"]["count"] == 3 and msg["new"]["count"] == 5
        assert msg["old"]["values"]["latency_ms"]["sum"] == 30.0
        assert msg["new"]["values"]["latency_ms"]["sum"] == 150.0
        assert msg["new"]["values"]["latency_ms"]["max"] == 70.0
        (point,) = [p for s in got["points"]["series"] for p in s["points"] if p["t"] == pane]
        assert point["value"] == 5.0 and point["revision"] == 2 and point["final"] is True

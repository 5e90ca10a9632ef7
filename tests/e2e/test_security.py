"""Tokens as a user manages them: `sketchboard token create/list/revoke` and `sketchboard api`
as real processes, real HTTP. No Spark: only the API and the demo producer run."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.e2e


def sketchboard(service, *args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sketchboard.cli", *args], env={**service.env, **(env or {})},
                           capture_output=True, text=True, timeout=timeout)


def test_beyond_loopback_without_tokens_the_api_refuses_to_start(service_factory):
    service = service_factory(host="0.0.0.0")
    done = sketchboard(service, "api")
    assert done.returncode == 2, done.stderr
    assert "refusing to listen on 0.0.0.0 without API tokens" in done.stderr
    assert "sketchboard token create NAME --scope admin" in done.stderr
    up = sketchboard(service, "up")  # fails before starting any child
    assert up.returncode == 2 and "refusing to listen on 0.0.0.0" in up.stderr, up.stderr


def test_tokens_made_by_the_cli_guard_an_exposed_api_and_the_demo_sends_its_own(service_factory):
    service = service_factory(host="0.0.0.0")
    made = sketchboard(service, "token", "create", "ops", "--scope", "admin")
    assert made.returncode == 0, made.stderr
    admin = made.stdout.strip()
    assert admin.startswith("sb_") and "shown only now" in made.stderr
    ingest = sketchboard(service, "token", "create", "demo", "--scope", "ingest").stdout.strip()
    listed = sketchboard(service, "token", "list")
    assert "ops\tadmin\t" in listed.stdout and "demo\tingest\t" in listed.stdout and admin not in listed.stdout
    up = sketchboard(service, "up", env={"SKETCHBOARD_TOKEN": ""})
    assert up.returncode == 2 and "the demo producer needs one: set SKETCHBOARD_TOKEN" in up.stderr, up.stderr
    bad = sketchboard(service, "token", "create", "x", "--scope", "write")
    assert bad.returncode == 2 and "unknown scope 'write'" in bad.stderr

    service.start_api()  # on 0.0.0.0, reached here through 127.0.0.1
    http = service.http
    assert http.get("/healthz").status_code == 200
    assert http.get("/api/v1/streams").status_code == 401
    streams = http.get("/api/v1/streams", headers={"Authorization": f"Bearer {admin}"})
    assert streams.status_code == 200
    audit = http.get("/api/v1/audit", headers={"Authorization": f"Bearer {admin}"}).json()["entries"]
    assert [(e["action"], e["target"], e["detail"]) for e in audit] == [
        ("token.create", "demo", {"scopes": ["ingest"]}), ("token.create", "ops", {"scopes": ["admin"]})]
    assert audit[0]["actor"].startswith("cli:")

    demo = sketchboard(service, "demo", "--duration", "3", "--rate", "50", env={"SKETCHBOARD_TOKEN": ingest})
    assert demo.returncode == 0, demo.stderr
    assert "HTTP 401" not in demo.stderr and "HTTP 403" not in demo.stderr
    after = http.get("/api/v1/streams", headers={"Authorization": f"Bearer {admin}"}).json()
    assert sum(s["events_in_log"] for s in after["streams"]) > 0

    refused = sketchboard(service, "demo", "--duration", "2", "--rate", "50", env={"SKETCHBOARD_TOKEN": ""})
    assert "HTTP 401" in refused.stderr

    assert sketchboard(service, "token", "revoke", "demo").returncode == 0
    body = b'[{"time": 1, "customer_id": "c", "amount": 1}]'
    deadline = time.monotonic() + 5
    while True:  # the API re-reads the tokens file at most once a second
        status = http.post("/api/v1/events?stream=orders", content=body, headers={
            "Authorization": f"Bearer {ingest}", "Content-Type": "application/json"}).status_code
        if status == 401 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert status == 401


def test_the_api_refuses_websocket_frames_over_the_limit(service_factory):
    import json

    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    from tests.api.test_ws import recv_until

    service = service_factory(ws_max_message_bytes=4096)
    service.start_api()
    url = service.base.replace("http", "ws") + "/api/v1/ws"
    with connect(url, open_timeout=10, max_size=None) as ws:
        ws.send(json.dumps({"type": "ping", "pad": "x" * 3000}))
        # Read and answered (an unknown field); the feeds' pushes may come first.
        assert recv_until(ws, lambda m: m["type"] in ("pong", "error"))["type"] == "error"
        ws.send(json.dumps({"type": "ping", "pad": "x" * 5000}))
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                ws.recv(timeout=10)
        assert closed.value.rcvd.code == 1009  # message too big, refused by the server before buffering it


@pytest.mark.parametrize("compression", [False, True])
def test_websocket_compression_is_offered_only_when_configured(service_factory, compression):
    """Deflating every message per connection costs the API process's CPU (docs/benchmarks.md,
    session 69): off by default, `ws_compression` offers permessage-deflate."""
    from websockets.sync.client import connect

    service = service_factory(**({"ws_compression": True} if compression else {}))
    service.start_api()
    with connect(service.base.replace("http", "ws") + "/api/v1/ws", open_timeout=10) as ws:  # the client offers it
        agreed = ws.response.headers.get("Sec-WebSocket-Extensions") or ""
    assert ("permessage-deflate" in agreed) is compression


def test_a_refused_websocket_gets_its_status_and_leaves_no_false_error_in_the_log(service_factory):
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    service = service_factory()
    service.start_api()
    url = service.base.replace("http", "ws") + "/api/v1/ws"
    with pytest.raises(InvalidStatus) as refused:
        with connect(url, origin="http://evil.example", open_timeout=10):
            pass
    assert refused.value.response.status_code == 403
    assert b"allowed_origins" in refused.value.response.body
    time.sleep(0.5)
    assert "without completing handshake" not in service.log_tail("api")

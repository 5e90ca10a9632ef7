"""Sessions as the shipped configuration runs them (issue 17, part 3): `sketchboard pipeline --once`
as a process over the demo streams, which declare `sessions:` on http_requests (by user_id, gap
5m) and mobile_app; then the session metrics through the API of `sketchboard api`'s own wiring,
equal to an exact sessionization (pandas) of the sessions the watermark closed.
tests/spark/test_sessions.py checks the sessions in the pane batch in-process; this is the wiring."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import yaml
from fastapi.testclient import TestClient

from ingest.events import EventValidator
from ingest.log import SqliteEventLog
from sketchboard.settings import Settings
from sketchboard.wiring import build_api
from tests.spark.events import T0
from tests.spark.test_sessions import exact_sessions

pytestmark = [pytest.mark.e2e, pytest.mark.spark]

GAP = 300_000  # config/streams.yaml: http_requests sessions {key: user_id, gap: 5m}


def visits(rng: np.random.Generator, users: int = 200, span_ms: int = 1_800_000) -> list[dict]:
    """Half an hour of requests: per user a few visits of a few requests each, out of order."""
    out = []
    for u in range(users):
        for _ in range(int(rng.integers(1, 4))):
            start = T0 + int(rng.integers(0, span_ms - 600_000))
            for t in start + np.cumsum(rng.exponential(40_000, int(rng.integers(1, 10)))).astype(np.int64):
                out.append({"time": int(t), "endpoint": "/", "method": "GET", "status": 200, "region": "eu",
                            "latency_ms": 12.5, "response_bytes": 512, "user_id": f"u{u}"})
    rng.shuffle(out)
    return out


def test_the_pipeline_command_runs_the_session_queries_and_the_api_serves_their_metrics(tmp_path, demo_catalog,
                                                                                       monkeypatch):
    assert demo_catalog.stream("http_requests").sessions is not None  # on in the shipped configuration
    settings_file = tmp_path / "sketchboard.yaml"
    settings_file.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "spark_driver_memory": "1g"}))
    events = visits(np.random.default_rng(5))
    stream = demo_catalog.stream("http_requests")
    log = SqliteEventLog(tmp_path / "data" / "log.db")
    for s in demo_catalog.streams.values():
        log.ensure_topic(s)
    log.append(stream, [EventValidator(stream).validate(e) for e in events], int(time.time() * 1000))
    log.close()

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SKETCHBOARD_SETTINGS_FILE": str(settings_file)}
    done = subprocess.run([sys.executable, "-m", "sketchboard.cli", "pipeline", "--once"], env=env,
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]

    # The stream's watermark is its newest event - allowed_lateness: sessions ending before it closed.
    exact = exact_sessions(pd.DataFrame(events), GAP)
    closed = exact[exact["end"] <= max(e["time"] for e in events) - stream.allowed_lateness]
    assert 0 < len(closed) < len(exact)
    monkeypatch.chdir(tmp_path)  # the API as `sketchboard api` builds it, over the pipeline's data
    app, ctx = build_api(Settings(data_dir=tmp_path / "data"))
    try:
        client = TestClient(app, base_url="http://127.0.0.1")
        metrics = {m["name"] for m in client.get("/api/v1/metrics").json()["metrics"]}
        assert {"http_requests_sessions", "http_requests_session_duration", "mobile_app_sessions"} <= metrics
        span = {"from": T0, "to": T0 + 3_600_000, "step": "1h"}
        started = client.get("/api/v1/query", params={"metric": "http_requests_sessions", "stat": "count", **span})
        assert started.status_code == 200, started.text
        assert started.json()["series"][0]["points"][0]["value"] == len(closed)
        longest = client.get("/api/v1/query", params={"metric": "http_requests_session_duration", "stat": "max", **span})
        assert longest.json()["series"][0]["points"][0]["value"] == closed["duration"].max()
        users = client.get("/api/v1/query", params={"metric": "http_requests_sessions", "stat": "distinct", **span})
        assert users.json()["series"][0]["points"][0]["value"] == pytest.approx(closed["user_id"].nunique(), rel=0.05)
    finally:
        ctx.log.close()
        ctx.store.close()

"""Session windows with real Spark, in the pane pipeline's batch (aggregates/session_batch.py):
closed sessions per pane match an exact sessionization (pandas) of the same events, for the
sessions the watermark closed, across restarts. On both logs (the `log_backend` fixture): the
embedded log's source and Spark's Kafka source."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from aggregates.pipeline import Pipeline
from api.app import create_app
from api.context import ApiContext
from catalog import parse_catalog
from store import SqlitePaneStore
from tests.spark.events import T0, rank_interval

pytestmark = pytest.mark.spark

GAP = 120_000
CONFIG = """
streams:
  clicks:
    key_field: user_id
    dimensions: [page]
    distinct: [user_id]
    pane: 1m
    allowed_lateness: 30s
    partitions: 2
    sessions: {key: user_id, gap: 2m}
"""


def click_events(chunk: int, rng: np.random.Generator, users: int = 300) -> list[dict]:
    """Ten minutes of clicks: per user a few bursts, so sessions start, continue across chunks and end."""
    lo = T0 + chunk * 600_000
    out = []
    for u in range(users):
        for _ in range(rng.integers(0, 4)):
            start = lo + int(rng.integers(0, 600_000))
            for t in start + np.cumsum(rng.exponential(30_000, rng.integers(1, 8))).astype(np.int64):
                if t < lo + 600_000:
                    out.append({"time": int(t), "page": "/", "user_id": f"user-{u}"})
    rng.shuffle(out)  # out of order within the chunk
    return out


def exact_sessions(df: pd.DataFrame, gap: int) -> pd.DataFrame:
    df = df.sort_values(["user_id", "time"])
    new = (df["user_id"] != df["user_id"].shift()) | (df["time"] - df["time"].shift() >= gap)
    df = df.assign(session=new.cumsum())
    out = df.groupby("session").agg(user_id=("user_id", "first"), first=("time", "min"), last=("time", "max"),
                                    events=("time", "count"))
    return out.assign(end=out["last"] + gap, duration=out["last"] - out["first"], pane=out["first"] - out["first"] % 60_000)


def test_sessions_match_an_exact_sessionization_for_sessions_closed_by_the_watermark(tmp_path: Path, spark,
                                                                                     log_backend):
    catalog = parse_catalog(CONFIG)
    test_log = log_backend.new(tmp_path)
    log = test_log.open(catalog)
    store = SqlitePaneStore(tmp_path / "store.db")
    client = TestClient(create_app(ApiContext(catalog=catalog, log=log, store=store,
                                              clock=lambda: (T0 + 7_200_000) / 1000)))
    config = test_log.pipeline_config("main")
    rng = np.random.default_rng(3)
    events: list[dict] = []
    for chunk in range(3):  # one run per chunk: the pipeline restarts, its open sessions read from the store
        batch = click_events(chunk, rng)
        events += batch
        answer = client.post("/api/v1/events?stream=clicks", content=json.dumps(batch),
                             headers={"content-type": "application/json"})
        assert answer.status_code == 200 and answer.json()["rejected"] == []
        Pipeline(spark, catalog, SqlitePaneStore(tmp_path / "store.db"), config, log=test_log.open(catalog),
                 clock=lambda: (T0 + 7_200_000) / 1000).run_until_drained()
    watermark = store.progress("main").streams["clicks"].watermark_ms
    assert watermark is not None and watermark > T0 + 1_200_000

    exact = exact_sessions(pd.DataFrame(events), GAP)
    closed = exact[exact["end"] <= watermark]
    assert 0 < len(closed) < len(exact)  # some closed, some still open
    expected = closed.groupby("pane").agg(count=("events", "size"), dsum=("duration", "sum"), dmin=("duration", "min"),
                                          dmax=("duration", "max"), esum=("events", "sum"))
    panes = {p.key.start_ms: p for p in store.read_panes("clicks_sessions", 0, 2**62)}
    assert set(panes) == set(expected.index)
    for pane, row in expected.iterrows():
        got = panes[pane].data
        duration, count = got.values["duration_ms"], got.values["events"]
        assert got.count == row["count"], pane
        assert (duration.sum, duration.min, duration.max) == (row["dsum"], row["dmin"], row["dmax"]), pane
        assert count.sum == row["esum"], pane

    # Through the API like any metric: sessions started, events per session, duration percentiles.
    span = {"from": T0, "to": T0 + 1_800_000}
    started = client.get("/api/v1/query", params={"metric": "clicks_sessions", "stat": "count", "step": "10m", **span}).json()
    assert sum(p["value"] for p in started["series"][0]["points"]) == len(closed)
    avg = client.get("/api/v1/query", params={"metric": "clicks_session_events", "stat": "avg", "step": "30m", **span}).json()
    assert avg["series"][0]["points"][0]["value"] == pytest.approx(closed["events"].mean())
    durations = np.sort(closed["duration"].to_numpy())
    for q in (0.5, 0.9):
        answer = client.get("/api/v1/query", params={"metric": "clicks_session_duration", "stat": f"p{q * 100:g}",
                                                     "step": "30m", **span}).json()
        lo, hi = rank_interval(durations, answer["series"][0]["points"][0]["value"])
        assert lo - 0.0133 <= q <= hi + 0.0133
    # Nothing can be sent to the derived stream directly.
    answer = client.post("/api/v1/events?stream=clicks_sessions", content="[]", headers={"content-type": "application/json"})
    assert answer.status_code == 400 and "derived" in answer.json()["detail"]
    log.close()

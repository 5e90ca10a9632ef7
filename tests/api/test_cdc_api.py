"""Change data capture in the service (sketchboard/wiring.py, api/cdc_routes.py): the leader
replica runs a follower per CDC-fed table; GET /api/v1/cdc and /metrics show its snapshot,
position and lag; producers' writes to such a table are refused (409) with the reason."""

from __future__ import annotations

import time
import warnings

import psycopg
import pytest
import yaml

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from sketchboard.settings import Settings
from sketchboard.wiring import build_api


def streams(dsn: str) -> dict:
    return {"streams": {"plans": {"kind": "table", "key_field": "plan_id", "dimensions": ["tier"],
                                  "values": ["price"], "partitions": 2,
                                  "source": {"postgres_dsn": dsn, "table": "plans", "key": "plan_id",
                                             "poll_interval": "100ms"}}}}


@pytest.mark.postgres
def test_the_leader_follows_the_source_and_reports_it_and_producers_get_409(logical_postgres_server, tmp_path):
    server = logical_postgres_server
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        conn.execute("CREATE TABLE plans (plan_id int PRIMARY KEY, tier text, price numeric)")
        conn.execute("INSERT INTO plans VALUES (1, 'free', 0), (2, 'pro', 9.5)")
    config = tmp_path / "streams.yaml"
    config.write_text(yaml.safe_dump(streams(server.dsn())))
    settings = Settings(data_dir=tmp_path / "data", streams_config=config, alerts_config=None)
    app, ctx = build_api(settings)
    ctx.leadership.start()  # as `sketchboard api` does: the leader starts the followers
    try:
        with TestClient(app, base_url="http://127.0.0.1") as client:
            def cdc() -> dict:
                return client.get("/api/v1/cdc").json()["sources"][0]

            deadline = time.time() + 60
            while cdc()["snapshot_rows"] is None and time.time() < deadline:
                time.sleep(0.1)
            with psycopg.connect(server.dsn(), autocommit=True) as conn:
                conn.execute("UPDATE plans SET price = 12 WHERE plan_id = 2")
            while cdc()["upserts"] < 1 and time.time() < deadline:
                time.sleep(0.1)
            status = cdc()
            assert (status["stream"], status["table"], status["slot"], status["state"]) == \
                ("plans", "plans", "sketchboard_plans", "streaming")
            assert status["snapshot_rows"] == 2 and status["upserts"] == 1 and status["error"] is None
            assert status["schema"] == {"missing": [], "ignored": [], "added": [], "removed": []}
            metrics = client.get("/metrics").text
            assert 'sketchboard_cdc_snapshot_rows{stream="plans"} 2.0' in metrics
            assert 'sketchboard_cdc_changes_total{op="upsert",stream="plans"} 1.0' in metrics
            assert 'sketchboard_cdc_lag_bytes{stream="plans"}' in metrics
            refused = client.post("/api/v1/tables/plans", json=[{"plan_id": "3", "tier": "x"}])
            assert refused.status_code == 409 and "change data capture" in refused.json()["detail"]
            assert client.delete("/api/v1/tables/plans/1").status_code == 409
    finally:
        ctx.leadership.stop()
    assert ctx.cdc[0].status()["state"] == "stopped"
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot('sketchboard_plans')")
        conn.execute("DROP PUBLICATION sketchboard_plans")
        conn.execute("DROP TABLE plans")


def test_a_stopped_follower_exports_no_lag(tmp_path):
    """A former leader's follower (stopped when the lease was lost) exported a lag counted from
    its last caught-up poll, growing for ever. The source is never contacted here."""
    from api.cdc_routes import cdc_metrics
    from catalog import load_catalog
    from ingest.cdc.follower import followers_for
    from ingest.log import SqliteEventLog
    from tests.support.clock import FakeClock

    config = tmp_path / "streams.yaml"
    config.write_text(yaml.safe_dump(streams("host=db dbname=app user=x")))
    catalog = load_catalog(config)
    log = SqliteEventLog(tmp_path / "log.db")
    for stream in catalog.streams.values():
        log.ensure_topic(stream)
    clock = FakeClock()
    [follower] = followers_for(catalog.streams.values(), log, clock=clock)
    # As a caught-up round of the leader's follower leaves it.
    follower._set(state="streaming", caught_up_at_ms=int(clock() * 1000), caught_up_lsn="0/16B3748",
                  server_lsn="0/16B3748")

    def exported() -> dict:
        return {family.name: [s.value for s in family.samples] for family in cdc_metrics([follower])}

    assert exported()["sketchboard_cdc_lag_seconds"] == [0.0]
    follower.stop()  # the lease is lost
    clock.advance(3600)
    assert follower.status()["lag_seconds"] is None and follower.status()["lag_bytes"] is None
    assert exported()["sketchboard_cdc_lag_seconds"] == [] and exported()["sketchboard_cdc_lag_bytes"] == []
    log.close()

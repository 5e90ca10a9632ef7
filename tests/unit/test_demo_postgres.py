"""The demo's tables from PostgreSQL (setting demo_postgres_dsn, demo/pg_tables.py): without the
setting nothing changes; with it every table stream of the demo is fed by change data capture
from `sketchboard_demo.<table>`, and the demo producer writes its rows there instead of posting
them. Against the suite's real PostgreSQL server (wal_level=logical): demo producer -> PostgreSQL
-> CDC follower -> the table stream's log, which ends equal to the PostgreSQL table and to the
demo's own idea of every user's plan."""

from __future__ import annotations

import io
import threading
import warnings

import psycopg
import pytest
import yaml

from catalog import load_catalog
from catalog.tables import DELETE, OP_FIELD
from demo import DEFAULT_CONFIG, DemoProducer, DemoTraffic
from demo.pg_tables import SCHEMA, PostgresTables, fed_catalog
from demo.users import PLAN_NAMES
from ingest.cdc.follower import followers_for
from ingest.log import SqliteEventLog
from sketchboard.settings import Settings
from sketchboard.wiring import open_catalog
from tests.support.clock import FakeClock

DSN = "host=db.internal dbname=demo user=demo password=${DEMO_PG_PASSWORD}"


def test_without_the_setting_nothing_changes_with_it_the_demos_tables_are_fed_by_cdc(tmp_path):
    plain = open_catalog(Settings(data_dir=tmp_path, alerts_config=None))
    fed = open_catalog(Settings(data_dir=tmp_path, alerts_config=None, demo_postgres_dsn=DSN))
    assert all(s.source is None for s in plain.streams.values())
    tables = {n for n, s in plain.streams.items() if s.kind == "table" and not s.derived_from}
    assert "users" in tables and {n for n, s in fed.streams.items() if s.source} == tables
    users = fed.streams["users"].source
    assert (users.postgres_dsn, users.table, users.key) == (DSN, f"{SCHEMA}.users", "user_id")
    assert {n: s for n, s in fed.streams.items() if n not in tables} == \
        {n: s for n, s in plain.streams.items() if n not in tables}
    # A secret spelled out is refused as it is in a `source:`; the ${NAME} form is resolved late.
    with pytest.raises(ValueError, match="demo_postgres_dsn: .*spells out a password"):
        open_catalog(Settings(data_dir=tmp_path, alerts_config=None,
                              demo_postgres_dsn="host=db user=demo password=hunter2"))


def test_with_the_setting_the_api_follows_the_demos_tables_and_refuses_their_posts(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient
    from sketchboard.wiring import build_api

    config = tmp_path / "streams.yaml"
    config.write_text(yaml.safe_dump({"streams": {"users": {"kind": "table", "key_field": "user_id",
                                                            "dimensions": ["plan"]}}}))
    app, ctx = build_api(Settings(data_dir=tmp_path / "data", streams_config=config, alerts_config=None,
                                  demo_postgres_dsn=DSN))
    with TestClient(app, base_url="http://127.0.0.1") as client:  # not the leader here: its follower waits
        [users] = client.get("/api/v1/cdc").json()["sources"]
        assert (users["stream"], users["table"], users["state"]) == ("users", f"{SCHEMA}.users", "stopped")
        refused = client.post("/api/v1/tables/users", json=[{"user_id": "u1", "plan": "pro"}])
        assert refused.status_code == 409 and "change data capture" in refused.json()["detail"]


def log_table(log, stream) -> dict:
    table: dict = {}
    for partition, offsets in log.offsets(stream.name).items():
        for batch in log.read(stream, partition, offsets.start, offsets.end):
            for r in batch.to_pylist():
                if r[OP_FIELD] == DELETE:
                    table.pop(r[stream.key_field], None)
                else:
                    table[r[stream.key_field]] = {d: r[d] for d in stream.dimensions if d != OP_FIELD}
    return table


def catch_up(follower) -> None:
    for _ in range(50):
        if not follower.step():
            return
    raise AssertionError("the follower did not catch up")


@pytest.mark.postgres
def test_the_demo_producer_writes_its_tables_into_postgres_and_cdc_brings_them_to_the_streams(
        logical_postgres_server, tmp_path):
    dsn = logical_postgres_server.dsn()
    catalog = load_catalog(DEFAULT_CONFIG)
    fed = fed_catalog(catalog, dsn)
    clock = FakeClock()
    traffic = DemoTraffic(catalog, seed=5, clock=clock)
    producer = DemoProducer("http://127.0.0.1:9", traffic, pg_tables=PostgresTables(dsn, catalog), out=io.StringIO())
    stop = threading.Event()
    log = SqliteEventLog(tmp_path / "log.db")
    followers = followers_for(fed.streams.values(), log)
    try:
        producer.send_tables(None, stop, None)  # the initial load; no API at that address: nothing is posted
        loaded = producer.table_rows["users"]
        assert loaded == len(traffic.user_table.users) - len(traffic.user_table.unsynced) and producer.errors == 0
        for follower in followers:
            log.ensure_topic(follower.stream)
            catch_up(follower)  # the snapshot
        for _ in range(120):  # ten minutes of plan changes and sign-ups, followed as they come
            clock.advance(5)
            producer.send_tables(None, stop, None)
            if clock.now % 60 == 0:
                for follower in followers:
                    catch_up(follower)
        for follower in followers:
            catch_up(follower)
        users = fed.streams["users"]
        with psycopg.connect(dsn) as conn:
            rows = conn.execute(f"SELECT user_id, plan, country FROM {SCHEMA}.users").fetchall()
        in_postgres = {u: {"plan": p, "country": c} for u, p, c in rows}
        in_log = log_table(log, users)
        assert in_log == in_postgres and len(in_log) > loaded  # sign-ups came too
        demo = traffic.user_table  # what the demo thinks every user's plan is (plan_of, without its list.index)
        assert {u: r["plan"] for u, r in in_log.items()} == {
            u: PLAN_NAMES[demo.plan[rank]] for rank, u in enumerate(demo.users) if rank not in demo.unsynced}
        [status] = [f.status() for f in followers if f.stream.name == "users"]
        assert status["snapshot_rows"] == loaded and status["upserts"] == producer.table_rows["users"] - loaded > 0
    finally:
        for follower in followers:
            follower.stop()
        producer.pg_tables.close()
        log.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            for follower in followers:
                conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                             " WHERE slot_name = %s", (follower.slot,))
                conn.execute(f"DROP PUBLICATION IF EXISTS {follower.publication}")
            conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")

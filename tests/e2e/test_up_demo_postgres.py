"""`sketchboard up` with the demo on and `demo_postgres_dsn` set, as `make run` runs it with a
PostgreSQL database of the user's: the demo producer writes the `users` and `plans` tables into
PostgreSQL, the API follows both by change data capture into their table streams, and the Spark
pipeline enriches `http_requests` through the view `user_plans` (users.plan -> plans.tier), so
requests are counted per tier two joins away from the event. Real processes, real HTTP, the
suite's PostgreSQL server with wal_level=logical (issue 25: "the demo's users and plans table come
from a PostgreSQL database when one is configured")."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import psycopg
import pytest

from demo.pg_tables import SCHEMA
from tests.procs import free_port, service_environment, stop_group

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

TABLES = ("users", "plans")


def drop_demo_slots(admin_dsn: str) -> None:
    """Replication slots are the server's, not a database's: slots of the demo's tables that
    another test left behind would be taken for this service's own."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for table in TABLES:
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                         " WHERE slot_name = %s AND NOT active", (f"sketchboard_{table}",))


@pytest.fixture
def demo_database(logical_postgres_server):
    """A database of its own on the logical server: the DSN the service is given."""
    name = f"demo_up_{os.getpid()}_{int(time.time())}"
    admin = logical_postgres_server.dsn()
    drop_demo_slots(admin)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield logical_postgres_server.dsn(name)
    drop_demo_slots(admin)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def pg_rows(dsn: str, table: str, key: str, column: str) -> dict[str, str]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute(f"SELECT {key}, {column} FROM {SCHEMA}.{table}").fetchall())


def api_rows(base: str, table: str, key: str, column: str) -> dict[str, str]:
    rows, cursor = {}, None
    while True:
        params = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
        page = httpx.get(f"{base}/api/v1/tables/{table}", params=params, timeout=10).json()
        rows.update({r["key"]: r["row"][column] for r in page["rows"]})
        cursor = page.get("next_cursor")
        if not cursor:
            return rows


def wait_for(what: str, check, log_file, timeout: float = 240, seen: dict | None = None):
    """Poll `check` until it answers; the first batch holds the users table's snapshot (~50 000
    rows: about a minute of Spark on a loaded 2-core machine)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            last = exc
        time.sleep(1)
    raise AssertionError(f"{what} within {timeout} s (last: {last!r}, {seen}):\n{log_file.read_text()[-4000:]}")


def test_up_with_the_demo_tables_in_postgres_follows_them_and_counts_requests_per_tier(tmp_path, demo_database):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    # A demo shop of 2 000 users, as tests/procs.py gives every real-process test: the shipped
    # 50 000 rows are a snapshot, a first batch and a table read to wait for, showing nothing more.
    env = {**service_environment(), "PYTHONUNBUFFERED": "1", "SKETCHBOARD_DEMO_POSTGRES_DSN": demo_database,
           "SKETCHBOARD_DEMO_RATE": "40", "SKETCHBOARD_DEMO_USERS": "2000"}
    log_file = tmp_path / "up.log"
    with open(log_file, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "sketchboard.cli", "up", "--port", str(port),
                                 "--data-dir", str(tmp_path / "data")],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # Both tables followed: snapshot taken, then streaming changes from the slot.
        def streaming():
            sources = httpx.get(f"{base}/api/v1/cdc", timeout=5).json()["sources"]
            states = {s["stream"]: s["state"] for s in sources}
            return states if states == {t: "streaming" for t in TABLES} else None
        wait_for("both demo tables followed by CDC", streaming, log_file)

        # The table streams follow PostgreSQL's tables. The demo keeps changing plans and signing
        # users up, and the pipeline serves a table a batch behind its log: every row PostgreSQL
        # held at one moment is served as it was then, or (changed since) the row has moved on.
        held = pg_rows(demo_database, "users", "user_id", "plan")
        seen = {}

        def users_followed():
            served = api_rows(base, "users", "user_id", "plan")
            now = pg_rows(demo_database, "users", "user_id", "plan")
            behind = sorted(k for k, plan in held.items() if served.get(k) != plan and now.get(k) == plan)
            seen.update(held=len(held), served=len(served), behind=len(behind), first_behind=behind[:5])
            return served if not behind else None
        served = wait_for("the users table served as PostgreSQL held it", users_followed, log_file, seen=seen)
        assert set(served) <= set(pg_rows(demo_database, "users", "user_id", "plan"))  # nothing made up
        plans = pg_rows(demo_database, "plans", "plan_id", "tier")
        assert plans and api_rows(base, "plans", "plan_id", "tier") == plans
        assert len(served) > 10

        # Requests counted per tier: the pipeline enriched them through the view over both tables.
        def tiers_counted():
            answer = httpx.get(f"{base}/api/v1/query", params={"metric": "requests", "stat": "count",
                                                               "group_by": "tier", "from": "now-15m"},
                               timeout=10).json()
            counted = {s["group"]["tier"] for s in answer["series"]
                       if any(p["count"] for p in s["points"])}
            return counted if counted & set(plans.values()) else None
        tiers = wait_for("requests counted per tier of their user's plan", tiers_counted, log_file)
        assert tiers & set(plans.values())
    finally:
        stop_group(proc)

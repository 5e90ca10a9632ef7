"""tests/postgres_server.py: the real PostgreSQL server the store tests run against."""

from __future__ import annotations

import psycopg
import pytest

pytestmark = pytest.mark.postgres


def test_each_fresh_dsn_is_an_empty_schema_of_its_own(postgres_server):
    first, second = postgres_server.fresh_dsn(), postgres_server.fresh_dsn()
    with psycopg.connect(first, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (a int)")
        conn.execute("INSERT INTO t VALUES (1)")
    with psycopg.connect(second, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('t')").fetchone()[0] is None
        assert conn.execute("SHOW listen_addresses").fetchone()[0] == "127.0.0.1"
        assert conn.execute("SHOW fsync").fetchone()[0] == "off"

"""A table-table join view with real Spark on the embedded log and SQLite: rows of both tables
sent to the API (foreign key changes, plan updates after the users, deletes on both sides) over
several batches end as a view equal to a pandas merge of the final tables, its changes are
counted per `op` in its stream's panes, and a fresh pipeline reading the compacted logs from
offset 0 rebuilds the same view."""

from __future__ import annotations

import math
import random
import warnings

import pandas as pd
import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from aggregates.pipeline import Pipeline
from api.app import create_app
from api.context import ApiContext
from catalog import parse_catalog
from tests.log_backends import ON_THE_EMBEDDED_STACK
from tests.spark.events import T0

pytestmark = [pytest.mark.spark, ON_THE_EMBEDDED_STACK]  # the view store on PostgreSQL: tests/unit/test_view_state_store.py

CONFIG = """
streams:
  users: {kind: table, key_field: user_id, dimensions: [plan_id], values: [credit], partitions: 3,
          tombstone_retention: 1s}
  plans: {kind: table, key_field: id, dimensions: [tier], values: [price], partitions: 2, tombstone_retention: 1s}
views:
  user_plans: {left: users, right: plans, foreign_key: plan_id, kind: left}
metrics:
  user_plan_changes: {stream: user_plans}
"""
NOW_MS = T0 + 600_000


def rows_for(rng: random.Random, n: int, first: int) -> list[tuple[str, dict]]:
    out = []
    for i in range(n):
        t = first + i * 100
        if rng.random() < 0.6:
            key = f"u{rng.randrange(40)}"
            row = ({"user_id": key, "_deleted": True} if rng.random() < 0.1 else
                   {"user_id": key, "plan_id": f"p{rng.randrange(6)}", "credit": rng.randrange(50)})
            out.append(("users", {**row, "time": t}))
        else:
            key = f"p{rng.randrange(6)}"
            row = ({"id": key, "_deleted": True} if rng.random() < 0.15 else
                   {"id": key, "tier": rng.choice(["free", "gold"]), "price": rng.randrange(10)})
            out.append(("plans", {**row, "time": t}))
    return out


def merged(rows: list[tuple[str, dict]]) -> dict[str, dict]:
    """The view from scratch: pandas' left merge of the final tables."""
    tables: dict[str, dict] = {"users": {}, "plans": {}}
    for table, r in rows:
        key = r["user_id"] if table == "users" else r["id"]
        if r.get("_deleted"):
            tables[table].pop(key, None)
        else:
            tables[table][key] = {k: v for k, v in r.items() if k not in ("time", "user_id", "id")}
    users = pd.DataFrame([{"key": k, **v} for k, v in tables["users"].items()])
    plans = pd.DataFrame([{"plan_id": k, **v} for k, v in tables["plans"].items()])
    out = {}
    for rec in users.merge(plans, on="plan_id", how="left").to_dict("records"):
        out[rec["key"]] = {"plan_id": rec["plan_id"], "credit": float(rec["credit"]),
                           "tier": None if isinstance(rec["tier"], float) else rec["tier"],
                           "price": None if math.isnan(rec["price"]) else float(rec["price"])}
    return out


def view(store) -> dict[str, dict]:
    return {r.key: r.row for r in store.view_rows("user_plans", limit=1000)}


def test_a_view_is_maintained_by_the_pipeline_and_rebuilt_from_the_compacted_logs(tmp_path, spark, log_backend,
                                                                                  store_backend):
    catalog = parse_catalog(CONFIG)
    test_log = log_backend.new(tmp_path / "live")
    log, store = test_log.open(catalog), store_backend.create()
    client = TestClient(create_app(ApiContext(catalog=catalog, log=log, store=store, clock=lambda: NOW_MS / 1000)))

    def drain(into, name: str) -> None:
        config = test_log.pipeline_config(name, max_records_per_batch=150, max_records_per_task=20_000)
        Pipeline(spark, catalog, store_backend.reopen(into), config, log=test_log.open(catalog),
                 clock=lambda: NOW_MS / 1000).run_until_drained()

    rows = rows_for(random.Random(11), 600, T0)
    for i in range(0, len(rows), 100):  # each table's changes in the order they happened
        for table in ("users", "plans"):
            answer = client.post(f"/api/v1/tables/{table}", json=[r for t, r in rows[i:i + 100] if t == table])
            assert answer.status_code == 200 and answer.json()["rejected"] == [], answer.text
    drain(store, "main")
    expected = merged(rows)
    assert view(store) == expected
    some = next(iter(expected))
    assert client.get("/api/v1/tables/user_plans", params={"key": some}).json()["row"]["row"] == expected[some]

    # The view's changes are a stream: counted per op in its panes.
    answer = client.get("/api/v1/query", params={"metric": "user_plan_changes", "stat": "count", "from": T0,
                                                 "to": NOW_MS, "step": "1h", "group_by": "op"}).json()
    counted = {s["group"]["op"]: sum(p["value"] or 0 for p in s["points"]) for s in answer["series"]}
    assert counted["upsert"] >= len(expected) and counted.get("delete", 0) > 0

    # Compaction of both tables' logs, then a fresh pipeline and store from offset 0.
    assert log.compact(NOW_MS + 10_000) > 0
    fresh = store_backend.create()
    drain(fresh, "rebuild")
    assert view(fresh) == expected
    log.close()

"""Changelog tables with real Spark, on both stacks (embedded log + SQLite, Kafka + PostgreSQL):
rows and deletes sent to the API become the table's state in the store (exactly the newest
change per key, over several batches), its changes are counted per `op` in panes (the query
API's CDC), and a fresh pipeline reading the compacted log from offset 0 rebuilds the same table
as the full log gave (embedded: the log's compaction pass; Kafka: the broker's log cleaner on the
compacted topic, made eager for the test)."""

from __future__ import annotations

import json
import random
import time
import warnings
from collections import Counter

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from aggregates.pipeline import Pipeline
from api.app import create_app
from api.context import ApiContext
from catalog import parse_catalog
from tests.log_backends import ON_BOTH_STACKS
from tests.spark.events import T0

pytestmark = [pytest.mark.spark, ON_BOTH_STACKS]

CONFIG = """
streams:
  users:
    kind: table
    key_field: user_id
    dimensions: [plan, country]
    values: [credit]
    partitions: 3
    tombstone_retention: 1s
metrics:
  user_changes: {stream: users}
"""
NOW_MS = T0 + 600_000


def changes(n: int, rng: random.Random, first_time: int) -> list[dict]:
    """n rows over 60 keys, about one in six a delete; times 200 ms apart."""
    out = []
    for i in range(n):
        key = f"u{rng.randrange(60)}"
        if rng.random() < 1 / 6:
            out.append({"user_id": key, "_deleted": True, "time": first_time + i * 200})
        else:
            out.append({"user_id": key, "plan": rng.choice(["free", "pro", "team"]),
                        "country": rng.choice(["de", "fr"]), "credit": rng.randrange(100), "time": first_time + i * 200})
    return out


def oracle(rows: list[dict]) -> dict[str, dict]:
    table: dict[str, dict] = {}
    for r in rows:  # one key stays on one partition, in order: the last change wins
        if r.get("_deleted"):
            table.pop(r["user_id"], None)
        else:
            table[r["user_id"]] = {"plan": r["plan"], "country": r["country"], "credit": float(r["credit"])}
    return table


def state(store) -> dict[str, tuple]:
    rows = store.table_rows("users", limit=1000)
    return {r.key: (r.row, r.event_time_ms, r.partition, r.offset) for r in rows}


class Tables:
    def __init__(self, test_log, catalog, spark, store_backend):
        self.test_log, self.catalog, self.spark, self.backend = test_log, catalog, spark, store_backend
        self.log = test_log.open(catalog)
        self.store = store_backend.create()
        self.client = TestClient(create_app(ApiContext(catalog=catalog, log=self.log, store=self.store,
                                                       clock=lambda: NOW_MS / 1000)))

    def post(self, rows: list[dict]) -> None:
        answer = self.client.post("/api/v1/tables/users", content="\n".join(json.dumps(r) for r in rows),
                                  headers={"content-type": "application/x-ndjson"})
        assert answer.status_code == 200 and answer.json()["rejected"] == [], answer.text

    def drain(self, store, name: str = "main", batch: int = 1_000_000) -> None:
        config = self.test_log.pipeline_config(name, max_records_per_batch=batch, max_records_per_task=20_000)
        Pipeline(self.spark, self.catalog, self.backend.reopen(store), config, log=self.test_log.open(self.catalog),
                 clock=lambda: NOW_MS / 1000).run_until_drained()


def test_a_tables_state_and_changes_and_its_rebuild_from_the_compacted_log(tmp_path, spark, log_backend,
                                                                           store_backend):
    catalog = parse_catalog(CONFIG)
    t = Tables(log_backend.new(tmp_path / "live"), catalog, spark, store_backend)
    rng = random.Random(5)
    rows = changes(1500, rng, T0)
    for i in range(0, len(rows), 250):
        t.post(rows[i:i + 250])
    t.drain(t.store, batch=400)  # several batches: later batches overwrite and delete earlier rows
    expected = oracle(rows)
    full = state(t.store)
    assert {k: v[0] for k, v in full.items()} == expected
    got = t.client.get("/api/v1/tables/users", params={"key": next(iter(expected))}).json()
    assert got["row"]["row"] == expected[next(iter(expected))]

    # The changes as a stream: upserts and deletes per minute, from the panes.
    answer = t.client.get("/api/v1/query", params={"metric": "user_changes", "stat": "count", "from": T0,
                                                   "to": T0 + 1500 * 200, "step": "1m", "group_by": "op"}).json()
    counted = Counter()
    for series in answer["series"]:
        for point in series["points"]:
            counted[(series["group"]["op"], point["t"])] += point["value"] or 0
    exact = Counter(("delete" if r.get("_deleted") else "upsert", r["time"] - r["time"] % 60_000) for r in rows)
    if t.test_log.kafka:
        # A Kafka tombstone carries no time but its record's timestamp, the broker's append time
        # (the real clock, days after these rows' times): its deletes are counted in the panes of
        # their append, outside this range.
        exact = Counter({k: v for k, v in exact.items() if k[0] == "upsert"})
        status = t.client.get("/api/v1/pipeline").json()["streams"]["users"]
        assert (status["events_aggregated"], status["events_dead_lettered"]) == (len(rows), 0)
    assert {k: v for k, v in counted.items() if v} == dict(exact)

    # Compaction, then a fresh pipeline and store from offset 0.
    log = t.log
    total = sum(o.end - o.start for o in log.offsets("users").values())
    if t.test_log.kafka:
        kept = compact_on_kafka(t, total)  # fewer than half the records left
    else:
        assert log.compact(NOW_MS + 10_000) > 0  # tombstones older than their second go too
        kept = readable(t)
    assert len(expected) <= kept < total  # every live key's newest row is kept
    fresh_store = store_backend.create()
    fresh = Tables.__new__(Tables)
    # The same log, a new consumer: its own checkpoint (by name) and store, from offset 0.
    fresh.test_log, fresh.catalog, fresh.spark, fresh.backend = t.test_log, catalog, spark, store_backend
    fresh.drain(fresh_store, name="rebuild")
    live = state(t.store)  # on Kafka: with the rows that rolled the segments over
    assert {k: v for k, v in live.items() if not k.startswith("roll")} == full
    assert state(fresh_store) == live
    t.log.close()


def readable(t: Tables) -> int:
    stream = t.catalog.streams["users"]
    return sum(b.num_rows for p, o in t.log.offsets("users").items() for b in t.log.read(stream, p, o.start, o.end))


def compact_on_kafka(t: Tables, total: int) -> int:
    """Make the broker's cleaner take the topic now: small segments, any dirty ratio; a last row
    after the segment time rolls the active segment (never cleaned) over. Returns the records left.

    The change is incremental: a whole-config alter (AlterConfigs) would also drop the topic's
    message.timestamp.type=LogAppendTime, and with CreateTime the roll rows' timestamps (the
    test's fixed clock, days before the segment's first append time) never reach segment.ms, so
    the active segment never rolled and nothing was ever cleaned."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    from tests.kafka_broker import client_config

    admin = AdminClient(client_config(t.test_log.bootstrap))
    settings = {"segment.ms": "100", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "1000"}
    resource = ConfigResource(ResourceType.TOPIC, t.log.topic("users"), incremental_configs=[
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET) for name, value in settings.items()])
    admin.incremental_alter_configs([resource])[resource].result(30)
    deadline = time.monotonic() + 60
    rolled = 0
    while time.monotonic() < deadline:
        time.sleep(0.2)  # past segment.ms: the next append rolls each partition's active segment
        if rolled < 3:  # each partition's active segment is never cleaned: a row for every partition rolls them
            t.post([{"user_id": f"roll{rolled}-{i}", "plan": "free", "country": "de", "credit": 0, "time": NOW_MS}
                    for i in range(12)])
            rolled += 1
        left = readable(t)
        if left < total * 0.5:
            t.drain(t.store, batch=400)  # the live pipeline takes the roll rows too (compared below)
            return left
    raise AssertionError(f"the broker did not compact the topic in 60 s ({readable(t)} of {total} records left)")

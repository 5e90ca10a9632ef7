"""Enrichment (stream-table join) with real Spark on the embedded log and SQLite: the panes of an
enriched stream, counted per enriched dimension, equal an exact pandas computation of the as-of
lookup (docs/tables.md "Enrichment"), over two batches, with keys missing from the table (""),
table updates and a delete appended after the events they must not change, events that arrive
late with an old time (enriched as of that time), and the misses counted; then a fresh pipeline
over the whole log from offset 0 (a reprocess, one batch) gives exactly the same panes."""

from __future__ import annotations

import json
import random
from collections import Counter

import warnings

import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from aggregates.pipeline import Pipeline
from api.app import create_app
from api.context import ApiContext
from catalog import parse_catalog
from ingest.events import EventValidator
from ingest.partitioner import assign_partitions
from ingest.tables import TableRowValidator
from tests.log_backends import ON_THE_EMBEDDED_STACK
from tests.spark.events import T0

pytestmark = [pytest.mark.spark, ON_THE_EMBEDDED_STACK]  # the versions store on PostgreSQL: tests/unit/test_enrichment.py

CONFIG = """
streams:
  users:
    kind: table
    key_field: user_id
    dimensions: [plan, country]
    partitions: 2
  http_requests:
    key_field: user_id
    dimensions: [method]
    partitions: 2
    enrich:
      - {table: users, by: user_id, columns: [plan, country]}
"""
NOW_MS = T0 + 600_000
PANE = 10_000


class Log:
    """Appends with chosen append (ingest) times, and keeps what pandas needs: each record with
    the append time the log gave it (the one asked for on the embedded log; on Kafka the broker's
    LogAppendTime, which replaces it)."""

    def __init__(self, log, catalog):
        self.log, self.catalog = log, catalog
        self.table_rows: list[dict] = []  # user_id, plan, country (None: deleted), append_ms, seq
        self.events: list[dict] = []

    def table(self, rows: list[dict], append_ms: int) -> None:
        users = self.catalog.streams["users"]
        validator = TableRowValidator(users)
        records = [validator.validate(r, append_ms) for r in rows]
        times = appended_at(self.log, users, records, self.log.append(users, records, append_ms))
        for r, at in zip(rows, times, strict=True):
            self.table_rows.append({"user_id": r["user_id"], "plan": r.get("plan"), "country": r.get("country"),
                                    "append_ms": at, "seq": len(self.table_rows)})

    def requests(self, events: list[dict], append_ms: int) -> None:
        stream = self.catalog.streams["http_requests"]
        validator = EventValidator(stream)
        records = [validator.validate(e) for e in events]
        times = appended_at(self.log, stream, records, self.log.append(stream, records, append_ms))
        self.events += [{**e, "append_ms": at} for e, at in zip(events, times, strict=True)]


def appended_at(log, stream, records, result) -> list[int]:
    """The append time of each of `records` (keyed: their partitions are the log's, by key) as the
    log reads it back; one read per partition when its first and last records share it (an
    append time never goes back within a partition)."""
    partitions, _ = assign_partitions([r.key for r in records], stream.partitions, 0)
    assert None not in [r.key for r in records]
    at: dict[int, list[int]] = {}
    for partition, (first, n) in result.ranges.items():
        assert first is not None
        lo, hi = (log.ingest_time_ms(stream.name, partition, o) for o in (first, first + n - 1))
        at[partition] = [lo] * n if lo == hi else [log.ingest_time_ms(stream.name, partition, first + i)
                                                   for i in range(n)]
    out = []
    for partition in partitions:
        out.append(at[partition].pop(0))
    return out


def expected(log: Log) -> tuple[Counter, int]:
    """(pane, method, plan, country) -> count, by pandas: each event gets the newest table row
    appended at or before min(its time, its append time); "" where the key has none (or a delete)."""
    table = pd.DataFrame(log.table_rows).sort_values(["append_ms", "seq"])
    events = pd.DataFrame(log.events)
    events["at"] = events[["time", "append_ms"]].min(axis=1)
    events = events.sort_values("at").reset_index(drop=True)
    merged = pd.merge_asof(events, table.rename(columns={"append_ms": "at"}), on="at", by="user_id",
                           direction="backward", allow_exact_matches=True)
    merged["missing"] = merged["plan"].isna()
    merged[["plan", "country"]] = merged[["plan", "country"]].fillna("")
    merged["pane"] = merged["time"] - merged["time"] % PANE
    counts = merged.groupby(["pane", "method", "plan", "country"]).size()
    return Counter({k: int(v) for k, v in counts.items()}), int(merged["missing"].sum())


def stored(store) -> Counter:
    out: Counter = Counter()
    for p in store.read_panes("http_requests", 0, 2**62):
        dims = json.loads(p.key.dims)
        out[(p.key.start_ms, dims["method"], dims["plan"], dims["country"])] += p.data.count
    return out


def test_enriched_panes_equal_pandas_as_of_the_event_time_and_a_reprocess_gives_the_same(
        tmp_path, spark, log_backend, store_backend):
    catalog = parse_catalog(CONFIG)
    test_log = log_backend.new(tmp_path)
    log = Log(test_log.open(catalog), catalog)
    store = store_backend.create()
    rng = random.Random(16)

    def requests(n: int, first_ms: int, span_ms: int) -> list[dict]:
        # u0..u11: u10 and u11 are not in the table at first (u10 comes later, u11 never).
        return [{"time": first_ms + rng.randrange(span_ms), "user_id": f"u{rng.randrange(12)}",
                 "method": rng.choice(["GET", "POST"])} for _ in range(n)]

    def drain(name: str, into) -> None:
        config = test_log.pipeline_config(name=name)
        Pipeline(spark, catalog, store_backend.reopen(into), config, clock=lambda: NOW_MS / 1000,
                 log=test_log.open(catalog)).run_until_drained()

    # Batch 1: the table, then events of the first 100 s appended after it.
    log.table([{"user_id": f"u{i}", "plan": ["free", "pro", "team"][i % 3], "country": ["de", "fr"][i % 2]}
               for i in range(10)], T0)
    log.requests(requests(400, T0 + 1_000, 100_000), T0 + 120_000)
    drain("main", store)
    # Batch 2: updates appended after those events (they must not change them), a new key, a delete;
    # then new events, and late ones stamped before the updates (enriched as of their own time).
    log.table([{"user_id": f"u{i}", "plan": "enterprise", "country": "us"} for i in range(4)]
              + [{"user_id": "u10", "plan": "pro", "country": "de"}, {"user_id": "u5", "_deleted": True}], T0 + 200_000)
    log.requests(requests(300, T0 + 200_000, 100_000) + requests(100, T0 + 20_000, 50_000), T0 + 320_000)
    drain("main", store)

    want, missing = expected(log)
    assert {k[2] for k in want} >= {"", "free", "pro", "team", "enterprise"}  # the case is covered
    assert 0 < missing < len(log.events)
    assert stored(store) == want
    # The misses, in the pipeline's status and in /metrics.
    client = TestClient(create_app(ApiContext(catalog=catalog, log=log.log, store=store, clock=lambda: NOW_MS / 1000)))
    status = client.get("/api/v1/pipeline").json()["streams"]
    assert status["http_requests"]["enrich_misses"] == {"users": missing}
    assert status["users"]["enrich_misses"] is None
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    assert [(s.labels, s.value) for s in families["sketchboard_enrich_misses"].samples] == \
        [({"stream": "http_requests", "table": "users"}, missing)]
    streams = {s["name"]: s for s in client.get("/api/v1/streams").json()["streams"]}
    assert streams["http_requests"]["dimensions"] == ["method", "plan", "country"]
    assert len(store.table_versions("users")) == 16  # every version kept (all within retention)

    # A reprocess: a fresh store and checkpoint over the whole log in one batch, same answer.
    fresh = store_backend.create()
    drain("again", fresh)
    assert stored(fresh) == want
    assert fresh.progress("again").streams["http_requests"].enrich_misses == {"users": missing}


def test_the_versions_kept_across_batches_follow_every_table_change_and_a_restart(
        tmp_path, spark, log_backend, store_backend, monkeypatch):
    """One pipeline object over several batches keeps the table's versions on the driver and its
    lookup frame persisted (aggregates/enrichment.py): an update is seen by the events of its own
    batch and of the next ones; a batch committed by another process of the pipeline (a restart) is
    read from the store by the old one instead of answering from its stale copy."""
    # Small, so that the 5 rows' load is a bulk change (a whole frame), the next batch makes the
    # persisted base, and the one after reuses it with the changed keys' rows replaced.
    monkeypatch.setattr("aggregates.enrichment.REBUILD_AFTER", 3)
    catalog = parse_catalog(CONFIG)
    test_log = log_backend.new(tmp_path)
    log = Log(test_log.open(catalog), catalog)
    store = store_backend.create()
    rng = random.Random(28)
    config = test_log.pipeline_config(name="main")

    def pipeline() -> Pipeline:
        return Pipeline(spark, catalog, store_backend.reopen(store), config, clock=lambda: NOW_MS / 1000,
                        log=test_log.open(catalog))

    def requests(n: int, first_ms: int, span_ms: int) -> list[dict]:
        return [{"time": first_ms + rng.randrange(span_ms), "user_id": f"u{rng.randrange(6)}", "method": "GET"}
                for _ in range(n)]

    first = pipeline()
    log.table([{"user_id": f"u{i}", "plan": "free", "country": "de"} for i in range(5)], T0)
    log.requests(requests(100, T0 + 1_000, 90_000), T0 + 100_000)
    first.run_until_drained()
    # An update and events after it in one batch, then events only: the kept copy answers them.
    log.table([{"user_id": "u0", "plan": "pro", "country": "de"}, {"user_id": "u5", "plan": "team", "country": "fr"}],
              T0 + 150_000)
    log.requests(requests(100, T0 + 150_000, 50_000), T0 + 210_000)
    first.run_until_drained()
    log.requests(requests(100, T0 + 220_000, 50_000), T0 + 280_000)
    first.run_until_drained()
    assert first.enrichment.kept.loads == 1  # read from the store once, then kept
    # A restart commits a batch with an update: the first object's copy is stale and must be read again.
    log.table([{"user_id": "u1", "plan": "team", "country": "us"}, {"user_id": "u2", "_deleted": True}], T0 + 300_000)
    log.requests(requests(100, T0 + 300_000, 50_000), T0 + 360_000)
    pipeline().run_until_drained()
    log.requests(requests(100, T0 + 370_000, 50_000), T0 + 430_000)
    first.run_until_drained()
    assert first.enrichment.kept.loads == 2

    want, missing = expected(log)
    assert {k[2] for k in want} >= {"", "free", "pro", "team"}  # the case is covered
    assert stored(store) == want
    assert store.progress("main").streams["http_requests"].enrich_misses == {"users": missing}


def test_a_reprocess_after_compaction_enriches_old_events_as_the_live_run_did(tmp_path, spark, log_backend,
                                                                               store_backend):
    """The table's log is compacted (each key's older rows gone) before a reprocessing run of the
    enriched stream: the run starts from the versions the serving store kept (docs/tables.md,
    "Pruning"), so events from before a key's newest change get the row the live run gave them,
    not "" (what the compacted log alone would say)."""
    import io
    import time

    import yaml

    from catalog import Catalog
    from sketchboard.reprocess import run_reprocess
    from sketchboard.settings import Settings
    from sketchboard.wiring import build_pipeline, open_store

    old = yaml.safe_load(CONFIG)
    new = yaml.safe_load(CONFIG)
    new["streams"]["http_requests"]["dimensions"] = ["method", "region"]  # a definition change: a run is due
    config = tmp_path / "streams.yaml"
    config.write_text(yaml.safe_dump(old))
    test_log = log_backend.new(tmp_path / "data")
    settings = Settings(data_dir=test_log.root, streams_config=config, alerts_config=None, **test_log.settings())
    catalog = Catalog(**new)
    log = Log(test_log.open(catalog), catalog)
    rng = random.Random(36)
    base = (int(time.time() * 1000) // 3_600_000 - 1) * 3_600_000  # within retention: the run reads real time

    def requests(n: int, first_ms: int, span_ms: int) -> list[dict]:
        return [{"time": first_ms + rng.randrange(span_ms), "user_id": f"u{rng.randrange(8)}",
                 "method": rng.choice(["GET", "POST"]), "region": "eu"} for _ in range(n)]

    log.table([{"user_id": f"u{i}", "plan": ["free", "pro"][i % 2], "country": "de"} for i in range(8)], base)
    log.requests(requests(200, base + 1_000, 100_000), base + 120_000)
    log.table([{"user_id": f"u{i}", "plan": "enterprise", "country": "us"} for i in range(4)], base + 200_000)
    log.requests(requests(200, base + 200_000, 100_000), base + 320_000)
    main = build_pipeline(settings, spark)
    main.run_until_drained()
    served: Counter = Counter()
    for (start, _, plan, _), n in stored(main.store).items():
        served[(start, plan)] += n
    main.store.close()
    assert {plan for _, plan in served} == {"free", "pro", "enterprise"}  # u0..u3 changed plan in between

    assert log.log.compact(base + 400_000) == 4  # u0..u3's first rows are gone from the table's log
    config.write_text(yaml.safe_dump(new))
    run = run_reprocess(settings, "http_requests", spark=spark, out=io.StringIO(), interval_s=0.05)
    reprocessed = open_store(settings, run.id)
    try:
        by_plan: Counter = Counter()
        for p in reprocessed.read_panes("http_requests", 0, 2**62):
            by_plan[(p.key.start_ms, json.loads(p.key.dims)["plan"])] += p.data.count
        assert by_plan == served
        assert not (reprocessed.progress(run.id).streams["http_requests"].enrich_misses or {}).get("users")
    finally:
        reprocessed.close()

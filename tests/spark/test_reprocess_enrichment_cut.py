"""Batches cut at one log append time (ingest/append_cut.py; docs/tables.md "Time semantics"): a
table with many changes appended just before a stream's few events, read in small batches. Shared
fairly across partitions (or in proportion to their backlogs, as Spark's Kafka source shares a
batch), the events' small partitions would be read in the first batches beside only the table's
oldest changes, and enriched with stale rows. Cut at one append time, a reprocessing run of the
enriched stream (from the versions the serving store kept before the changes) and a live pipeline
catching up the same log both enrich every event as pandas' as-of join does. On both logs: on
Kafka the run and the live pipeline's catch-up read in batches of their own
(aggregates/bounded_batches.py), cut by the broker's time index; the append times the oracle uses
are the broker's."""

from __future__ import annotations

import io
import random
import time

import pytest
import yaml

from catalog import Catalog
from sketchboard.reprocess import run_reprocess
from sketchboard.settings import Settings
from sketchboard.wiring import build_pipeline, open_store
from tests.log_backends import ON_BOTH_LOGS
from tests.spark.test_enrichment import Log, expected, stored

pytestmark = [pytest.mark.spark, ON_BOTH_LOGS]

LATE = {"allowed_lateness": "1h", "tiers": []}
USERS = {"kind": "table", "key_field": "user_id", "dimensions": ["plan", "country"], "partitions": 1, **LATE}
REQUESTS = {"key_field": "user_id", "dimensions": ["method"], "partitions": 2, **LATE,
            "enrich": [{"table": "users", "by": "user_id", "columns": ["plan"]}]}
SERVED = {"streams": {"users": USERS, "http_requests": REQUESTS}, "metrics": {"requests": {"stream": "http_requests"}}}
# The stream's new definition: enriched with the table's country too (what the run builds).
NEW = {**SERVED, "streams": {"users": USERS, "http_requests": {
    **REQUESTS, "enrich": [{"table": "users", "by": "user_id", "columns": ["plan", "country"]}]}}}
BATCH = 10


def test_a_run_and_the_live_pipeline_cut_batches_at_one_append_time_and_enrich_alike(
        tmp_path, spark, log_backend, store_backend):
    test_log = log_backend.new(tmp_path / "data")
    config = tmp_path / "streams.yaml"
    config.write_text(yaml.safe_dump(SERVED))
    settings = Settings(data_dir=test_log.root, streams_config=config, alerts_config=None,
                        max_records_per_batch=BATCH, **test_log.settings())
    catalog = Catalog(**NEW)
    log = Log(test_log.open(catalog), catalog)
    rng = random.Random(16)

    def tick() -> int:
        time.sleep(0.02)  # distinct append times, on Kafka the broker's
        return int(time.time() * 1000)

    def changes(n: int) -> None:  # one append each: one partition, many distinct append times
        for _ in range(n):
            log.table([{"user_id": f"u{rng.randrange(4)}", "plan": rng.choice(["free", "pro", "team", "max"]),
                        "country": rng.choice(["nl", "de", "fr"])}], tick())

    def requests(n: int) -> None:  # u0..u4: u4 is never in the table (a miss)
        at = tick()
        log.requests([{"time": at - rng.randrange(30), "user_id": f"u{rng.randrange(5)}",
                       "method": rng.choice(["GET", "POST"])} for _ in range(n)], at)

    changes(3)
    requests(6)
    main = build_pipeline(settings, spark)  # serves the old definition; keeps the first versions
    live = None
    try:
        main.run_until_drained()
        config.write_text(yaml.safe_dump(NEW))
        # Many changes of the one table partition, then a few events in two partitions, twice: a
        # fair share of 10 reads the events' partitions whole in the first batches.
        changes(40)
        requests(4)
        changes(30)
        requests(4)
        run = run_reprocess(settings, "http_requests", spark=spark, out=io.StringIO(), interval_s=0.05)
        assert run.state == "caught_up"
        # A live pipeline (not a run) over the same log with the new definition, catching up in
        # batches of the same size as `sketchboard pipeline` does (on Kafka in batches of its own).
        live = build_pipeline(settings, spark, name="live", starting_offsets="earliest")
        live.catch_up()
        live.run_until_drained()

        want, missing = expected(log)
        assert sum(want.values()) == len(log.events) == 14 and 0 < missing < 14
        assert len({k[2] for k in want}) >= 3  # several plans: the events' rows differ over time
        output = open_store(settings, run.id)
        try:
            assert stored(output) == want
            assert output.progress(run.id).streams["http_requests"].enrich_misses == {"users": missing}
        finally:
            output.close()
        assert stored(live.store) == want
    finally:
        if live is not None:
            live.store.close()
        main.store.close()
        log.log.close()

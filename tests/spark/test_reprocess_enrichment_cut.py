"""Batches cut at one log append time (ingest/append_cut.py; docs/tables.md "Time semantics"): a
table with many changes appended just before a stream's few events, read in small batches. Shared
fairly across partitions (or in proportion to their backlogs, as Spark's Kafka source shares a
batch), the events' small partitions would be read in the first batches beside only the table's
oldest changes, and enriched with stale rows. Cut at one append time, a reprocessing run of the
enriched stream (from the versions the serving store kept before the changes) and a live pipeline
catching up the same log both enrich every event as pandas' as-of join does. On both logs: on
Kafka the run and the live pipeline's catch-up read in batches of their own
(aggregates/bounded_batches.py), cut by the broker's time index; the append times the oracle uses
are the broker's. Then the same through `sketchboard pipeline`'s own loop (sketchboard/live.py):
serving, it catches a backlog up so before its query starts, and Spark's query resumes after
those batches without a batch of its own until new records come (the offsets logged in Spark's
very text, ingest/kafka_offset_json.py)."""

from __future__ import annotations

import io
import json
import random
import threading
import time

import pytest
import yaml

from aggregates.checkpoint_moves import logged_batches
from catalog import Catalog
from ingest.kafka_offset_json import spark_offsets_json
from sketchboard.live import run_pipeline
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


def test_the_serving_pipeline_catches_up_in_batches_cut_at_one_append_time_then_serves_on(
        tmp_path, spark, log_backend, store_backend):  # SQLite: the settings' default store
    """`sketchboard pipeline` (serving, not --once) over a backlog of many table changes around a
    few events, in batches of 10: every event enriched as pandas' as-of join does (on Kafka, left
    to Spark's source, the backlog is shared in proportion to each partition's and events are read
    before changes appended ahead of them); then records appended while it serves, read by Spark's
    query. Every logged batch read something (no empty batch when Spark's query took over), and on
    Kafka every offset log line is the very text Spark writes."""
    test_log = log_backend.new(tmp_path / "data")
    config = tmp_path / "streams.yaml"
    config.write_text(yaml.safe_dump(NEW))
    settings = Settings(data_dir=test_log.root, streams_config=config, alerts_config=None,
                        max_records_per_batch=BATCH, **test_log.settings())
    catalog = Catalog(**NEW)
    log = Log(test_log.open(catalog), catalog)
    rng = random.Random(61)

    def tick(pause: float = 0.02) -> int:
        time.sleep(pause)
        return int(time.time() * 1000)

    def changes(n: int, pause: float = 0.02) -> None:
        for _ in range(n):
            log.table([{"user_id": f"u{rng.randrange(4)}", "plan": rng.choice(["free", "pro", "team", "max"]),
                        "country": rng.choice(["nl", "de", "fr"])}], tick(pause))

    def requests(n: int, pause: float = 0.02) -> None:
        at = tick(pause)
        log.requests([{"time": at - rng.randrange(30), "user_id": f"u{rng.randrange(5)}",
                       "method": rng.choice(["GET", "POST"])} for _ in range(n)], at)

    changes(3)
    requests(6)
    changes(40)
    requests(4)
    changes(30)
    requests(4)
    store = open_store(settings)

    def read() -> int:  # records read, by the end offsets the store recorded (the log's start at 0)
        return sum(sum(p.values()) for p in store.progress(settings.pipeline_name).end_offsets.values())

    def wait_for(records: int) -> None:
        deadline = time.monotonic() + 300
        while read() < records and time.monotonic() < deadline and serving.is_alive():
            time.sleep(0.5)
        assert read() == records, (read(), records)

    stopping = threading.Event()
    result: list[int] = []
    serving = threading.Thread(target=lambda: result.append(run_pipeline(settings, stopping, start="earliest",
                                                                         spark=spark)))
    serving.start()
    try:
        wait_for(len(log.events) + len(log.table_rows))
        caught_up = logged_batches(settings.checkpoint_dir_of(settings.pipeline_name) / "offsets")
        changes(1)  # while it serves: Spark's query reads these
        requests(3)
        wait_for(len(log.events) + len(log.table_rows))
        # A burst of more than a batch within a trigger while it serves: Spark's Kafka source would
        # share it by partition (the events' partitions first read beside the oldest changes); the
        # query refuses such a batch and the pipeline catches the burst up cut at one append time.
        for _ in range(2):
            changes(30, pause=0.001)
            requests(4, pause=0.001)
        wait_for(len(log.events) + len(log.table_rows))
        time.sleep(3)  # a few more triggers with nothing new: no batch
    finally:
        stopping.set()
        serving.join(timeout=300)
    try:
        assert result == [0]
        want, missing = expected(log)
        assert sum(want.values()) == len(log.events) == 25 and 0 < missing < 25
        assert stored(store) == want
        checkpoint = settings.checkpoint_dir_of(settings.pipeline_name)
        batches = logged_batches(checkpoint / "offsets")
        assert len(caught_up) >= (3 + 6 + 40 + 4 + 30 + 4) // BATCH and len(batches) > len(caught_up)
        assert batches == logged_batches(checkpoint / "commits")
        before: dict = {}
        for batch in batches:  # each batch read something: none ran again with the same offsets
            ends = test_log.end_offsets(catalog, checkpoint, batch)
            assert ends != before, batch
            before = ends
            if test_log.kafka:
                line = (checkpoint / "offsets" / str(batch)).read_text().splitlines()[2]
                assert line == spark_offsets_json(json.loads(line))
    finally:
        store.close()
        log.log.close()

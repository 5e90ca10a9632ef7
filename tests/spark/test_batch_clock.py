"""A pipeline whose clock steps back (aggregates/batch_clock.py), with real Spark on the embedded
stack: a pane the last commit dropped past the retention is not made again from a straggler the
stepped-back clock would have let in."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from aggregates.eventtime import BEYOND_RETENTION
from aggregates.pipeline import Pipeline
from api.app import create_app
from api.context import ApiContext
from tests.log_backends import ON_THE_EMBEDDED_STACK
from tests.spark.events import T0

pytestmark = [pytest.mark.spark, ON_THE_EMBEDDED_STACK]

STREAM = "http_requests"


def test_a_clock_stepped_back_does_not_make_again_a_pane_the_last_commit_dropped(tmp_path, demo_catalog, spark,
                                                                                    log_backend, store_backend):
    test_log = log_backend.new(tmp_path)
    log, store = test_log.open(demo_catalog), store_backend.create()
    retention = demo_catalog.streams[STREAM].retention
    now = {"ms": T0 + retention}  # an event at T0 + 1 s is within the retention

    def clock() -> float:
        return now["ms"] / 1000

    client = TestClient(create_app(ApiContext(catalog=demo_catalog, log=log, store=store, clock=clock)))
    config = test_log.pipeline_config(max_records_per_batch=1_000, max_records_per_task=1_000)
    pipeline = Pipeline(spark, demo_catalog, store_backend.reopen(store), config, clock=clock,
                        log=test_log.open(demo_catalog))

    def batch(at_ms: int, event_ms: int) -> None:
        now["ms"] = at_ms
        event = {"time": event_ms, "endpoint": "/api/cart", "method": "GET", "status": 200, "region": "eu",
                 "latency_ms": 5.0, "response_bytes": 1, "user_id": "u1"}
        answer = client.post(f"/api/v1/events?stream={STREAM}", content=json.dumps([event]),
                             headers={"content-type": "application/json"})
        assert answer.status_code == 200 and answer.json()["accepted"] == 1, answer.text
        pipeline.run_until_drained()

    pane = lambda: [p.data.count for p in store.read_panes(STREAM, T0, T0 + 10_000)]  # noqa: E731
    batch(T0 + retention, T0 + 1_000)
    assert pane() == [1]
    batch(T0 + retention + 20_000, T0 + retention + 19_000)  # the pane [T0, T0 + 10 s) is past the retention
    assert pane() == []
    batch(T0 + retention - 5_000, T0 + 2_000)  # the clock stepped back 25 s: T0 + 2 s looks within it
    assert pane() == []  # not made again with one event of its two
    letters = store.dead_letters(stream=STREAM)
    assert [(d.letter.reason, d.letter.event_time_ms) for d in letters] == [(BEYOND_RETENTION, T0 + 2_000)]
    progress = store.progress("main").streams[STREAM]
    assert (progress.events_read, progress.events_aggregated, progress.events_dead_lettered) == (3, 2, 1)
    store.close()
    log.close()

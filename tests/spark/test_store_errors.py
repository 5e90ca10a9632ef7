"""Disk full in the pipeline, with real Spark, the embedded log and a real SQLite store whose
file is capped with `PRAGMA max_page_count`: the batch's commit fails, is not recorded, is retried
with back-off while the health store and the API say so, and goes through exactly once when
there is room again (aggregates/commit_retry.py). SQLite only: the cap is SQLite's."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import pytest

from store.health import HealthStore
from tests.spark.events import assert_panes_exact, http_events
from tests.spark.test_pipeline import Service

pytestmark = [
    pytest.mark.spark,
    pytest.mark.parametrize(("log_backend", "store_backend"), [("embedded", "sqlite")], indirect=True,
                            scope="module"),
]


def test_a_full_store_is_retried_reported_and_committed_once_there_is_room(tmp_path, demo_catalog, spark,
                                                                            log_backend, store_backend):
    service = Service(log_backend.new(tmp_path), demo_catalog, spark, store_backend)
    events = http_events(3000, seed=7)
    service.post("http_requests", events)
    pipeline = service.pipeline()
    health = HealthStore(service.store.side_db())
    health.reserve_store_errors(pipeline.config.name)
    pipeline.health = service.ctx.health = health
    with running_on_a_full_store(pipeline, health, pipeline.config.name):
        assert service.store.last_batch_id(pipeline.config.name) is None  # nothing recorded
        status = service.client.get("/api/v1/pipeline").json()["health"]["store"]
        assert status["failing"] is True and "full" in status["message"]
        metrics = service.client.get("/metrics").text
        assert "sketchboard_pipeline_store_failing 1.0" in metrics
    state = health.store_errors(pipeline.config.name)
    assert state["failing"] is False and state["total"] >= 1
    assert service.store.last_batch_id(pipeline.config.name) == 0  # one batch, committed once
    assert_panes_exact(service.store, events)
    assert "sketchboard_pipeline_store_failing 0.0" in service.client.get("/metrics").text
    service.log.close()


@contextmanager
def running_on_a_full_store(pipeline, health: HealthStore, reported_as: str):
    """Cap the pipeline's own connection to the store file at its size, drain in a thread and
    enter once the store error is reported; at the end give room again and expect the run to
    finish without an error."""
    conn = pipeline.store._conn
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")
    failed: list[BaseException] = []

    def run() -> None:
        try:
            pipeline.run_until_drained()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failed.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    try:
        deadline = time.monotonic() + 240
        while not (health.store_errors(reported_as) or {}).get("failing"):
            assert worker.is_alive() and time.monotonic() < deadline, f"no store error reported; {failed}"
            time.sleep(0.2)
        yield
    finally:
        conn.execute(f"PRAGMA max_page_count = {pages * 100_000}")  # room again
        worker.join(240)
    assert not worker.is_alive() and failed == []


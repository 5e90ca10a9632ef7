"""`sketchboard pipeline` with every batch on the driver (a local master), on the embedded log and
on Kafka, serves with batches of its own and no Spark query (aggregates/driver_serving.py): a backlog and then each
new record aggregated as it comes, the query's health running (each batch, idle beats while it
waits), the checkpoint's logs purged as Spark purges them, and a stop that ends it cleanly; and a
session started only when a Spark query needs one (aggregates/spark.py `LazySpark`)."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

import pytest
import yaml

from aggregates.batch_gate import remove_listeners
from aggregates.checkpoint_moves import logged_batches
from aggregates.driver_serving import serve_on_driver
from aggregates.pipeline import Pipeline
from aggregates.spark import LazySpark
from sketchboard.live import run_pipeline
from sketchboard.wiring import build_pipeline
from store.health import query_health
from store.sqlite import SqlitePaneStore
from catalog import Catalog
from tests.spark.test_driver_drain import CATALOG, Log, counted, no_query, settings_for, small  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.spark]


def wait_until(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def live(settings, spark) -> tuple[threading.Thread, threading.Event, dict]:
    """`sketchboard pipeline`'s loop (sketchboard/live.py) running in a thread: its stop event, and
    its exit code in the dict once it ends."""
    stopping, ended = threading.Event(), {}
    thread = threading.Thread(target=lambda: ended.update(code=run_pipeline(settings, stopping, name="main",
                                                                            spark=spark)))
    thread.start()
    return thread, stopping, ended


def health_of(pipeline) -> dict:
    return query_health(pipeline.health, "main", int(time.time() * 1000))


@pytest.fixture
def each_log(tmp_path, log_backend):
    """`small` on each log backend (tests/log_backends.py: Kafka topics of the test's own), with
    the settings of a process on it."""
    test_log = log_backend.new(tmp_path / "data")
    config = tmp_path / "streams.yaml"
    config.write_text(yaml.safe_dump(CATALOG))
    catalog = Catalog(**CATALOG)
    log = Log(tmp_path / "data", catalog, test_log.open(catalog))
    yield tmp_path, config, catalog, log, test_log.settings()
    log.log.close()


@pytest.mark.parametrize("log_backend", ["embedded", pytest.param("kafka", marks=pytest.mark.kafka)], indirect=True,
                         scope="module")
def test_the_live_pipeline_serves_its_log_with_batches_of_its_own_no_query_and_no_session(each_log, spark,
                                                                                          monkeypatch):
    """On Kafka too: read by the pipeline's own consumer (ingest/kafka_source.py `read_kafka_rows`)."""
    tmp_path, config, catalog, log, backend = each_log
    monkeypatch.setattr(Pipeline, "start", no_query)
    # The tests' session stands for the JVM a start would make; Spark's purge keeps the last 3 batches.
    lazy = LazySpark("local[2]", lambda: spark, {"spark.sql.streaming.minBatchesToRetain": "3"})
    built = []

    def building(*args, **kwargs):
        built.append(build_pipeline(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr("sketchboard.wiring.build_pipeline", building)
    log.append("a", 100)  # a backlog: caught up in batches of 40 first
    settings = settings_for(tmp_path, config, trigger_interval="100 milliseconds", **backend)
    thread, stopping, ended = live(settings, lazy)
    try:
        wait_until(lambda: built and counted(built[0].store, "a") == 100)
        pipeline = built[0]
        for round_ in range(1, 7):  # then each few records as they come, in a batch of their own
            log.append("b", 5)
            wait_until(lambda: counted(pipeline.store, "b") == 5 * round_)
        checkpoint = Path(pipeline.config.checkpoint_dir)
        last = pipeline.store.last_batch_id("main")
        assert last >= 3 + 6 - 1  # 3 batches for the backlog, at least one per round
        # Spark's purge: the last minBatchesToRetain batches and the one before them kept (the store
        # commits a batch before its Spark commit file is written and the logs purged: waited for).
        kept = list(range(last - 3, last + 1))
        wait_until(lambda: logged_batches(checkpoint / "offsets") == logged_batches(checkpoint / "commits") == kept)
        health = health_of(pipeline)
        assert health["running"] and health["run_id"].startswith("own-") and health["batch_id"] == last
        assert health["query_id"] == json.loads((checkpoint / "metadata").read_text())["id"]
        assert not spark.streams.active and len(built) == 1
        assert not lazy.started  # no Spark at all: neither a query, nor a job, nor a session
    finally:
        stopping.set()
        thread.join(60)
    assert ended == {"code": 0}
    health = health_of(built[0])
    assert health["running"] is False and health["last_error"] is None


def test_a_serving_loop_waiting_for_records_beats_until_they_come(small, spark):
    tmp_path, config, catalog, log = small
    pipeline = build_pipeline(settings_for(tmp_path, config, trigger_interval="50 milliseconds"), spark, name="main")
    pipeline.start = no_query
    # A copy of the offsets (a consumer group's) that fails for its batch: made again while the
    # loop waits, not left failed until records come (a caught-up pipeline shown lagging).
    copied, refusals = [], [RuntimeError("the group's coordinator is loading")]

    def group_copy(batch_id, end_offsets, at_ms):
        if refusals:
            raise refusals.pop()
        copied.append(batch_id)

    pipeline.commit_listeners.append(group_copy)
    pipeline.copies.retry_every_s = 0.1
    stopping = threading.Event()
    thread = threading.Thread(target=serve_on_driver, args=(pipeline, stopping.is_set, stopping.wait),
                              kwargs={"idle_every_s": 0.2})
    thread.start()
    try:
        wait_until(lambda: (health_of(pipeline) or {}).get("last_idle_ms") is not None)
        first_beat = health_of(pipeline)["last_idle_ms"]
        wait_until(lambda: health_of(pipeline)["last_idle_ms"] > first_beat)  # beat after beat
        assert health_of(pipeline)["running"] and health_of(pipeline)["batch_id"] is None  # no batch: none to run
        log.append("a", 10)
        wait_until(lambda: counted(pipeline.store, "a") == 10)
        batch = pipeline.store.last_batch_id("main")
        wait_until(lambda: copied == [batch])  # its batch failed it; made while no batch ran
        assert pipeline.listener_failures == 1
    finally:
        stopping.set()
        thread.join(60)
    assert not thread.is_alive() and health_of(pipeline)["running"] is False


def test_a_lazy_session_starts_when_a_spark_query_needs_it_with_the_progress_listener_on_its_bus(small, spark):
    tmp_path, config, catalog, log = small
    # The tests' session stands for the JVM a start would make; Spark's purge keeps the last 3 batches.
    lazy = LazySpark("local[2]", lambda: spark, {"spark.sql.streaming.minBatchesToRetain": "3"})
    log.append("a", 30)
    pipeline = build_pipeline(settings_for(tmp_path, config, driver_batch_rows=0), lazy, name="main")  # via Spark
    try:
        assert not lazy.started  # building it, its listener asked for: nothing started
        pipeline.run_until_drained()
        assert lazy.started and counted(pipeline.store, "a") == 30
        # Spark's query's own events reached the recorder: it was on the bus before the query started.
        assert pipeline.progress_recorder.settle(60)  # the bus is asynchronous: its last events delivered
        health = health_of(pipeline)
        assert not health["run_id"].startswith("own-") and health["batch_id"] is not None, health
    finally:
        remove_listeners(lazy, [pipeline.progress_recorder])


def test_a_stop_ends_a_commit_that_waits_a_failing_store_out(small, spark, monkeypatch):
    tmp_path, config, catalog, log = small
    tries = []

    def failing(self, *args, **kwargs):
        tries.append(time.monotonic())
        raise sqlite3.OperationalError("disk I/O error")  # transient: retried with back-off until it passes

    monkeypatch.setattr(SqlitePaneStore, "commit_batch", failing)
    log.append("a", 10)
    settings = settings_for(tmp_path, config, trigger_interval="100 milliseconds")
    thread, stopping, ended = live(settings, spark)
    try:
        wait_until(lambda: len(tries) >= 3)  # waiting the store out, with a back-off of seconds by now
    finally:
        stopping.set()
        asked = time.monotonic()
        thread.join(60)
    # The stop closes the batch gate: the retry gives up within the watcher's beat, not the back-off.
    assert ended == {"code": 0} and time.monotonic() - asked < 5
    monkeypatch.undo()
    store = SqlitePaneStore(Path(settings.data_dir) / "store.db")
    try:
        assert store.last_batch_id("main") is None  # nothing of the batch recorded: it runs again at the next start
    finally:
        store.close()


@pytest.mark.parametrize("log_backend", [pytest.param("kafka", marks=pytest.mark.kafka)], indirect=True, scope="module")
def test_a_broker_away_is_waited_out_by_the_live_loop_on_kafka(each_log, spark, kafka_broker, monkeypatch):
    """The own batches on Kafka: a broker that stops answers nothing the loop can read (offsets,
    records), and the loop tries again until it is back, as Spark's Kafka source waits it out."""
    tmp_path, config, catalog, log, backend = each_log
    monkeypatch.setattr(Pipeline, "start", no_query)
    built = []

    def building(*args, **kwargs):
        built.append(build_pipeline(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr("sketchboard.wiring.build_pipeline", building)
    log.append("a", 10)
    settings = settings_for(tmp_path, config, trigger_interval="100 milliseconds", kafka_request_timeout="2s",
                            **backend)
    thread, stopping, ended = live(settings, LazySpark("local[2]", lambda: spark))
    try:
        wait_until(lambda: built and counted(built[0].store, "a") == 10)
        kafka_broker.stop()
        try:
            time.sleep(6)  # triggers that cannot read the offsets: each fails after the 2 s request timeout
            assert thread.is_alive() and not ended
        finally:
            kafka_broker.start()
        log.append("b", 5)
        wait_until(lambda: counted(built[0].store, "b") == 5, 120)
        assert len(built) == 1  # the same pipeline, never restarted
    finally:
        stopping.set()
        thread.join(60)
    assert ended == {"code": 0}

"""Lag sampling over a real SQLite log and pane store, the lag and health stores, the
kafka-lag-exporter interpolation, the lag feed and the query health object."""

from __future__ import annotations

import pytest

from ingest.events import EventValidator
from ingest.log import SqliteEventLog
from lag.feed import LagFeed
from store.health import query_health
from store.lag import LagSample, LagStatus, LagStore
from lag.report import LagMonitor
from lag.sampler import LagSampler
from lag.sources import EventLogLagSource, OffsetTimeTable, StoreCommitted
from store import BatchCommit
from store.health import HealthStore
from tests.support.clock import FakeClock

T0_S = 1_800_000_000.0


@pytest.fixture
def parts(tmp_path, demo_catalog, store_backend):
    log = SqliteEventLog(tmp_path / "log.db", synchronous="OFF")
    for stream in demo_catalog.streams.values():
        log.ensure_topic(stream)
    store = store_backend.create()  # the pane and lag stores of each backend (tests/store_backends.py)
    lag_store = LagStore(store.side_db(), retention_ms=60_000)
    clock = FakeClock(T0_S)
    sampler = LagSampler(EventLogLagSource(log), StoreCommitted(store, "main"), lag_store, pipeline="main",
                         streams=list(demo_catalog.streams), interval_s=1.0, clock=clock)
    monitor = LagMonitor(lag_store, "main", lambda: [(n, p) for n in demo_catalog.streams
                                                      for p in log.offsets(n)],
                         window=3, interval_s=1.0, clock=clock, sampler=sampler)
    yield log, store, lag_store, sampler, monitor, clock
    lag_store.close()
    log.close()


def append(log, catalog, n: int, now_ms: int, stream="orders"):
    validator = EventValidator(catalog.streams[stream])
    events = [validator.validate({"time": now_ms, "customer_id": f"c{i}"}) for i in range(n)]
    return log.append(catalog.streams[stream], events, now_ms)


def test_ingest_time_at_an_offset(tmp_path, demo_catalog):
    log = SqliteEventLog(tmp_path / "log.db", synchronous="OFF")
    log.ensure_topic(demo_catalog.streams["orders"])
    validator = EventValidator(demo_catalog.streams["orders"])
    stream = demo_catalog.streams["orders"]
    log.append(stream, [validator.validate({"time": 1, "customer_id": "same"})] * 3, 1_000)
    log.append(stream, [validator.validate({"time": 1, "customer_id": "same"})] * 2, 2_000)
    (p,) = [p for p, o in log.offsets("orders").items() if o.end]
    assert [log.ingest_time_ms("orders", p, o) for o in range(6)] == [1_000] * 3 + [2_000] * 2 + [None]
    assert log.ingest_time_ms("orders", 1 - p, 0) is None
    log.close()


def test_sampler_measures_lag_in_events_and_exact_seconds(parts, demo_catalog):
    log, store, lag_store, sampler, monitor, clock = parts
    t0 = int(clock.now * 1000)
    append(log, demo_catalog, 10, t0 - 5_000)
    append(log, demo_catalog, 6, t0 - 1_000)
    samples = sampler.sample_and_store()
    assert len(samples) == sum(s.partitions for s in demo_catalog.streams.values())  # one per partition
    orders = [s for s in samples if s.stream == "orders"]
    assert sum(s.lag_events for s in orders) == 16
    for s in orders:
        assert s.committed is None and s.last_commit_ms is None and s.at_ms == t0
        # the oldest unprocessed record of a partition with data is 5 s old (exact ingest time)
        assert s.lag_ms == (5_000 if s.lag_events else 0)

    ends = {p: o.end for p, o in log.offsets("orders").items()}
    store.commit_batch(BatchCommit("main", 0, [], 16, {}, {"orders": ends}), lateness_ms={}, now_ms=t0)
    clock.now += 1
    after = [s for s in sampler.sample_and_store() if s.stream == "orders"]
    assert all(s.lag_events == 0 and s.lag_ms == 0 and s.committed == ends[s.partition] for s in after)
    assert all(s.last_commit_ms == t0 for s in after)


def test_lag_store_window_series_and_retention(parts, demo_catalog):
    log, store, lag_store, sampler, monitor, clock = parts
    for _ in range(5):
        append(log, demo_catalog, 3, int(clock.now * 1000))
        sampler.sample_and_store()
        clock.now += 1
    recent = lag_store.recent("main", 3)
    assert set(recent) == {(name, p) for name, s in demo_catalog.streams.items() for p in range(s.partitions)}
    assert all(len(v) == 3 for v in recent.values())
    assert [s.at_ms for s in recent[("orders", 0)]] == [int((T0_S + i) * 1000) for i in (2, 3, 4)]
    series = lag_store.series("main", int(T0_S * 1000), int((T0_S + 10) * 1000), stream="orders")
    assert len(series) == 10 and {s.stream for s in series} == {"orders"}
    assert lag_store.series("main", 0, 1) == []
    # The growing, never-committed lag with a full window: STOP.
    report = monitor.report()
    assert report.streams["orders"].verdict.status == LagStatus.STOP
    assert report.streams["orders"].lag_events == 15
    # Retention: a round 2 minutes later prunes everything older than 60 s.
    clock.now += 120
    sampler.sample_and_store()
    assert {len(v) for v in lag_store.recent("main", 10).values()} == {1}


def test_monitor_status_is_err_when_the_sampler_stopped(parts, demo_catalog):
    log, store, lag_store, sampler, monitor, clock = parts
    sampler.sample_and_store()
    assert monitor.report().verdict.status == LagStatus.OK
    clock.now += 10
    report = monitor.report()
    assert report.verdict.status == LagStatus.ERR and "sampler is not running" in report.verdict.reason


def test_lag_feed_sends_one_message_per_round(parts, demo_catalog):
    log, store, lag_store, sampler, monitor, clock = parts
    feed = LagFeed(monitor)
    assert feed.topic == "lag" and feed.poll() == []
    append(log, demo_catalog, 4, int(clock.now * 1000) - 2_000)
    sampler.sample_and_store()
    (message,) = feed.poll()
    assert message["type"] == "lag" and message["pipeline"] == "main"
    assert message["lag_events"] == 4 and message["lag_seconds"] == 2.0
    assert message["status"] == "OK" and message["streams"]["orders"]["lag_events"] == 4
    assert set(message["streams"]["orders"]["partitions"]) == {"0", "1"}
    assert feed.poll() == []
    clock.now += 1
    sampler.sample_and_store()
    assert len(feed.poll()) == 1


def test_lag_feed_says_err_when_the_sampler_stops(parts, demo_catalog):
    """The feed sent only on a new round, and a stopped sampler writes none: GET /api/v1/lag and
    /metrics said ERR while the dashboard (which reads only the feed) kept its last OK."""
    log, store, lag_store, sampler, monitor, clock = parts
    feed = LagFeed(monitor)
    sampler.sample_and_store()
    (message,) = feed.poll()
    assert message["status"] == "OK"
    sent = []
    for _ in range(20):  # 10 s with no round, looked at every half second
        clock.now += 0.5
        sent += feed.poll()
    assert [m["status"] for m in sent] == ["ERR"]  # once, when it turned ERR (its reason's age changes: not again)
    assert "the sampler is not running" in sent[0]["reason"]
    sampler.last_error = "database is locked"  # the sampler's error changed: the feed says so
    clock.now += 1
    (message,) = feed.poll()
    assert (message["status"], message["sampler_error"]) == ("ERR", "database is locked")
    assert feed.poll() == []


def test_lag_feed_message_has_the_rest_bodys_keys_but_the_series(parts, demo_catalog):
    """docs/lag.md: the websocket message has the same body as GET /api/v1/lag without the series;
    it lacked `window` and `sampler_error`."""
    log, store, lag_store, sampler, monitor, clock = parts
    sampler.sample_and_store()
    (message,) = LagFeed(monitor).poll()
    assert message["window"] == {"samples": 3, "interval_seconds": 1.0, "seconds": 3.0}
    assert "sampler_error" in message and message["sampler_error"] is None


def test_sampler_thread_samples_on_its_interval_and_survives_errors(parts, demo_catalog):
    log, store, lag_store, sampler, monitor, clock = parts
    import time

    sampler.interval_s = 0.05
    sampler.clock = time.time
    sampler.start()
    deadline = time.monotonic() + 5
    while sampler.rounds < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sampler.rounds >= 3
    store.close()  # the committed offsets cannot be read now
    time.sleep(0.2)
    sampler.stop()
    assert sampler.last_error and "closed" in sampler.last_error


# -- interpolation (backends without ingest times) -------------------------------------


def test_offset_time_table_interpolates_like_kafka_lag_exporter():
    t = OffsetTimeTable()
    assert t.written_at_ms(5) is None and t.lag_ms(0, 10, 1_000) is None
    t.add(100, 10_000)
    t.add(100, 11_000)  # no new records: the first time the end was 100 is kept
    t.add(200, 20_000)
    assert t.points[0] == (100, 10_000)
    assert t.written_at_ms(149) == 15_000  # record 149 is the 50th of 100 written in [10 s, 20 s]
    assert t.written_at_ms(199) == 20_000
    assert t.written_at_ms(50) == 10_000  # before the first point: a lower bound on its age
    assert t.lag_ms(149, 200, 25_000) == 10_000
    assert t.lag_ms(200, 200, 25_000) == 0
    t.add(50, 30_000)  # the log went back: start over
    assert list(t.points) == [(50, 30_000)]


class NoIngestTimes:
    """A backend that knows end offsets only (as Kafka would, without fetching records)."""

    def __init__(self, log):
        self.log = log

    def end_offsets(self, stream):
        return self.log.offsets(stream)

    def ingest_time_ms(self, stream, partition, offset):
        return None


def test_sampler_interpolates_when_the_source_has_no_ingest_times(parts, demo_catalog):
    log, store, lag_store, _, monitor, clock = parts
    sampler = LagSampler(NoIngestTimes(log), StoreCommitted(store, "main"), lag_store, pipeline="main",
                         streams=["orders"], interval_s=1.0, clock=clock)
    sampler.sample_and_store()  # empty log at t0
    append(log, demo_catalog, 10, int(clock.now * 1000))
    clock.now += 10
    samples = sampler.sample_and_store()
    busy = [s for s in samples if s.lag_events]
    assert busy and all(s.lag_ms is not None and 0 < s.lag_ms <= 10_000 for s in busy)


# -- Spark progress in the health store ---------------------------------------------


def test_health_store_lifecycle_and_query_health(store_backend):
    health = HealthStore(store_backend.side_db(), retention_ms=60_000)
    t = 1_800_000_000_000
    assert health.state("main") is None and query_health(health, "main", t) is None
    health.started("main", "q1", "r1", "sketchboard-main", t)
    progress = {"batchId": 3, "numInputRows": 500, "inputRowsPerSecond": 250.0, "processedRowsPerSecond": 1000.0,
                "batchDuration": 500, "durationMs": {"addBatch": 400, "triggerExecution": 500},
                "eventTime": {}, "stateOperators": []}
    health.progress("main", "r1", 3, progress, t + 1_000)
    q = query_health(health, "main", t + 2_000)
    assert q["running"] and not q["stale"] and q["batch_id"] == 3
    assert q["input_rows_per_second"] == 250.0 and q["processed_rows_per_second"] == 1000.0
    assert q["batch_duration_ms"] == 500 and q["duration_ms"]["addBatch"] == 400
    assert q["watermark"] is None and q["rows_dropped_by_watermark"] == 0 and q["last_error"] is None
    # silent for longer than the staleness limit: not running (a killed process sends nothing)
    assert query_health(health, "main", t + 60_000)["running"] is False
    health.idle("main", "r1", t + 59_000)
    assert query_health(health, "main", t + 60_000)["running"] is True
    # a late terminated event of an older run changes nothing
    health.terminated("main", "r0", "old failure", t + 59_500)
    assert health.state("main").running
    health.terminated("main", "r1", "[BOOM] it failed", t + 60_000)
    q = query_health(health, "main", t + 61_000)
    assert q["running"] is False and q["last_error"] == "[BOOM] it failed" and q["terminated_at_ms"] == t + 60_000
    # a new run clears the error
    health.started("main", "q1", "r2", "sketchboard-main", t + 70_000)
    assert query_health(health, "main", t + 70_000)["last_error"] is None
    assert [p["batchId"] for p in health.history("main", 0, t + 100_000)] == [3]
    health.progress("main", "r2", 4, {**progress, "batchId": 4}, t + 200_000)  # prunes batch 3 (retention 60 s)
    assert [p["batchId"] for p in health.history("main", 0, t + 300_000)] == [4]
    health.close()


def test_progress_of_a_batch_read_on_the_driver_reports_the_pipeline_s_input_rows():
    """A small batch of the embedded log is read on the driver and Spark's DataFrame never runs:
    Spark's progress says 0 input rows, the pipeline's count replaces it with the rates Spark derives."""
    from aggregates.progress import with_input_rows

    spark_says = {"batchId": 7, "timestamp": "2026-11-24T10:00:01.000Z", "numInputRows": 0,
                  "inputRowsPerSecond": 0.0, "processedRowsPerSecond": 0.0,
                  "durationMs": {"addBatch": 150, "triggerExecution": 250},
                  "sources": [{"description": "sketchboard_log", "numInputRows": 0, "inputRowsPerSecond": 0.0,
                               "processedRowsPerSecond": 0.0}]}
    out = with_input_rows(spark_says, 60, 500)
    assert out["numInputRows"] == 60 and out["inputRowsPerSecond"] == 120.0 and out["processedRowsPerSecond"] == 240.0
    assert out["sources"] == [{"description": "sketchboard_log", "numInputRows": 60, "inputRowsPerSecond": 120.0,
                               "processedRowsPerSecond": 240.0}]
    assert out["durationMs"] == spark_says["durationMs"] and spark_says["numInputRows"] == 0  # a copy
    # a run's first trigger: no previous start, Spark's own input rate stays
    assert with_input_rows(spark_says, 60, None)["inputRowsPerSecond"] == 0.0


def test_retention_must_be_positive(tmp_path):
    with pytest.raises(ValueError):
        LagStore(tmp_path / "x.db", retention_ms=0)
    with pytest.raises(ValueError):
        LagSampler(None, None, None, pipeline="main", streams=[], interval_s=0)


def test_samples_round_trip(parts):
    _, _, lag_store, _, _, _ = parts
    s = LagSample("main", "orders", 1, 5, 0, 10, None, None, None)
    lag_store.write([s])
    assert lag_store.recent("main", 5) == {("orders", 1): [s]}


def test_lag_settings_defaults_and_durations(tmp_path, monkeypatch):
    from sketchboard.settings import Settings

    monkeypatch.chdir(tmp_path)
    for name in ("SKETCHBOARD_SETTINGS_FILE", "SKETCHBOARD_LAG_SAMPLE_INTERVAL", "SKETCHBOARD_LAG_WINDOW",
                 "SKETCHBOARD_LAG_RETENTION", "SKETCHBOARD_LOG_RETENTION"):
        monkeypatch.delenv(name, raising=False)
    s = Settings()
    # Duration defaults are spelled with units: a bare number would be read as seconds.
    assert (s.lag_sample_interval, s.lag_window, s.lag_retention) == (2_000, 10, 86_400_000)
    assert s.log_retention == 7 * 86_400_000
    assert Settings(lag_sample_interval="500ms").lag_sample_interval == 500
    with pytest.raises(ValueError):
        Settings(lag_window=0)
    with pytest.raises(ValueError):  # one sample: its first is its last, a moving pipeline read STALL
        Settings(lag_window=1)


def test_a_query_ended_by_a_batch_refused_while_stopping_is_recorded_as_a_clean_stop(store_backend):
    """A stop closes the batch gate, then stops the query: a batch that begins in between is refused
    (aggregates/batch_gate.py `Stopping`), and Spark ends the query with that refusal as its
    exception. The health must say stopped, with no error (a fresh clone's browser lag scenario
    saw `last_error` set to it); any other exception stays the query's last error."""
    from types import SimpleNamespace

    from aggregates.progress import ProgressRecorder

    health = HealthStore(store_backend.side_db(), retention_ms=60_000)
    t = 1_800_000_000_000
    recorder = ProgressRecorder(health, "main", "sketchboard-main", clock=lambda: t / 1000)
    refused = ("py4j.Py4JException: An exception was raised by the Python Proxy. Return Message: Traceback ...\n"
               "aggregates.batch_gate.Stopping: batch 7 not processed: the pipeline is stopping\n")
    for run, exception, want in (("r1", refused, None), ("r2", "java.lang.RuntimeException: boom", "[BOOM] "
                                                         "java.lang.RuntimeException: boom")):
        recorder.onQueryStarted(SimpleNamespace(name="sketchboard-main", id="q1", runId=run, timestamp=None))
        recorder.onQueryTerminated(SimpleNamespace(runId=run, exception=exception,
                                                   errorClassOnException="FOREACH_BATCH_USER_FUNCTION_ERROR"
                                                   if run == "r1" else "BOOM"))
        q = query_health(health, "main", t)
        assert q["running"] is False and q["last_error"] == want and q["terminated_at_ms"] == t, q
    health.close()


def _run_record(run_id: str, stream: str, at_ms: int):
    from store.definitions import ReprocessRun

    return ReprocessRun(id=run_id, stream=stream, version="0123abcd" * 8, definition={}, state="running", error=None,
                        started_at_ms=at_ms, updated_at_ms=at_ms, complete_from_ms=at_ms, start_offsets={},
                        target_offsets={})


def demo_log_and_store(tmp_path, demo_catalog, store_backend):
    """An embedded log with every demo stream's topic, a store, a clock at T0_S and its now in ms."""
    log = SqliteEventLog(tmp_path / "log.db", synchronous="OFF")
    for stream in demo_catalog.streams.values():
        log.ensure_topic(stream)
    clock = FakeClock(T0_S)
    return log, store_backend.create(), clock, int(clock.now * 1000)


def test_a_reprocessing_run_is_sampled_and_judged_on_the_streams_it_reads_only(tmp_path, demo_catalog,
                                                                                store_backend):
    """A caught-up run of `orders` (docs/reprocessing.md: it shows in the lag's consumers like any
    named pipeline) was sampled on every stream: on those it never reads, its lag was their whole
    log and its status STOP, in GET /api/v1/lag's consumers and /metrics alike. Through the API's
    own wiring (sketchboard/wiring.py build_lag_monitor)."""
    from sketchboard.settings import Settings
    from sketchboard.wiring import build_lag_monitor
    from store.consumers import ConsumerRegistry
    from store.definitions import DefinitionStore

    log, store, clock, now_ms = demo_log_and_store(tmp_path, demo_catalog, store_backend)
    append(log, demo_catalog, 6, now_ms)
    logins = demo_catalog.streams["logins"]
    log.append(logins, [EventValidator(logins).validate({"time": now_ms, "user_id": f"u{i}"}) for i in range(4)],
               now_ms)
    ends = {p: o.end for p, o in log.offsets("orders").items()}
    monitor = build_lag_monitor(Settings(data_dir=tmp_path, lag_sample_interval="1s", lag_window=3), demo_catalog,
                                log, store, clock=clock)
    registry, definitions = ConsumerRegistry(store.side_db()), DefinitionStore(store.side_db())
    caught_up, starting = "reprocess-orders-0123abcd", "reprocess-logins-0123abcd"
    for run, stream in ((caught_up, "orders"), (starting, "logins")):
        registry.register(run, run, "earliest", now_ms)
        definitions.start_run(_run_record(run, stream, now_ms))
    registry.record_commit(caught_up, 0, now_ms, {"orders": ends})  # the run's copy of its offsets
    for _ in range(6):
        samples = monitor.sampler.sample_and_store()
        clock.now += 1

    assert {s.stream for s in samples if s.pipeline == caught_up} == {"orders"}
    assert {s.stream for s in samples if s.pipeline == starting} == {"logins"}  # its stream, before any commit
    assert {s.stream for s in samples if s.pipeline == "main"} == set(demo_catalog.streams)
    consumers = {c["name"]: c for c in monitor.consumers()}
    assert set(consumers[caught_up]["streams"]) == {"orders"}
    assert (consumers[caught_up]["status"], consumers[caught_up]["lag_events"]) == ("OK", 0)
    assert set(consumers[starting]["streams"]) == {"logins"} and consumers[starting]["lag_events"] == 4
    assert monitor.report(pipeline=caught_up).verdict.status == LagStatus.OK  # /metrics' status code
    # Asked about one stream: the consumers that read it (the serving pipeline reads every one).
    assert [c["name"] for c in monitor.consumers("orders")] == ["main", caught_up]
    for closing in (registry, definitions, monitor.store, log):
        closing.close()


def test_a_round_reads_the_registry_once_and_samples_each_consumer_as_read_alone(tmp_path, demo_catalog, store_backend,
                                                                                 monkeypatch):
    """A round read each consumer's offsets, start and (from a listing of every consumer) commit
    time on its own: ~0.8 s a round at 400 consumers, most of it listing the registry once per
    consumer. Read at once now (lag.sources.registry_committed), through the API's wiring; the
    samples are those read one consumer at a time (RegistryCommitted)."""
    from lag.sources import RegistryCommitted, registry_committed
    from sketchboard.settings import Settings
    from sketchboard.wiring import build_lag_monitor
    from store.consumers import ConsumerRegistry
    from store.definitions import DefinitionStore
    from store.namespace import ROOT

    log, store, clock, now_ms = demo_log_and_store(tmp_path, demo_catalog, store_backend)
    append(log, demo_catalog, 8, now_ms - 3_000)
    append(log, demo_catalog, 4, now_ms - 1_000)
    ends = {p: o.end for p, o in log.offsets("orders").items()}
    registry, definitions = ConsumerRegistry(store.side_db()), DefinitionStore(store.side_db())
    registry.register("main", ROOT, "earliest", now_ms)
    for i, name in enumerate(("audit", "late", "idle", "reprocess-orders-0123abcd")):
        registry.register(name, name, "latest" if name == "late" else "earliest", now_ms + i)
    registry.record_commit("audit", 2, now_ms - 500, {"orders": {p: e // 2 for p, e in ends.items()}})
    registry.record_start("late", {"orders": ends})
    registry.record_commit("reprocess-orders-0123abcd", 1, now_ms, {"orders": ends})
    definitions.start_run(_run_record("reprocess-orders-0123abcd", "orders", now_ms))
    monitor = build_lag_monitor(Settings(data_dir=tmp_path, lag_sample_interval="1s", lag_window=3), demo_catalog,
                                log, store, clock=clock)
    assert registry_committed(registry) == {c.pipeline: RegistryCommitted(registry, c.pipeline).committed()
                                            for c in registry.consumers()}
    listings = []
    listed = ConsumerRegistry.consumers
    monkeypatch.setattr(ConsumerRegistry, "consumers", lambda self: listings.append(1) or listed(self))
    samples = monitor.sampler.sample()
    assert len(listings) == 1  # once a round, not once per consumer
    one_by_one = LagSampler(monitor.sampler.source, monitor.sampler.committed, monitor.store, pipeline="main",
                            streams=list(demo_catalog.streams), clock=clock, reads=monitor.sampler.reads,
                            others=lambda: {c.pipeline: RegistryCommitted(registry, c.pipeline)
                                            for c in listed(registry) if c.pipeline != "main"})
    assert samples == one_by_one.sample()
    assert {s.pipeline for s in samples} == {"main", "audit", "late", "idle", "reprocess-orders-0123abcd"}
    for closing in (registry, definitions, monitor.store, log):
        closing.close()


def test_consumers_at_one_offset_share_one_ingest_time_lookup(parts, demo_catalog):
    """Each sample behind the log's end looked up the ingest time at its position (a query on the
    embedded log), once per consumer: those at one offset share it in a round, with the same lag."""
    from lag.sources import Committed, EventLogLagSource

    log, store, lag_store, sampler, monitor, clock = parts
    t0 = int(clock.now * 1000)
    append(log, demo_catalog, 10, t0 - 5_000)
    append(log, demo_catalog, 6, t0 - 1_000)
    ends = {p: o.end for p, o in log.offsets("orders").items()}
    assert any(end > 2 for end in ends.values())
    lookups = []

    class Counting(EventLogLagSource):
        def ingest_time_ms(self, stream, partition, offset):
            lookups.append((stream, partition, offset))
            return super().ingest_time_ms(stream, partition, offset)

    class Fixed:
        def __init__(self, offsets):
            self.read = Committed({"orders": offsets}, t0)

        def committed(self):
            return self.read

    sampler.source = Counting(log)
    at_two = {p: 2 for p in ends}
    sampler.others = lambda: {"a": Fixed(at_two), "b": Fixed(at_two), "c": Fixed(ends)}
    samples = [s for s in sampler.sample() if s.stream == "orders"]
    # main at the log's start, a and b at 2, c caught up: one lookup per partition and offset.
    assert sorted(lookups) == sorted([("orders", p, 0) for p in ends if ends[p] > 0]
                                     + [("orders", p, 2) for p in ends if ends[p] > 2])
    by = {(s.pipeline, s.partition): s for s in samples}
    for p, end in ends.items():
        age = {at: t0 - log.ingest_time_ms("orders", p, at) if end > at else 0 for at in (0, 2)}
        assert by[("a", p)].lag_ms == by[("b", p)].lag_ms == age[2] and by[("main", p)].lag_ms == age[0]
        assert by[("c", p)].lag_ms == 0


def test_series_and_consumers_break_ties_by_name_in_code_point_order_whatever_the_collation(store_backend):
    """Samples of one round share their instant, consumers may share theirs: the ties followed
    PostgreSQL's collation (linguistic on a deployment: 'orders' before 'Payments')."""
    from store.consumers import ConsumerRegistry

    store = store_backend.create(linguistic=True)
    lag_store = LagStore(store.side_db(), retention_ms=60_000)
    t = int(T0_S * 1000)
    names = ["orders", "Payments", "_audit", "émails"]
    lag_store.write([LagSample("main", name, 0, t, 0, 10, 5, t) for name in names])
    assert [s.stream for s in lag_store.series("main", 0, t + 1)] == sorted(names)
    registry = ConsumerRegistry(store.side_db())
    for name in names:
        registry.register(name, f"ns-{len(name)}-{ord(name[0])}", "earliest", now_ms=t)
    assert [c.pipeline for c in registry.consumers()] == sorted(names)
    lag_store.close()
    registry.close()


def test_retention_prunes_the_samples_of_a_consumer_that_is_gone(store_backend):
    """Every write pruned only the pipelines in its round: a dropped reprocessing run's samples
    (its registry entry forgotten, so never sampled again) were kept forever."""
    store = store_backend.create()
    lag_store = LagStore(store.side_db(), retention_ms=60_000)
    t = int(T0_S * 1000)
    lag_store.write([LagSample(p, "orders", 0, t, 0, 10, 5, t) for p in ("main", "reprocess-orders-0123abcd")])
    assert lag_store.write([LagSample("main", "orders", 0, t + 120_000, 0, 10, 10, t)]) == 2
    assert lag_store.newest_at_ms("reprocess-orders-0123abcd") is None
    assert [s.at_ms for s in lag_store.series("main", 0, t + 200_000)] == [t + 120_000]
    lag_store.close()


def test_a_sampler_stopped_mid_round_is_never_two_when_started_again():
    """stop() gave up after its join timeout and dropped the thread; start() then ran a second
    one beside the first (a lease lost and won again while the brokers were slow)."""
    import threading
    import time

    release, entered, samplers = threading.Event(), threading.Event(), set()

    class Slow(LagSampler):
        def sample_and_store(self):
            samplers.add(threading.get_ident())
            entered.set()
            release.wait(5)
            return []

    sampler = Slow(source=None, committed=None, sink=None, pipeline="main", streams=[], interval_s=0.05)
    sampler.start()
    assert entered.wait(5)
    sampler.stop(timeout_s=0.1)  # the round is still running
    starter = threading.Thread(target=sampler.start)
    starter.start()
    time.sleep(0.2)
    assert [t.name for t in threading.enumerate()].count("lag-sampler") == 1
    release.set()  # the slow round ends; start() then runs the new thread
    starter.join(5)
    time.sleep(0.2)
    assert [t.name for t in threading.enumerate()].count("lag-sampler") == 1
    sampler.stop()
    assert not any(t.name == "lag-sampler" for t in threading.enumerate())


def test_a_sampling_round_that_outlives_the_lease_writes_nothing(parts):
    """The sampler asks the lease right before each write (sketchboard/leader.py's lead())."""
    from sketchboard.leader import lead

    _, _, lag_store, sampler, _, _ = parts
    written, leading = [], {"now": False}

    class Sink:
        def write(self, samples):
            written.append(samples)

    sampler.sink = Sink()
    lead(type("Lease", (), {"leading": lambda self: leading["now"]})(), sampler=sampler)
    assert sampler.sample_and_store() and written == [] and sampler.rounds == 0
    leading["now"] = True
    sampler.sample_and_store()
    assert len(written) == 1 and sampler.rounds == 1


def test_a_replica_with_a_clock_ahead_of_the_samplers_judges_samples_on_the_samplers_clock(parts, demo_catalog):
    """A non-leader whose wall clock is 60 s ahead of the leader's called the leader's fresh samples
    stale (ERR): staleness is now measured from the newest sample on this replica's monotonic clock."""
    log, store, lag_store, sampler, leader_monitor, clock = parts
    mono = FakeClock(500.0)
    sampler.active = lambda: False  # this replica does not lead: another process's sampler writes
    ahead = LagMonitor(lag_store, "main", leader_monitor.partitions, window=3, interval_s=1.0,
                       clock=lambda: clock.now + 60, sampler=sampler, monotonic=mono)
    sampler.sink.write(sampler.sample())  # the leader's round, on its own clock
    assert ahead.report().verdict.status == LagStatus.OK
    for _ in range(5):  # the leader keeps sampling
        clock.now += 1
        mono.now += 1
        sampler.sink.write(sampler.sample())
        assert ahead.report().verdict.status == LagStatus.OK
    mono.now += 2.9  # the leader's sampler stops: stale a window after the last new sample was seen
    assert ahead.report().verdict.status == LagStatus.OK
    mono.now += 0.2
    report = ahead.report()
    assert report.verdict.status == LagStatus.ERR and "sampler is not running" in report.verdict.reason
    sampler.active = lambda: True  # this replica leads: its own sampler's clock is its own
    assert ahead.report().verdict.status == LagStatus.ERR  # 60 s ahead of what its sampler wrote: stale


def test_a_pipeline_started_from_the_logs_end_is_caught_up_there_before_its_first_commit(tmp_path, demo_catalog,
                                                                                           store_backend):
    """A pipeline started `--from latest` that had read nothing new had no committed offset, so
    its position was the log's start: the whole log before its start was its lag, and its status
    STOP. Its pinned start, recorded in the consumer registry, is its position until it commits."""
    from lag.sources import RegistryCommitted
    from store.consumers import ConsumerRegistry
    from store.namespace import ROOT

    log = SqliteEventLog(tmp_path / "log.db", synchronous="OFF")
    log.ensure_topic(demo_catalog.streams["orders"])
    store = store_backend.create()
    registry = ConsumerRegistry(store.side_db())
    lag_store = LagStore(store.side_db(), retention_ms=60_000)
    clock = FakeClock(T0_S)
    append(log, demo_catalog, 6, int(clock.now * 1000) - 5_000)
    ends = {"orders": {p: o.end for p, o in log.offsets("orders").items()}}
    for name, namespace in (("main", ROOT), ("late", "late")):
        registry.register(name, namespace, "latest", int(clock.now * 1000))
        registry.record_start(name, ends)
    registry.record_start("late", {"orders": {0: 0}})  # a pinned start never changes: the first is kept
    assert registry.starts("late") == ends
    sampler = LagSampler(EventLogLagSource(log), StoreCommitted(store, "main", registry), lag_store, pipeline="main",
                         streams=["orders"], interval_s=1.0, clock=clock,
                         others=lambda: {"late": RegistryCommitted(registry, "late")})
    monitor = LagMonitor(lag_store, "main", lambda: [("orders", p) for p in log.offsets("orders")], window=3,
                         interval_s=1.0, clock=clock, sampler=sampler, registry=registry)
    for _ in range(4):
        sampler.sample_and_store()
        clock.now += 1
    for name in ("main", "late"):
        report = monitor.report(pipeline=name)
        assert (report.verdict.status, report.lag_events) == (LagStatus.OK, 0), report.verdict.reason
    append(log, demo_catalog, 3, int(clock.now * 1000))  # what came after its start is its lag
    sampler.sample_and_store()
    assert monitor.report(pipeline="late").lag_events == 3
    registry.record_commit("late", 0, int(clock.now * 1000), {"orders": {0: 0}})  # a commit takes over
    assert RegistryCommitted(registry, "late").committed().offsets["orders"][0] == 0
    registry.forget("late")
    assert registry.starts("late") == {}
    for closing in (registry, lag_store, log):
        closing.close()


def test_rounds_are_ordered_by_write_order_not_by_the_writers_clock(parts, demo_catalog):
    """After a leader failover to a replica whose clock is behind, the old leader's rounds were
    the newest by at_ms: lag froze at its numbers, and the feed sent nothing, for as long as the
    clock gap."""
    log, store, lag_store, sampler, monitor, clock = parts
    old_leader = LagSampler(EventLogLagSource(log), StoreCommitted(store, "main"), lag_store, pipeline="main",
                            streams=["orders"], interval_s=1.0, clock=FakeClock(T0_S + 60))  # its clock 60 s ahead
    feed = LagFeed(monitor)
    for _ in range(3):
        old_leader.sample_and_store()
        old_leader.clock.now += 1
    assert len(feed.poll()) == 1
    append(log, demo_catalog, 40, int(clock.now * 1000))
    sampler.sample_and_store()  # this replica leads now, its clock 60 s behind
    report = monitor.report("orders")
    assert report.lag_events == 40 and report.verdict.status == LagStatus.OK
    assert lag_store.newest_at_ms("main") == int(clock.now * 1000)
    (message,) = feed.poll()
    assert message["lag_events"] == 40
    clock.now += 1
    append(log, demo_catalog, 2, int(clock.now * 1000))
    sampler.sample_and_store()
    assert [m["lag_events"] for m in feed.poll()] == [42]


def test_a_lag_store_from_before_numbered_rounds_is_upgraded(store_backend):
    """Its samples are kept, as round 0: older than any round written after the upgrade."""
    store = store_backend.create()
    db = store.side_db()
    db.execute("DROP TABLE IF EXISTS lag_samples")  # (a PostgreSQL store may have made today's already)
    db.create("""CREATE TABLE lag_samples (pipeline TEXT NOT NULL, stream TEXT NOT NULL, partition INTEGER NOT NULL,
        at_ms INTEGER NOT NULL, log_start INTEGER NOT NULL, log_end INTEGER NOT NULL, committed INTEGER,
        last_commit_ms INTEGER, lag_events INTEGER NOT NULL, lag_ms INTEGER,
        PRIMARY KEY (pipeline, stream, partition, at_ms))""")
    t = int(T0_S * 1000)
    db.execute("INSERT INTO lag_samples VALUES ('main', 'orders', 0, ?, 0, 10, 5, ?, 5, 0)", (t + 60_000, t))
    lag_store = LagStore(db, retention_ms=600_000)
    assert lag_store.newest_round("main") == 0
    lag_store.write([LagSample("main", "orders", 0, t, 0, 12, 12, t)])  # a writer whose clock is behind
    assert lag_store.newest_round("main") == 1 and lag_store.newest_at_ms("main") == t
    assert [(s.at_ms, s.round_seq) for s in lag_store.recent("main", 2)[("orders", 0)]] == [(t + 60_000, 0), (t, 1)]
    lag_store.close()
    LagStore(store.side_db()).close()  # opened again: nothing to upgrade

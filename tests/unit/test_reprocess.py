"""Reprocessing without Spark: the stored definitions and runs on both store backends
(store/definitions.py), the pipeline's pinning of a changed stream (sketchboard/definitions.py),
a run's plan, completeness date and progress (aggregates/reprocess.py)."""

from __future__ import annotations

import logging

import pytest

from aggregates.reprocess import DefinitionUnchanged, ReprocessService, complete_from_ms, run_id, run_progress
from catalog import Catalog
from catalog.versions import catalog_versions, definition_version, pinned_catalog, stream_document
from ingest.log import SqliteEventLog
from sketchboard.definitions import pin_definitions
from sketchboard.reprocess import progress_line, stream_catalog
from store.consumers import ConsumerRegistry
from store.definitions import DefinitionStore, ReprocessRun, RunGoing
from store.namespace import check_pipeline_name
from tests.support.side_race import race

NOW = 1_800_000_000_000
DAY = 86_400_000

OLD = {"streams": {"http": {"key_field": "user", "dimensions": ["endpoint"], "values": ["latency_ms"],
                            "sessions": {"key": "user"}},
                   "orders": {"key_field": "customer", "values": ["amount"]}},
       "metrics": {"latency": {"stream": "http", "value": "latency_ms"},
                   "amount": {"stream": "orders", "value": "amount"}}}


def new_catalog() -> Catalog:
    """OLD with a dimension and a value field added to http, and a metric over the new value."""
    streams = {**OLD["streams"], "http": {**OLD["streams"]["http"], "dimensions": ["endpoint", "region"],
                                          "values": ["latency_ms", "bytes"]}}
    return Catalog(streams=streams, metrics={**OLD["metrics"], "bytes": {"stream": "http", "value": "bytes"}})


def served_then_changed(tmp_path, old: dict = OLD, new: dict | None = None):
    """A data directory whose pipeline served `old` (its definitions pinned as the pipeline records
    them), its configuration changed to `new` since (default: OLD with http's new declaration):
    (settings, config file, the root store, open)."""
    import yaml

    from sketchboard.settings import Settings
    from sketchboard.wiring import open_catalog, open_store

    if new is None:
        new = {**OLD, "streams": {**OLD["streams"],
                                  "http": new_catalog().streams["http"].model_dump(mode="json", exclude_defaults=True)}}
    config = tmp_path / "streams.yaml"
    config.write_text(yaml.safe_dump(old))
    settings = Settings(data_dir=tmp_path / "data", streams_config=config, alerts_config=None)
    root = open_store(settings)
    pin_definitions(root, open_catalog(settings), "main")
    config.write_text(yaml.safe_dump(new))
    return settings, config, root


def run_of(**changes) -> ReprocessRun:
    base = dict(id="reprocess-http-01234567", stream="http", version="0123456789", definition={"name": "http"},
                state="starting", error=None, started_at_ms=NOW, updated_at_ms=NOW, complete_from_ms=NOW - DAY,
                start_offsets={0: 0, 1: 10}, target_offsets={0: 100, 1: 310})
    return ReprocessRun(**{**base, **changes})


def test_a_pinned_catalog_keeps_the_joins_and_patterns_that_fit_the_stored_streams():
    """A stream kept as stored must not take the pipeline's joins and patterns with it: those that
    read only what the stored declaration has run on; one that needs the new field waits."""
    extra = {
        "joins": [{"name": "http_orders", "left": {"stream": "http", "key": "user"},
                   "right": {"stream": "orders", "key": "customer"}, "within": "10m"}],
        "patterns": [
            {"name": "slow_home", "key": "user", "within": "5m",
             "steps": [{"name": "a", "stream": "http", "where": {"endpoint": "/home"}, "times": 2}]},
            {"name": "from_eu", "key": "user", "within": "5m",  # region: only the new declaration has it
             "steps": [{"name": "a", "stream": "http", "where": {"region": "eu"}}]}]}
    new = Catalog(**{**new_catalog().model_dump(mode="json", exclude_defaults=True), **extra})
    pinned = pinned_catalog(new, {"http": stream_document(Catalog(**OLD).streams["http"])})
    assert [j.name for j in pinned.joins] == ["http_orders"] and "http_orders" in pinned.streams
    assert [p.name for p in pinned.patterns] == ["slow_home"] and "slow_home_matches" in pinned.streams


def test_definitions_are_recorded_once_and_replaced_only_on_purpose(store_backend):
    store = DefinitionStore(store_backend.side_db())
    stored = store.record_missing({"http": ("v1", {"name": "http"}), "orders": ("o1", {"name": "orders"})}, NOW)
    assert {n: d.version for n, d in stored.items()} == {"http": "v1", "orders": "o1"}
    # A later start with a changed definition keeps the record: the output was built with v1.
    stored = store.record_missing({"http": ("v2", {"name": "http", "pane": "1m"}), "new": ("n1", {})}, NOW + 1)
    assert {n: (d.version, d.recorded_at_ms) for n, d in stored.items()} == {
        "http": ("v1", NOW), "orders": ("o1", NOW), "new": ("n1", NOW + 1)}
    assert stored["http"].definition == {"name": "http"}
    store.replace("http", "v2", {"name": "http", "pane": "1m"}, NOW + 2)
    assert store.definitions()["http"].definition == {"name": "http", "pane": "1m"}


def test_runs_are_recorded_with_one_going_per_stream(store_backend):
    store = DefinitionStore(store_backend.side_db())
    run = store.start_run(run_of())
    assert store.run(run.id) == run and store.runs() == [run]
    with pytest.raises(RunGoing, match="still going"):
        store.start_run(run_of(id="reprocess-http-89abcdef"))
    store.start_run(run_of(id="reprocess-orders-1", stream="orders"))  # another stream may run beside it
    store.set_state(run.id, "caught_up", NOW + 5)
    assert store.run(run.id).state == "caught_up" and not store.run(run.id).active
    again = store.start_run(run_of(started_at_ms=NOW + 10))  # finished: the same version may run again
    assert store.run(run.id) == again
    store.set_state(run.id, "failed", NOW + 11, error="boom")
    assert (store.run(run.id).state, store.run(run.id).error) == ("failed", "boom")
    with pytest.raises(ValueError, match="unknown run state"):
        store.set_state(run.id, "paused", NOW)
    assert store.run("nope") is None



def test_two_runs_of_one_stream_started_at_once_one_is_refused(store_backend):
    """One going run per stream, also when two `sketchboard reprocess` start at once: the second's
    check waits for the first's record to commit, and sees it."""
    store = store_backend.create()
    first_db = store_backend.side_db(store)
    first, second = DefinitionStore(first_db), DefinitionStore(store_backend.side_db(store))
    started, refused = race(first_db, "INSERT INTO reprocess_runs", lambda: first.start_run(run_of()),
                            lambda: second.start_run(run_of(id="reprocess-http-89abcdef")))
    assert started == run_of() and isinstance(refused, RunGoing)
    assert [run.id for run in second.runs()] == [run_of().id]


def test_run_ids_are_pipeline_names():
    version = "f" * 64
    assert run_id("http", version) == "reprocess-http-ffffffff"
    long_a, long_b = "a" * 63, "a" * 62 + "b"
    assert len(run_id(long_a, version)) <= 48 and run_id(long_a, version) != run_id(long_b, version)
    for name in ("http", long_a, long_b):
        check_pipeline_name(run_id(name, version))


def test_complete_from_is_the_newest_loss():
    # Nothing dropped from the log: only the stream's retention bounds it.
    assert complete_from_ms({0: 0, 1: 0}, {0: NOW - 3 * DAY, 1: None}, NOW, 7 * DAY) == NOW - 7 * DAY
    # A partition lost its oldest records: complete from its first retained record's time.
    assert complete_from_ms({0: 0, 1: 50}, {0: NOW - 5 * DAY, 1: NOW - 2 * DAY}, NOW, 7 * DAY) == NOW - 2 * DAY
    # The log cannot tell when: no earlier date is promised than now.
    assert complete_from_ms({0: 5}, {0: None}, NOW, 7 * DAY) == NOW
    # Retention shorter than what the log keeps: the retention bounds it.
    assert complete_from_ms({0: 50}, {0: NOW - 5 * DAY}, NOW, DAY) == NOW - DAY


def test_progress_per_partition_with_rate_and_eta():
    run = run_of()
    start = run_progress(run, {}, NOW)
    assert [(p.done, p.to_do) for p in start.partitions] == [(0, 100), (0, 300)]
    assert start.events_per_s is None and start.eta_s is None and start.fraction == 0
    half = run_progress(run, {0: 100, 1: 110}, NOW + 10_000)  # 200 of 400 in 10 s
    assert (half.done, half.to_do, half.fraction) == (200, 400, 0.5)
    assert half.events_per_s == 20 and half.eta_s == 10
    done = run_progress(run, {0: 150, 1: 400}, NOW + 20_000)  # past the target: the live head moved on
    assert (done.done, done.to_do, done.eta_s) == (400, 400, 0.0)
    assert done.to_json()["partitions"] == [{"partition": 0, "done": 100, "to_do": 100},
                                            {"partition": 1, "done": 300, "to_do": 300}]
    empty = run_progress(run_of(start_offsets={}, target_offsets={0: 0}), {}, NOW)
    assert empty.fraction == 1.0 and empty.eta_s == 0.0
    line = progress_line(run, half)
    assert "50.0%" in line and "200/400 offsets" in line and "20 events/s" in line and "ETA 10s" in line
    assert "p0 100/100 p1 100/300" in line


def test_progress_covers_the_streams_a_tables_run_reads_whole():
    """A run of a table also rebuilds the streams enriched from it, reading them to the log's end
    (docs/reprocessing.md): their partitions count in the run's progress, named by stream."""
    run = run_of()
    run = run_of(stream="users", id="reprocess-users-01234567")
    half = run_progress(run, {0: 100, 1: 110}, NOW + 10_000, {"http": ({0: 0}, {0: 600}, {0: 200})})
    assert (half.done, half.to_do) == (400, 1000) and half.events_per_s == 40 and half.eta_s == 15
    assert [(p.stream, p.partition, p.done, p.to_do) for p in half.partitions] == [
        (run.stream, 0, 100, 100), (run.stream, 1, 100, 300), ("http", 0, 200, 600)]
    assert half.to_json()["partitions"][2] == {"partition": 0, "done": 200, "to_do": 600, "stream": "http"}
    line = progress_line(run, half)
    assert "p0 100/100 p1 100/300 http p0 200/600" in line


def test_a_changed_stream_is_computed_as_stored_until_a_switch():
    old, new = Catalog(**OLD), new_catalog()
    assert catalog_versions(old)["orders"] == catalog_versions(new)["orders"]
    pinned = pinned_catalog(new, {"http": stream_document(old.streams["http"])})
    assert pinned.streams["http"] == old.streams["http"]
    assert pinned.streams["http_sessions"] == old.streams["http_sessions"]  # derived again from the stored one
    assert pinned.streams["orders"] == new.streams["orders"]
    assert "bytes" not in pinned.metrics and {"latency", "amount"} <= set(pinned.metrics)  # its field is not there yet
    assert pinned_catalog(new, {}) is new


def test_the_pipeline_records_definitions_and_pins_changed_streams(tmp_path, store_backend, caplog):
    store = store_backend.create()
    old, new = Catalog(**OLD), new_catalog()
    assert pin_definitions(store, old, "main", clock=lambda: NOW / 1000) == old  # first start: recorded as is
    with caplog.at_level(logging.WARNING, logger="sketchboard.definitions"):
        pinned = pin_definitions(store, new, "main", clock=lambda: NOW / 1000 + 60)
    assert pinned.streams["http"] == old.streams["http"]
    old_v, new_v = definition_version(old.streams["http"]), definition_version(new.streams["http"])
    assert f"stream 'http': its definition changed (version {old_v[:8]} -> {new_v[:8]})" in caplog.text
    assert "sketchboard reprocess http" in caplog.text and "'orders'" not in caplog.text


def test_a_pinned_stream_keeps_the_tiers_and_partitions_configured_since_it_was_recorded(store_backend):
    # Tiers, rollup group-bys and partitions do not count in the version: changed alone they apply at
    # once. A later change that pins the stream must not bring the recorded ones back (the pipeline
    # would rebuild the tiers to them, deleting the rows of the tiers configured since).
    store = store_backend.create()
    http = OLD["streams"]["http"]
    pin_definitions(store, Catalog(**OLD), "main", clock=lambda: NOW / 1000)
    layout = {"tiers": [{"every": "1m"}, {"every": "5m"}, {"every": "1h", "keep": "90d"}], "partitions": 8,
              "rollup_group_bys": [["endpoint"]], "description": "requests"}
    relaid = Catalog(**{**OLD, "streams": {**OLD["streams"], "http": {**http, **layout}}})
    assert pin_definitions(store, relaid, "main").streams["http"] == relaid.streams["http"]  # same version: as configured
    changed = Catalog(**{**OLD, "streams": {**OLD["streams"],
                                            "http": {**http, **layout, "dimensions": ["endpoint", "region"],
                                                     "rollup_group_bys": [["endpoint"], ["endpoint", "region"]]}}})
    pinned = pin_definitions(store, changed, "main").streams["http"]
    assert pinned.dimensions == ("endpoint",)  # computed as stored until a switch ...
    assert pinned.tiers == relaid.streams["http"].tiers  # ... laid out as configured
    assert (pinned.partitions, pinned.description) == (8, "requests")
    assert pinned.rollup_group_bys == (("endpoint",),)  # the group-by over the new dimension waits for the switch
    # A tier that does not fit the stored pane keeps the stored tiers; the rest still applies.
    stored_pane = Catalog(**OLD).streams["http"]
    still = pin_definitions(store, Catalog(**{**OLD, "streams": {**OLD["streams"], "http": {
        **http, **layout, "tiers": [{"every": "15s"}], "pane": "5s"}}}), "main").streams["http"]
    assert (still.pane, still.tiers, still.partitions) == (stored_pane.pane, stored_pane.tiers, 8)


@pytest.fixture
def service(tmp_path, store_backend):
    store = store_backend.create()
    log = SqliteEventLog(tmp_path / "log.db", synchronous="OFF")
    new = new_catalog()
    for stream in new.streams.values():
        log.ensure_topic(stream)
    pin_definitions(store, Catalog(**OLD), "main", clock=lambda: NOW / 1000)
    launched = []
    svc = ReprocessService(new, DefinitionStore(store.side_db()), ConsumerRegistry(store.side_db()), log,
                           launch=launched.append, clock=lambda: NOW / 1000)
    svc.launched = launched
    yield svc
    log.close()


def test_a_run_is_planned_from_the_logs_offsets_and_refused_when_pointless(service):
    stream = service.catalog.stream("http")
    events = [{"time": NOW - 1000 * i, "user": f"u{i}", "endpoint": "/", "region": "eu", "latency_ms": 1.0,
               "bytes": 2.0} for i in range(40)]
    from ingest.events import EventValidator

    validator = EventValidator(stream)
    service.log.append(stream, [validator.validate(e) for e in events], NOW - 5000)
    assert service.changes() == {"http": (definition_version(Catalog(**OLD).streams["http"]),
                                          definition_version(stream))}
    run = service.start("http")
    assert service.launched == [run] and run.state == "starting"
    assert run.id == run_id("http", definition_version(stream)) and run.definition == stream_document(stream)
    ends = {p: o.end for p, o in service.log.offsets("http").items()}
    assert run.target_offsets == ends and sum(ends.values()) == 40 and set(run.start_offsets.values()) == {0}
    assert run.complete_from_ms == NOW - stream.retention
    assert service.to_json(run)["progress"]["to_do"] == 40
    with pytest.raises(RunGoing):
        service.start("http")
    with pytest.raises(DefinitionUnchanged, match="served with its configured definition"):
        service.start("orders")
    with pytest.raises(KeyError, match="unknown stream"):
        service.start("http_sessions")  # derived: reprocessed with its parent
    # Progress follows the run's committed offsets (the registry's copies, as its pipeline makes them).
    service.registry.record_commit(run.id, 0, NOW, {"http": {p: end for p, end in ends.items()}})
    assert service.progress(run).fraction == 1.0



def test_a_run_over_a_log_that_retention_trimmed_starts_at_its_first_records_and_says_from_when(service):
    """Events older than the log's retention cannot be reprocessed: the run starts from each
    partition's earliest retained offset, and says up front that its output is complete only from
    when the oldest retained record was appended (docs/reprocessing.md "Starting a run")."""
    from ingest.events import EventValidator

    stream = service.catalog.stream("http")
    validator = EventValidator(stream)

    def append(at_ms: int) -> None:
        events = [{"time": at_ms, "user": f"u{i}", "endpoint": "/", "region": "eu", "latency_ms": 1.0, "bytes": 2.0}
                  for i in range(40)]
        service.log.append(stream, [validator.validate(e) for e in events], at_ms)

    append(NOW - 3 * DAY)
    kept_from = NOW - DAY + 5_000
    append(kept_from)
    assert service.log.apply_retention(NOW, 2 * DAY, 1 << 30) == 40  # the first append is gone
    offsets = service.log.offsets("http")
    run = service.start("http")
    assert run.start_offsets == {p: o.start for p, o in offsets.items()}
    assert all(o.start > 0 for o in offsets.values() if o.end > 0)  # every partition lost its oldest records
    assert run.complete_from_ms == kept_from  # not now - the stream's 7 days' retention
    assert service.to_json(run)["progress"]["to_do"] == 40

def test_a_launch_that_fails_marks_the_run_failed(service):
    def broken(run):
        raise OSError("no such program")

    service.launch = broken
    with pytest.raises(OSError):
        service.start("http")
    (run,) = service.runs()
    assert run.state == "failed" and "no such program" in run.error
    service.launch = None
    assert service.start("http").state == "starting"  # a failed run does not block the next


def test_a_run_whose_process_stopped_reporting_is_failed_and_no_longer_blocks_its_stream(service):
    """A going run's process reports (heartbeat) while it runs; one silent for RUN_STALE_MS (killed,
    its host gone) is marked failed with why and how to go on, the next time runs are read: a new
    run of the stream may start and the old one may be dropped, instead of "still going" for ever."""
    from aggregates.reprocess import RUN_STALE_MS

    now = {"ms": NOW}
    service.clock = lambda: now["ms"] / 1000
    run = service.start("http")
    service.definitions.set_state(run.id, "running", NOW)
    now["ms"] = NOW + RUN_STALE_MS - 1_000
    service.definitions.heartbeat(run.id, NOW + 60_000)  # alive a minute in
    now["ms"] = NOW + 60_000 + RUN_STALE_MS - 1
    with pytest.raises(RunGoing):
        service.start("http")
    assert service.run(run.id).state == "running"
    now["ms"] = NOW + 60_000 + RUN_STALE_MS + 1  # silent since
    (failed,) = service.runs()
    assert failed.state == "failed" and "stopped reporting" in failed.error and "--run ID" in failed.error
    service.definitions.heartbeat(run.id, now["ms"])  # a heartbeat does not bring a failed run back
    assert service.run(run.id).state == "failed"
    assert service.start("http").state == "starting"  # the same version: started again


def test_a_runs_catalog_is_its_stream_alone():
    catalog = stream_catalog(new_catalog(), "http")
    assert set(catalog.streams) == {"http", "http_sessions"} and "amount" not in catalog.metrics
    assert catalog.streams["http"] == new_catalog().streams["http"]


def test_the_cli_refuses_a_pointless_run_with_its_reason_not_a_traceback(tmp_path, capsys):
    """`sketchboard reprocess STREAM` refuses what POST /api/v1/reprocess answers 404/409 to (an
    unknown or derived stream, an unchanged definition, a run going) before any Spark: exit 2 and
    the reason on stderr."""

    from sketchboard import cli
    from sketchboard.wiring import open_catalog, open_log, open_store

    settings, config, root = served_then_changed(tmp_path)
    root.close()
    args = ["--data-dir", str(settings.data_dir), "--config", str(config)]
    assert cli.main(["reprocess", "http", "--data-dir", str(tmp_path / "fresh"), "--config", str(config)]) == 2
    assert "sketchboard: stream 'http' has no served output yet" in capsys.readouterr().err  # no pipeline ran there
    for stream, reason in [("nope", "unknown stream 'nope'; streams read from the log: http, orders"),
                           ("http_sessions", "unknown stream 'http_sessions'"),
                           ("orders", "stream 'orders' is served with its configured definition")]:
        assert cli.main(["reprocess", stream, *args]) == 2
        err = capsys.readouterr().err
        assert f"sketchboard: {reason}" in err and "Traceback" not in err
    root, log = open_store(settings), open_log(settings, open_catalog(settings))
    # A run of http recorded as going (by the API, say).
    ReprocessService(open_catalog(settings), DefinitionStore(root.side_db()), ConsumerRegistry(root.side_db()),
                     log).start("http")
    log.close()
    root.close()
    assert cli.main(["reprocess", "http", *args]) == 2
    err = capsys.readouterr().err
    assert "is still going" in err and "sketchboard reprocess http --run reprocess-http-" in err
    # --run: an unknown id, another stream's run, a run going in another process: refused, no traceback.
    root = open_store(settings)
    (run,) = DefinitionStore(root.side_db()).runs()
    root.close()
    for argv, reason in [(["http", "--run", "bogus"], "no reprocessing run 'bogus'"),
                         (["orders", "--run", run.id], f"run {run.id!r} is a run of stream 'http', not of 'orders'"),
                         (["http", "--run", run.id], f"reprocessing run {run.id!r} of stream 'http' is still going"),
                         (["http", "--run", run.id, "--launched"],  # typed by hand: not the API's child
                          f"reprocessing run {run.id!r} was not launched for this process")]:
        assert cli.main(["reprocess", *argv, *args]) == 2
        err = capsys.readouterr().err
        assert f"sketchboard: {reason}" in err and "Traceback" not in err


@pytest.mark.kafka
def test_on_kafka_a_run_over_a_topic_whose_first_records_are_gone_is_complete_from_the_first_kept_ones(
        store_backend, kafka_broker):
    """As on the embedded log: the topic's oldest records deleted (as its retention does), a run
    starts at each partition's low watermark and is complete from the broker's append time of the
    first record kept (LogAppendTime), read from the topic."""
    import time
    import uuid

    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from ingest.events import EventValidator
    from ingest.log.kafka import KafkaEventLog
    from tests.kafka_broker import client_config

    new = new_catalog()
    stream = new.stream("http")
    log = KafkaEventLog(kafka_broker.bootstrap, topic_prefix=f"test-{uuid.uuid4().hex[:10]}.", replication_factor=1)
    store = store_backend.create()
    try:
        log.ensure_topic(stream)
        validator = EventValidator(stream)

        def append() -> None:
            now = int(time.time() * 1000)
            log.append(stream, [validator.validate({"time": now, "user": f"u{i}", "endpoint": "/", "region": "eu",
                                                    "latency_ms": 1.0, "bytes": 2.0}) for i in range(40)], now)

        append()
        gone = {p: o.end for p, o in log.offsets("http").items()}
        time.sleep(0.05)
        before = int(time.time() * 1000)
        append()
        after = int(time.time() * 1000)
        admin = AdminClient(client_config(kafka_broker.bootstrap))
        cuts = [TopicPartition(log.topic("http"), p, end) for p, end in gone.items() if end > 0]
        for future in admin.delete_records(cuts).values():
            future.result(30)
        assert {p: o.start for p, o in log.offsets("http").items()} == gone
        pin_definitions(store, Catalog(**OLD), "main")
        service = ReprocessService(new, DefinitionStore(store.side_db()), ConsumerRegistry(store.side_db()), log)
        run = service.start("http")
        assert run.start_offsets == gone and sum(gone.values()) == 40
        assert before <= run.complete_from_ms <= after  # the broker's stamp of the first record kept
    finally:
        log.close()


def test_a_child_that_dies_before_recording_why_leaves_its_run_failed_not_starting(tmp_path, monkeypatch):
    """The API's real launcher (sketchboard/reprocess.py child_launcher): a child that cannot even
    read its settings exits 2 before it can record anything. Its run is marked failed with the
    status, so the next POST /api/v1/reprocess of the stream is not refused as going for ever."""
    import time


    from sketchboard.reprocess import build_reprocess_service, child_launcher
    from sketchboard.wiring import open_catalog, open_log

    settings, config, root = served_then_changed(tmp_path)
    catalog = open_catalog(settings)
    log = open_log(settings, catalog)
    monkeypatch.setenv("SKETCHBOARD_PORT", "not a port")  # the child's settings are invalid: it exits 2 at once
    service = build_reprocess_service(settings, catalog, root, log, launch=child_launcher(settings))
    try:
        run = service.start("http")
        deadline = time.monotonic() + 60
        while (now := service.run(run.id)).state == "starting":
            assert time.monotonic() < deadline, "the run stayed 'starting' after its process died"
            time.sleep(0.2)
        assert now.state == "failed" and "exited with status 2" in now.error
        monkeypatch.delenv("SKETCHBOARD_PORT")
        service.launch = None
        assert service.start("http").state == "starting"  # not refused as going
    finally:
        log.close()
        root.close()


def test_a_resumed_runs_rate_counts_only_what_this_process_read():
    """A run resumed by another process (its checkpoint holds what an earlier one read): the rate
    and the ETA count from where this process took over, not the offsets it found done."""
    run = run_of()  # 400 offsets to do
    # 300 were read by an earlier process; this one took over at NOW + 60 s and read 50 in 10 s.
    resumed = run_progress(run, {0: 100, 1: 260}, NOW + 70_000, since=(NOW + 60_000, 300))
    assert (resumed.done, resumed.to_do) == (350, 400)
    assert resumed.events_per_s == 5 and resumed.eta_s == 10
    # Nothing read yet since: no rate, no ETA (not the earlier process's offsets over this one's seconds).
    start = run_progress(run, {0: 100, 1: 210}, NOW + 60_000, since=(NOW + 60_000, 300))
    assert start.events_per_s is None and start.eta_s is None
    assert run_progress(run, {0: 100, 1: 210}, NOW + 61_000, since=(NOW + 60_000, 300)).events_per_s is None


def test_the_apis_rate_of_a_resumed_run_counts_from_where_its_process_took_it_over(service):
    """GET /api/v1/reprocess counted a resumed run's rate from its first start: what an earlier
    process read over the time since then, its downtime included (the CLI's bar knew better)."""
    from ingest.events import EventValidator

    stream = service.catalog.stream("http")
    validator = EventValidator(stream)
    service.log.append(stream, [validator.validate({"time": NOW - 1000 * i, "user": f"u{i}", "endpoint": "/",
                                                    "region": "eu", "latency_ms": 1.0, "bytes": 2.0})
                                for i in range(40)], NOW - 5000)
    now = {"ms": NOW}
    service.clock = lambda: now["ms"] / 1000
    run = service.start("http")
    ends = {p: o.end for p, o in service.log.offsets("http").items()}
    half = {p: end // 2 for p, end in ends.items()}
    service.registry.record_commit(run.id, 0, NOW, {"http": half})  # read by a first process, which died
    now["ms"] = NOW + 3_600_000  # resumed an hour later
    service.record_resume(service.run(run.id))
    read_since = sum(ends.values()) - sum(half.values())
    service.registry.record_commit(run.id, 1, now["ms"], {"http": ends})
    now["ms"] += 10_000
    assert service.progress(service.run(run.id)).events_per_s == read_since / 10
    assert service.to_json(service.run(run.id))["progress"]["events_per_s"] == read_since / 10


def test_the_progress_bar_ends_its_line_before_a_log_record_and_a_file_gets_whole_lines():
    """On a terminal the bar is rewritten in place, and a log record written meanwhile starts on a
    line of its own (not glued to the bar); a file or pipe gets whole lines, one per interval."""
    import io

    from sketchboard.reprocess import ProgressOutput

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    term = Terminal()
    handler = logging.StreamHandler(term)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with ProgressOutput(term) as bar:
            bar.show("[#--] 10%")
            bar.show("[##-] 20%")
            logging.getLogger("sketchboard.test").warning("a log line")
            bar.show("[###] 30%")
        logging.getLogger("sketchboard.test").warning("after")
    finally:
        root.removeHandler(handler)
    assert term.getvalue() == "\r[#--] 10%\r[##-] 20%\nWARNING a log line\n\r[###] 30%\nWARNING after\n"
    assert handler.filters == []

    now = {"s": 0.0}
    file = io.StringIO()
    with ProgressOutput(file, every_s=10, clock=lambda: now["s"]) as bar:
        for second in range(25):
            now["s"] = float(second)
            bar.show(f"at {second}")
        bar.show("done", final=True)
    assert file.getvalue() == "at 0\nat 10\nat 20\ndone\n"


def test_run_ids_given_to_run_are_checked_before_anything_starts(service):
    """`sketchboard reprocess STREAM --run ID` (ReprocessService.resume): an unknown id or another
    stream's run is refused as such; a replaced `previous-*` output is refused (nothing reads into
    it: switching back is a switch); a run going in another process is refused as going, unless this
    process is the API's child it was launched for; a run that failed or caught up is resumed and
    claimed, so a second `--run` of it is refused until this one ends."""
    from aggregates.reprocess import RUN_STALE_MS, RunNotResumable, UnknownRun

    now = {"ms": NOW}
    service.clock = lambda: now["ms"] / 1000
    run = service.start("http")
    with pytest.raises(UnknownRun, match="no reprocessing run 'bogus'.*runs of stream 'http': reprocess-http-"):
        service.resume("http", "bogus")
    with pytest.raises(UnknownRun, match="is a run of stream 'http', not of 'orders'"):
        service.resume("orders", run.id)
    with pytest.raises(RunGoing, match=f"still going.*sketchboard reprocess http --run {run.id}"):
        service.resume("http", run.id)  # `starting`: a process is starting it
    service.definitions.set_state(run.id, "running", NOW)
    with pytest.raises(RunGoing, match="still going"):
        service.resume("http", run.id)
    token = service.definitions.record_launch(run.id, NOW)  # the API's child, handed its run's claim
    assert service.resume("http", run.id, launched=True, launch_token=token).state == "running"
    now["ms"] = NOW + RUN_STALE_MS + 1  # its process stopped reporting: failed, and resumed here
    claimed = service.resume("http", run.id)
    assert claimed.state == "starting" and claimed.error is None and claimed.started_at_ms == NOW
    with pytest.raises(RunGoing):
        service.resume("http", run.id)
    service.definitions.set_state(run.id, "caught_up", now["ms"])
    assert service.resume("http", run.id).state == "starting"  # a caught-up run reads on
    service.definitions.set_state(run.id, "caught_up", now["ms"])
    previous = run_of(id="previous-http-76543210", state="caught_up", version="7654321000")
    service.definitions.start_run(previous)
    with pytest.raises(RunNotResumable, match="a switch replaced.*POST /api/v1/reprocess/previous-http-76543210/switch"):
        service.resume("http", previous.id)
    with pytest.raises(RunNotResumable):
        service.resume("http", previous.id, launched=True)
    assert service.run(previous.id).state == "caught_up"
    # A run of a definition no longer configured (the stream's changed again since): its checkpoint
    # would read on with the new definition under the old version.
    older = run_of(id="reprocess-http-89abcdef", state="failed", version="89abcdef00")
    service.definitions.start_run(older)
    for launched in (False, True):
        with pytest.raises(RunNotResumable, match="builds version 89abcdef of 'http', but the configured definition"):
            service.resume("http", older.id, launched=launched)
    assert service.run(older.id).state == "failed"


def test_launched_is_checked_a_hand_typed_one_cannot_skip_the_going_run_check(service):
    """`--launched` skips the going-run check for the API's child only: the API records a claim for
    the run it launches (store/definitions.py record_launch) and hands it to that child; a
    `--launched` without it, with another, or a second time (the claim is taken once) is refused
    (NotLaunched: exit 2), so two processes never drive one run's checkpoint."""
    from store.definitions import NotLaunched

    run = service.start("http")  # recorded going: its child is starting it
    with pytest.raises(NotLaunched, match=f"run {run.id!r} was not launched for this process.*leave `--launched` out"):
        service.resume("http", run.id, launched=True)  # typed by hand
    token = service.definitions.record_launch(run.id, NOW)
    with pytest.raises(NotLaunched):
        service.resume("http", run.id, launched=True, launch_token="0" * 32)  # another claim
    assert service.resume("http", run.id, launched=True, launch_token=token).id == run.id  # the child
    with pytest.raises(NotLaunched):
        service.resume("http", run.id, launched=True, launch_token=token)  # taken: not twice
    with pytest.raises(RunGoing):
        service.resume("http", run.id)  # and without --launched, it is going
    token = service.definitions.record_launch(run.id, NOW)
    service.definitions.set_state(run.id, "failed", NOW)  # ended before its child took it
    with pytest.raises(NotLaunched, match="is failed, no longer going"):
        service.resume("http", run.id, launched=True, launch_token=token)
    assert service.run(run.id).state == "failed"


def test_the_apis_child_is_handed_its_runs_claim(tmp_path, monkeypatch):
    """The API's real launcher (sketchboard/reprocess.py child_launcher) records the claim and hands
    it to the child it starts, in its environment (not its arguments): that child's `--launched`
    is taken; the same command typed by hand (no claim in its environment) is not."""
    import subprocess

    import sketchboard.reprocess as reprocess
    from sketchboard.wiring import open_catalog, open_log
    from store.definitions import NotLaunched

    started = []

    class Child:
        def __init__(self, argv, env):
            started.append((argv, env))

        def wait(self):
            return 0

    monkeypatch.setattr(subprocess, "Popen", Child)
    settings, config, root = served_then_changed(tmp_path)
    catalog = open_catalog(settings)
    log = open_log(settings, catalog)
    service = reprocess.build_reprocess_service(settings, catalog, root, log, launch=reprocess.child_launcher(settings))
    try:
        run = service.start("http")
        ((argv, env),) = started
        assert argv[-3:] == ["--run", run.id, "--launched"]
        assert all(env[reprocess.LAUNCH_TOKEN_ENV] not in arg for arg in argv)
        with pytest.raises(NotLaunched):
            service.resume("http", run.id, launched=True, launch_token=None)  # by hand
        assert service.resume("http", run.id, launched=True, launch_token=env[reprocess.LAUNCH_TOKEN_ENV]).id == run.id
    finally:
        log.close()
        root.close()


def test_sigterm_or_ctrl_c_records_the_run_failed_with_how_to_resume_and_it_resumes(tmp_path, capsys, monkeypatch):
    """`kill PID` (SIGTERM) of `sketchboard reprocess` is handled as Ctrl-C: the run is recorded
    failed with a readable reason (not left `running`, refused as going for 5 minutes; not
    "KeyboardInterrupt: "), one line on stderr says how to resume, exit 128 + the signal. `--run`
    then resumes it. The pipeline is a stand-in (no Spark): what is pinned is the CLI's handling."""
    import os
    import signal
    import time


    import aggregates.batch_gate
    import sketchboard.wiring
    from sketchboard import cli
    from sketchboard.wiring import open_store

    settings, config, root = served_then_changed(tmp_path)
    root.close()
    args = ["--data-dir", str(settings.data_dir), "--config", str(config)]
    signals = []

    class Pipeline:  # what run_reprocess uses of aggregates.pipeline.Pipeline
        spark = progress_recorder = None

        def __init__(self):
            self.store = self

        def close(self):
            pass

        def run_until_drained(self):
            if signals:
                signum = signals.pop(0)
                if signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler):
                    pytest.fail(f"{signal.Signals(signum).name} is not handled: it would end pytest too")
                os.kill(os.getpid(), signum)
                time.sleep(30)  # interrupted by the handler

    monkeypatch.setattr(sketchboard.wiring, "build_pipeline", lambda *a, **k: Pipeline())
    monkeypatch.setattr(aggregates.batch_gate, "remove_listeners", lambda *a: None)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)

    def runs():
        root = open_store(settings)
        try:
            return DefinitionStore(root.side_db()).runs()
        finally:
            root.close()

    for signum, name in [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT")]:
        signals.append(signum)
        started = time.monotonic()
        assert cli.main(["reprocess", "http", *args]) == 128 + signum
        assert time.monotonic() - started < 20
        err = capsys.readouterr().err
        (run,) = runs()
        assert f"sketchboard: interrupted ({name}): run {run.id!r} is recorded failed; resume it with" \
               f" `sketchboard reprocess http --run {run.id}`" in err and "Traceback" not in err
        assert run.state == "failed" and run.error.startswith(f"interrupted ({name}): resume it with")
    # A signal while the run is being claimed: it was raised before the run's failure was recorded,
    # and left the run `starting`, refused as going until it was stale.
    from aggregates.reprocess import ReprocessService

    start = ReprocessService.start

    def start_then_signal(self, stream):
        claimed = start(self, stream)
        os.kill(os.getpid(), signal.SIGTERM)  # handled here, before the claim has returned
        return claimed

    monkeypatch.setattr(ReprocessService, "start", start_then_signal)
    assert cli.main(["reprocess", "http", *args]) == 128 + signal.SIGTERM
    monkeypatch.setattr(ReprocessService, "start", start)
    (run,) = runs()
    assert run.state == "failed" and "SIGTERM" in run.error
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before  # put back
    assert cli.main(["reprocess", "http", "--run", run.id, *args]) == 0  # resumed from its checkpoint
    (run,) = runs()
    assert run.state == "caught_up" and run.error is None


def test_reprocess_switch_of_a_stream_whose_joins_other_stream_changed_too_is_refused_before_spark(
        tmp_path, capsys, monkeypatch):
    """`sketchboard reprocess searches --switch` when `clicks`, the other stream of their join,
    changed too: the switch could not be made (aggregates/reprocess.py refuse_unswitchable), so it
    is refused before a run is recorded or Spark starts, saying what to do; exit 2."""

    import sketchboard.wiring
    from sketchboard import cli
    from sketchboard.wiring import open_store

    old = {"streams": {"searches": {"key_field": "user", "dimensions": ["query"]},
                       "clicks": {"key_field": "user", "dimensions": ["button"]}},
           "joins": [{"name": "search_clicks", "left": {"stream": "searches", "key": "user"},
                      "right": {"stream": "clicks", "key": "user"}, "within": "5m"}]}
    settings, config, root = served_then_changed(tmp_path, old, {**old, "streams": {
        "searches": {"key_field": "user", "dimensions": ["query", "country"]},
        "clicks": {"key_field": "user", "dimensions": ["button", "page"]}}})
    root.close()
    monkeypatch.setattr(sketchboard.wiring, "build_pipeline", lambda *a, **k: pytest.fail("Spark started"))
    args = ["--data-dir", str(settings.data_dir), "--config", str(config)]
    assert cli.main(["reprocess", "searches", "--switch", *args]) == 2
    err = capsys.readouterr().err
    assert "sketchboard: the definition of 'clicks' (read by join 'search_clicks' with 'searches') changed too" in err
    assert "switch one at a time" in err and "Traceback" not in err
    root = open_store(settings)
    assert DefinitionStore(root.side_db()).runs() == []
    root.close()

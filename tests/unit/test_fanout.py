"""Fan-out without Spark: where a named pipeline's output lives (store/namespace.py), the consumer
registry on both store backends (store/consumers.py), the copies made after each commit
(aggregates/consumers.py) and the flags and settings that choose them."""

from __future__ import annotations

import uuid

import pytest
from pydantic import ValidationError

from aggregates.consumers import GroupCopy, RegistryCopy, notify
from sketchboard.cli import build_parser
from sketchboard.settings import Settings
from sketchboard.wiring import open_store, store_namespace
from store import BatchCommit, PaneData, PanePartial
from store.consumers import ConsumerRegistry, NamespaceTaken
from store.namespace import ROOT, check_pipeline_name, namespace_of, postgres_schema, sqlite_store_path
from tests.support.side_race import race

NOW = 1_800_000_000_000


def test_the_serving_pipeline_keeps_the_root_and_others_get_their_own(tmp_path):
    assert namespace_of("main", "main") == ROOT
    assert namespace_of("audit", "main") == "audit"
    assert sqlite_store_path(tmp_path, ROOT) == tmp_path / "store.db"  # today's layout
    assert sqlite_store_path(tmp_path, "audit") == tmp_path / "pipelines" / "audit" / "store.db"
    assert postgres_schema(ROOT, "public") == "public"
    assert postgres_schema("audit", "public") == "public__audit"
    # Too long for PostgreSQL's 63 bytes (it would cut them silently, and two could meet): shortened
    # with a hash of the whole, the same every time, distinct, and never a name that fits.
    long = [postgres_schema(name, "s" * 20) for name in ("a" * 48, "a" * 47 + "b", "a" * 47 + "b")]
    assert long[0] != long[1] == long[2] and all(len(s.encode()) == 63 for s in long)
    assert long[0].startswith("s" * 20 + "__aaa") and "~" in long[0]
    assert len(postgres_schema("x", "a" + "é" * 31).encode()) <= 63  # never half a multi-byte character
    assert postgres_schema("Audit", "Sales") == "Sales__Audit"
    for bad in ("", "../x", "a b", "-x", "x" * 49):
        with pytest.raises(ValueError, match="pipeline name"):
            check_pipeline_name(bad)
    settings = Settings(data_dir=tmp_path)
    assert store_namespace(settings) == ROOT and store_namespace(settings, "audit") == "audit"
    assert settings.checkpoint_dir_of("audit") == tmp_path / "checkpoints" / "audit"


def test_cli_flags_and_settings():
    args = build_parser().parse_args(["pipeline", "--name", "audit", "--from", "latest"])
    assert (args.name, args.start) == ("audit", "latest")
    assert build_parser().parse_args(["pipeline"]).start is None  # the setting decides
    for bad in (["--name", "a/b"], ["--from", "now"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["pipeline", *bad])
    with pytest.raises(ValidationError, match="needs log_backend kafka"):
        Settings(kafka_commit_offsets=True)
    with pytest.raises(ValidationError, match="pipeline_name"):
        Settings(pipeline_name="no spaces")


def commit(pipeline: str, batch_id: int, offsets: dict) -> BatchCommit:
    n = sum(offsets.get("orders", {}).values())
    return BatchCommit(pipeline, batch_id, [PanePartial("orders", NOW, NOW + 10_000, {}, PaneData(count=n))], n,
                       {"orders": NOW}, end_offsets=offsets, read_by_stream={"orders": n})


def test_registry_records_consumers_copies_offsets_and_guards_namespaces(store_backend):
    store = store_backend.create()
    registry = ConsumerRegistry(store.side_db())
    main = registry.register("main", ROOT, "earliest", NOW)
    assert (main.pipeline, main.namespace, main.started_from, main.last_batch_id) == ("main", ROOT, "earliest", None)
    registry.register("audit", "audit", "latest", NOW + 1)
    # A later start keeps the first record: the checkpoint, not --from, says where it resumes.
    assert registry.register("audit", "audit", "earliest", NOW + 2).started_from == "latest"
    with pytest.raises(NamespaceTaken, match="holds the output of pipeline 'main'"):
        registry.register("other", ROOT, "earliest", NOW)
    with pytest.raises(NamespaceTaken, match="not the store's namespace 'x'"):
        registry.register("audit", "x", "earliest", NOW)

    RegistryCopy(registry, "audit")(3, {"orders": {0: 10, 1: 7}}, NOW + 5)
    RegistryCopy(registry, "audit")(2, {"orders": {0: 4, 1: 9}}, NOW + 4)  # a late copy never moves back
    assert registry.offsets("audit") == {"orders": {0: 10, 1: 9}}
    audit = {c.pipeline: c for c in registry.consumers()}["audit"]
    assert (audit.last_batch_id, audit.last_commit_ms) == (3, NOW + 5)
    assert [c.pipeline for c in registry.consumers()] == ["main", "audit"]

    registry.record_group_commit("audit", "KafkaException: down")
    registry.record_group_commit("audit", "KafkaException: still down")
    audit = {c.pipeline: c for c in registry.consumers()}["audit"]
    assert (audit.group_commits_failed, audit.group_commit_error) == (2, "KafkaException: still down")
    registry.record_group_commit("audit", None)
    audit = {c.pipeline: c for c in registry.consumers()}["audit"]
    assert (audit.group_commits_failed, audit.group_commit_error) == (2, None)
    registry.close()


def test_every_pipelines_offsets_and_starts_read_at_once_are_each_ones_own(store_backend):
    """The lag sampler reads every consumer's position each round: one `offsets` and one `starts`
    per consumer (and a listing of them all, for its commit time) made a round at 400 consumers
    cost most of a second. `all_offsets` / `all_starts` are those of each pipeline, in one query."""
    store = store_backend.create()
    registry = ConsumerRegistry(store.side_db())
    for i, name in enumerate(("main", "audit", "reprocess-orders-0123abcd", "idle")):
        registry.register(name, ROOT if name == "main" else name, "earliest", NOW + i)
    registry.record_start("audit", {"orders": {0: 2, 1: 3}, "logins": {0: 0}})
    registry.record_start("reprocess-orders-0123abcd", {"orders": {0: 0}})
    registry.record_commit("audit", 1, NOW, {"orders": {0: 5}})
    registry.record_commit("reprocess-orders-0123abcd", 4, NOW, {"orders": {0: 7, 1: 1}, "users": {0: 9}})
    names = [c.pipeline for c in registry.consumers()]
    assert registry.all_offsets() == {n: registry.offsets(n) for n in names if registry.offsets(n)} == {
        "audit": {"orders": {0: 5}}, "reprocess-orders-0123abcd": {"orders": {0: 7, 1: 1}, "users": {0: 9}}}
    assert registry.all_starts() == {n: registry.starts(n) for n in names if registry.starts(n)} == {
        "audit": {"orders": {0: 2, 1: 3}, "logins": {0: 0}}, "reprocess-orders-0123abcd": {"orders": {0: 0}}}
    registry.forget("audit")
    assert set(registry.all_offsets()) == set(registry.all_starts()) == {"reprocess-orders-0123abcd"}
    registry.close()


def test_two_pipelines_registering_one_namespace_at_once_one_is_refused(store_backend):
    """One pipeline per namespace (two would count every event twice), also when two start at
    once: the second's check waits for the first's registration to commit, and sees it."""
    store = store_backend.create()
    first_db = store_backend.side_db(store)
    first, second = ConsumerRegistry(first_db), ConsumerRegistry(store_backend.side_db(store))
    registered, refused = race(first_db, "INSERT INTO consumers",
                               lambda: first.register("audit", "shared", "earliest", NOW),
                               lambda: second.register("other", "shared", "earliest", NOW))
    assert registered.pipeline == "audit" and isinstance(refused, NamespaceTaken)
    assert [(c.pipeline, c.namespace) for c in second.consumers()] == [("audit", "shared")]


def test_a_root_holding_another_pipelines_batches_is_refused(store_backend):
    """A store from before the registry: its batches name the pipeline whose output the root holds."""
    store = store_backend.create()
    assert store.commit_batch(commit("main", 0, {"orders": {0: 1}}), lateness_ms={"orders": 60_000}, now_ms=NOW).committed
    registry = ConsumerRegistry(store.side_db())
    with pytest.raises(NamespaceTaken, match="pipeline 'main'"):
        registry.register("renamed", ROOT, "earliest", NOW)
    assert registry.register("main", ROOT, "earliest", NOW).namespace == ROOT
    registry.close()


def test_each_namespace_is_a_store_of_its_own(store_backend, tmp_path):
    """open_store as the wiring calls it: a named pipeline's panes never land in the root's."""
    root = store_backend.create()
    if store_backend.kind == "postgres":
        settings = Settings(data_dir=tmp_path, store_backend="postgres", postgres_dsn=root.dsn, postgres_pool_size=2)
    else:
        settings = Settings(data_dir=root.path.parent)
    name = f"n{uuid.uuid4().hex[:8]}"
    named = open_store(settings, name)
    try:
        lateness = {"orders": 60_000}
        assert named.commit_batch(commit(name, 0, {"orders": {0: 5}}), lateness_ms=lateness, now_ms=NOW).committed
        assert root.commit_batch(commit("main", 0, {"orders": {0: 2}}), lateness_ms=lateness, now_ms=NOW).committed
        assert [p.data.count for p in named.read_panes("orders", 0, 2**62)] == [5]
        assert [p.data.count for p in root.read_panes("orders", 0, 2**62)] == [2]
        assert named.progress(name).end_offsets == {"orders": {0: 5}} and root.progress(name).end_offsets == {}
        again = open_store(settings, name)  # a restart finds it
        assert again.last_batch_id(name) == 0
        again.close()
    finally:
        named.close()


def test_any_valid_name_opens_a_store_of_its_own_under_any_root(store_backend, tmp_path):
    """Names with an uppercase letter (`--name Audit`, a run of the stream `PageViews`) could not be
    opened on PostgreSQL (the schema was looked up lowercased), nor any under a root schema that
    needs quoting; a name too long for `<root>__<name>`'s 63 bytes could not be opened, listed or
    dropped. Each opens, keeps its own panes, is found again, exists and is dropped, as on SQLite."""
    root = store_backend.create()
    if store_backend.kind == "postgres":
        import psycopg
        from psycopg.conninfo import make_conninfo

        from store.namespace import quote_ident

        root_schema = f"Analytics_Production_{uuid.uuid4().hex[:8]}"  # 29 bytes, needs quoting
        with psycopg.connect(root.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {quote_ident(root_schema)}")
        dsn = make_conninfo(root.dsn, options=f"-c search_path={quote_ident(root_schema)}")
        settings = Settings(data_dir=tmp_path, store_backend="postgres", postgres_dsn=dsn, postgres_pool_size=2)
    else:
        settings = Settings(data_dir=root.path.parent)
    from sketchboard.reprocess import reprocess_outputs

    storage = reprocess_outputs(settings).storage
    names = ["Audit", "audit", "reprocess-PageViews-abababab", "reprocess-checkout_payment_events-9de5e5bb",
             "a" * 47 + "b", "a" * 47 + "c"]
    lateness = {"orders": 60_000}
    try:
        for i, name in enumerate(names):
            store = open_store(settings, name)
            assert store.commit_batch(commit(name, 0, {"orders": {0: i + 1}}), lateness_ms=lateness,
                                      now_ms=NOW).committed
            store.close()
        for i, name in enumerate(names):
            again = open_store(settings, name)  # a restart finds it, its own panes only
            assert [p.data.count for p in again.read_panes("orders", 0, 2**62)] == [i + 1]
            again.close()
            assert storage.exists(name)
        with storage.transaction(names) as (_, qualifiers):  # what a switch reaches them by
            assert len(set(qualifiers.values())) == len(names)
        for name in names:
            storage.drop(name)
            assert not storage.exists(name)
    finally:
        for name in names:
            storage.drop(name)
        if store_backend.kind == "postgres":
            with psycopg.connect(root.dsn, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA {quote_ident(root_schema)}")


@pytest.mark.postgres
def test_a_failed_first_open_leaves_no_empty_schema(postgres_server, tmp_path, monkeypatch):
    """The namespace's schema is made before its tables: a first open that failed left it empty,
    and an empty schema is listed as a namespace (a reprocessing run's output that never opened).
    A schema that was there before the open (made by hand) is kept."""
    import psycopg

    from store.postgres import panes
    from store.postgres.namespaces import PostgresNamespaces

    dsn = postgres_server.fresh_dsn()
    settings = Settings(data_dir=tmp_path, store_backend="postgres", postgres_dsn=dsn, postgres_pool_size=2)
    storage = PostgresNamespaces(dsn)

    def failing(conn, where):
        raise RuntimeError("cannot make the tables")
    monkeypatch.setattr(panes, "ensure_schema", failing)
    with pytest.raises(RuntimeError, match="cannot make the tables"):
        open_store(settings, "Audit")
    assert not storage.exists("Audit")
    with psycopg.connect(dsn, autocommit=True) as conn:
        schema = conn.execute("SELECT current_schema()").fetchone()[0] + "__kept"
        conn.execute(f"CREATE SCHEMA {schema}")
    with pytest.raises(RuntimeError):
        open_store(settings, "kept")
    assert storage.exists("kept")
    monkeypatch.undo()
    open_store(settings, "Audit").close()  # opens once it can
    assert storage.exists("Audit")
    for name in ("Audit", "kept"):
        storage.drop(name)


@pytest.mark.postgres
def test_a_namespace_connection_keeps_pgoptions_and_a_root_schema_with_a_space(postgres_server, monkeypatch):
    """A DSN without `options` takes PGOPTIONS (libpq); the namespace's DSN wrote an `options` of its
    own, which replaced PGOPTIONS whole: its settings were lost. libpq also splits `options` on
    spaces: a root schema with one made a search_path the server refused."""
    import psycopg

    from store.namespace import quote_ident
    from store.postgres.schema import namespace_dsn

    root_schema = f"My Root {uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_server.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {quote_ident(root_schema)}")
    escaped = quote_ident(root_schema).replace(" ", "\\ ")  # as libpq reads PGOPTIONS too
    monkeypatch.setenv("PGOPTIONS", f"-c statement_timeout=4321 -c search_path={escaped}")
    made = namespace_dsn(postgres_server.dsn(), "Audit")
    try:
        with psycopg.connect(made.dsn) as conn:
            assert conn.execute("SELECT current_schema(), current_setting('statement_timeout')").fetchone() == (
                f"{root_schema}__Audit", "4321ms")
    finally:
        with psycopg.connect(postgres_server.dsn(), autocommit=True) as conn:
            for schema in (made.schema, root_schema):
                conn.execute(f"DROP SCHEMA {quote_ident(schema)}")


def test_a_failing_group_copy_is_counted_and_never_stops_the_others(tmp_path, capfd):
    """A real Kafka admin client with nothing listening: the copy fails (recorded in the registry),
    the registry copy after it still runs, and notify reports one failure instead of raising.
    librdkafka's complaints go to Python logging, not straight to stderr (twice a second)."""
    import socket

    from ingest.log.kafka_groups import GroupOffsetCommitter

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    registry = ConsumerRegistry(tmp_path / "store.db")
    registry.register("audit", "audit", "earliest", NOW)
    committer = GroupOffsetCommitter(f"127.0.0.1:{port}", "sketchboard-audit", timeout_s=1.0)
    group = GroupCopy(committer, registry, "audit")
    failures = notify([group, RegistryCopy(registry, "audit")], 0, {"orders": {0: 3}}, NOW)
    assert failures == 1 and group.failures == 1
    audit = registry.consumers()[0]
    assert audit.group_commits_failed == 1 and "KafkaException" in audit.group_commit_error
    assert registry.offsets("audit") == {"orders": {0: 3}}
    registry.close()
    assert "rdkafka" not in capfd.readouterr().err


def test_a_name_started_over_gets_a_new_registry_record(tmp_path):
    """Starting a name over (its checkpoint deleted, docs/scale-out.md) kept the old run's record:
    its copied offsets and batch id never move back, so the replaying pipeline showed caught up
    and the log's compaction could drop a delete before it read it. A restart keeps the record."""
    from sketchboard.wiring import build_pipeline, open_consumer_registry

    settings = Settings(data_dir=tmp_path / "data", alerts_config=None)
    root = open_store(settings)
    registry = open_consumer_registry(settings, root)
    registry.register("audit", "audit", "latest", NOW)
    registry.record_commit("audit", 59, NOW, {"http_requests": {0: 1_499}})
    pipeline = build_pipeline(settings, name="audit", starting_offsets="earliest")  # no checkpoint: started over
    pipeline.store.close()
    [audit] = [c for c in registry.consumers() if c.pipeline == "audit"]
    assert (audit.started_from, audit.last_batch_id) == ("earliest", None) and registry.offsets("audit") == {}
    registry.record_commit("audit", 0, NOW, {"http_requests": {0: 10}})
    settings.checkpoint_dir_of("audit").mkdir(parents=True, exist_ok=True)
    (settings.checkpoint_dir_of("audit") / "metadata").write_text("{}")  # a checkpoint now: a restart
    build_pipeline(settings, name="audit", starting_offsets="latest").store.close()
    assert registry.offsets("audit") == {"http_requests": {0: 10}}
    registry.close()
    root.close()


def test_reprocessing_names_are_not_given_to_pipelines():
    """`pipeline --name reprocess-...` (or previous-...) wrote into a reprocessing run's namespace:
    a run's versioned output, or the output a switch kept to switch back to."""
    for name in ("reprocess-http_requests-0123abcd", "previous-orders-0123abcd"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["pipeline", "--name", name])
        with pytest.raises(ValidationError, match="kept for reprocessing runs"):
            Settings(pipeline_name=name)
    assert build_parser().parse_args(["pipeline", "--name", "reprocessing"]).name == "reprocessing"


def test_a_group_template_without_the_name_is_the_serving_pipelines_alone(caplog):
    from sketchboard.wiring import consumer_group_of

    kafka = {"log_backend": "kafka", "kafka_bootstrap_servers": "localhost:9092", "kafka_commit_offsets": True}
    shared = Settings(**kafka, kafka_group_id="analytics")
    assert consumer_group_of(shared, "main") == "analytics"
    with caplog.at_level("WARNING", logger="sketchboard"):
        assert consumer_group_of(shared, "audit") is None  # it would overwrite main's offsets there
    assert "kafka_group_id has no {pipeline}" in caplog.text
    assert consumer_group_of(Settings(**kafka), "audit") == "sketchboard-audit"
    assert consumer_group_of(Settings(**{**kafka, "kafka_commit_offsets": False}), "main") is None  # copies off


def test_one_process_per_pipeline_name_and_data_directory(tmp_path):
    """Two `pipeline --name audit` at once drove one checkpoint: both committed until one died on
    the other's checkpoint files. The second is refused before anything starts."""
    import os
    import subprocess
    import sys

    from sketchboard.pipeline_lock import PipelineRunning, hold_pipeline

    settings = Settings(data_dir=tmp_path / "data")
    with hold_pipeline("audit", settings.checkpoint_dir_of("audit")):
        with pytest.raises(PipelineRunning, match=f"already running on this data directory \\(process {os.getpid()}"):
            with hold_pipeline("audit", settings.checkpoint_dir_of("audit")):
                pass
        with hold_pipeline("main", settings.checkpoint_dir_of("main")):  # another name: its own lock
            pass
        done = subprocess.run([sys.executable, "-m", "sketchboard.cli", "pipeline", "--name", "audit", "--once",
                               "--data-dir", str(tmp_path / "data")], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert "pipeline 'audit' is already running" in done.stderr and "Traceback" not in done.stderr
    assert not settings.checkpoint_dir_of("audit").exists()  # the lock is beside it: still a first start
    with hold_pipeline("audit", settings.checkpoint_dir_of("audit")):  # released with its holder
        pass


def test_a_latest_pipeline_stopped_before_its_first_batch_says_it_resumes_from_its_pinned_start(tmp_path, caplog):
    """A first run `--from latest` pins the log's end in its checkpoint before any batch; started
    again with `--from earliest` it still reads from that pinned end, though it logged that it
    would now start from earliest."""
    from sketchboard.wiring import build_pipeline, open_consumer_registry

    settings = Settings(data_dir=tmp_path / "data", alerts_config=None)
    root = open_store(settings)
    registry = open_consumer_registry(settings, root)
    registry.register("audit", "audit", "latest", NOW)
    checkpoint = settings.checkpoint_dir_of("audit")
    checkpoint.mkdir(parents=True)
    (checkpoint / "sketchboard-initial-offsets.json").write_text("{}")  # pinned by the first run, no batch yet
    with caplog.at_level("INFO", logger="sketchboard"):
        build_pipeline(settings, name="audit", starting_offsets="earliest").store.close()
    assert "resumes from its checkpoint" in caplog.text and "--from earliest applies to a first run only" in caplog.text
    assert "now starts from earliest" not in caplog.text
    registry.close()
    root.close()


def test_a_failed_copy_is_made_again_while_no_batch_comes_and_a_newer_batch_replaces_it():
    """A copy a batch failed waited for the next batch, which a caught-up pipeline does not run:
    outside tools saw it lagging for as long as its streams were quiet."""
    from aggregates.consumers import CommitCopies

    now = [0.0]
    made, down = [], [True]

    def group(batch_id, offsets, at_ms):
        if down[0]:
            raise RuntimeError("coordinator not available")
        made.append((batch_id, offsets))

    registry_made = []
    copies = CommitCopies([group, lambda b, o, t: registry_made.append(b)], clock=lambda: now[0], retry_every_s=10)
    assert copies.notify(1, {"a": {0: 5}}, NOW) == 1 and registry_made == [1]
    assert copies.retry_due() == 1 and made == []  # not due yet
    now[0] = 10
    assert copies.retry_due() == 1  # still down: tried, still failed
    assert copies.notify(2, {"a": {0: 9}}, NOW) == 1  # a newer batch's copy replaces the failed one
    down[0] = False
    now[0] = 25
    assert copies.retry_due() == 0 and made == [(2, {"a": {0: 9}})]  # only the newest, once
    now[0] = 40
    assert copies.retry_due() == 0 and made == [(2, {"a": {0: 9}})] and registry_made == [1, 2]


def test_a_named_pipeline_is_removed_with_its_output_checkpoint_and_registry_record(tmp_path, capsys):
    """A stopped named pipeline stayed in the consumer registry for good (its lag STOP for ever, the
    log's compaction held back by it) with no command to remove it."""
    from sketchboard import cli
    from sketchboard.pipeline_lock import hold_pipeline
    from sketchboard.wiring import open_consumer_registry
    from store.audit import AuditStore

    data = tmp_path / "data"
    settings = Settings(data_dir=data, alerts_config=None)
    root = open_store(settings)
    registry = open_consumer_registry(settings, root)
    registry.register("audit", "audit", "earliest", NOW)
    registry.record_commit("audit", 3, NOW, {"orders": {0: 7}})
    open_store(settings, "audit").close()  # its output
    settings.checkpoint_dir_of("audit").mkdir(parents=True)
    (settings.checkpoint_dir_of("audit") / "metadata").write_text("{}")
    args = ["--data-dir", str(data)]

    assert cli.main(["pipeline", "--remove", *args]) == 2
    assert "--remove needs the pipeline's --name" in capsys.readouterr().err
    assert cli.main(["pipeline", "--name", "main", "--remove", *args]) == 2
    assert "'main' is the serving pipeline" in capsys.readouterr().err
    assert cli.main(["pipeline", "--name", "nope", "--remove", *args]) == 2
    assert "no pipeline named 'nope' here (named pipelines: 'audit')" in capsys.readouterr().err
    with hold_pipeline("audit", settings.checkpoint_dir_of("audit")):  # running
        assert cli.main(["pipeline", "--name", "audit", "--remove", *args]) == 2
        assert "pipeline 'audit' is already running" in capsys.readouterr().err
    assert sqlite_store_path(data, "audit").exists()

    assert cli.main(["pipeline", "--name", "audit", "--remove", *args]) == 0
    err = capsys.readouterr().err
    assert "pipeline 'audit' removed: its output (the store's namespace 'audit'); its checkpoint" in err
    assert not sqlite_store_path(data, "audit").exists() and not settings.checkpoint_dir_of("audit").exists()
    assert [c.pipeline for c in registry.consumers()] == [] and registry.offsets("audit") == {}
    audit = AuditStore(root.side_db())
    assert [(e.action, e.target) for e in audit.entries(limit=5)] == [("pipeline.remove", "audit")]
    registry.close()
    root.close()


@pytest.mark.parametrize("name", ["main", "late"])
def test_a_pipeline_started_from_the_logs_end_that_finds_nothing_new_is_not_behind(tmp_path, name):
    """Started `--from latest` after the log held records, and with nothing new to read, it
    committed no batch: the API showed the whole earlier log as its lag (STOP once the window was
    full). Its pinned start is recorded in the consumer registry and is its position until it
    commits, for the sampler and for GET /api/v1/pipeline."""
    from fastapi.testclient import TestClient

    from sketchboard.wiring import build_api, build_pipeline, open_catalog, open_consumer_registry, open_log
    from tests.conftest import DEMO_CONFIG
    from tests.spark.test_fanout import STREAM, append, recent_events

    settings = Settings(data_dir=tmp_path / "data", streams_config=DEMO_CONFIG, alerts_config=None)
    log = open_log(settings, open_catalog(settings))
    append(log, open_catalog(settings), recent_events(60, seed=1))
    ends = {p: o.end for p, o in log.offsets(STREAM).items()}
    pipeline = build_pipeline(settings, name=name, starting_offsets="latest")
    pipeline.run_until_drained()
    assert pipeline.store.progress(name).last_batch_id is None  # nothing new: no batch
    root = open_store(settings)
    registry = open_consumer_registry(settings, root)
    assert registry.starts(name)[STREAM] == ends
    app, ctx = build_api(settings)
    ctx.lag.sampler.sample_and_store()
    with TestClient(app, base_url="http://127.0.0.1") as client:
        consumers = {c["name"]: c for c in client.get("/api/v1/lag", params={"stream": STREAM}).json()["consumers"]}
        status = client.get("/api/v1/pipeline").json()
    assert consumers[name]["lag_events"] == 0, consumers[name]["reason"]
    if name == settings.pipeline_name:
        assert status["streams"][STREAM]["lag_events"] == 0
        assert {int(p): v["committed"] for p, v in status["streams"][STREAM]["partitions"].items()} == ends
    pipeline.store.close()
    registry.close()
    root.close()
    log.close()


def test_a_pinned_start_is_recorded_once_not_at_every_trigger(tmp_path):
    """An idle pipeline before its first batch told its start at every trigger (10 a second): a
    write transaction on the root store each time, competing with the API's writes."""
    from sketchboard.wiring import build_pipeline

    settings = Settings(data_dir=tmp_path / "data", alerts_config=None)
    pipeline = build_pipeline(settings, name="audit", starting_offsets="latest")
    told = []
    pipeline.start_listeners.append(told.append)
    try:
        for _ in range(5):
            pipeline.notify_start({"http_requests": {0: 4, 1: 2}})
        assert told == [{"http_requests": {0: 4, 1: 2}}]
    finally:
        pipeline.store.close()

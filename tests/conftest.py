"""Shared test helpers: the repo's demo catalog and where artifacts go."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# No per-example deadline for Hypothesis: it is a timed assertion, and on the shared 2-core
# machine an example that takes 1 ms alone took 277 ms under load and failed the suite.
settings.register_profile("sketchboard", deadline=None)
settings.load_profile("sketchboard")

# Spark's driver JVMs in the tests (the in-process SparkSession, and every `sketchboard` process a
# test starts, which inherit this environment) compile with the JIT's first tier only (C1): they
# live seconds to minutes, and C2's compiler threads cost more of the 2 cores than its faster code
# wins back. Measured back to back (docs/development.md): `pipeline --once` 28-31 s -> 22-23 s,
# tests/browser/test_lag_e2e.py 102 s -> 66 s. SPARK_SUBMIT_OPTS reaches only JVMs that
# spark-submit launches (pyspark's driver); the Kafka broker, a standalone cluster's daemons and
# its executors keep their defaults. An SPARK_SUBMIT_OPTS of your own is left as it is.
# With them goes the class-data archive of a Spark driver that `make test` makes first
# (tests/spark_cds.py), when it is there: a driver then maps pyspark's classes instead of
# loading them (`pipeline --once` 17-20 s -> 12-13 s).
if "SPARK_SUBMIT_OPTS" not in os.environ:
    from tests.spark_cds import driver_opts

    os.environ["SPARK_SUBMIT_OPTS"] = driver_opts()

# The APIs tests build in this process run their ingest in threads (`ingest_processes` 0) unless a
# test sets it: `auto`, the default, would start a worker process per core + 1 for each of the
# suite's many APIs (~1 s of CPU each to start). The services tests/procs.py starts as real
# processes drop this and run with the default, as `make run` does; tests/api/test_ingest_workers.py
# tests the workers themselves.
os.environ.setdefault("SKETCHBOARD_INGEST_PROCESSES", "0")

from catalog import Catalog, load_catalog
from tests.support.teardown import reported_if_slow

REPO_ROOT = Path(__file__).resolve().parents[1]
DEMO_CONFIG = REPO_ROOT / "config" / "streams.yaml"


@pytest.fixture(scope="session")
def demo_catalog() -> Catalog:
    """The one catalog fixture: the demo configuration (config/streams.yaml), loaded once."""
    return load_catalog(DEMO_CONFIG)


@pytest.fixture(scope="session")
def catalog(demo_catalog: Catalog) -> Catalog:
    """demo_catalog, under the short name the API and alert tests use."""
    return demo_catalog


@pytest.fixture
def service_factory(tmp_path):
    """service_factory(**settings) -> a real-process tests.procs.Service (nothing started yet);
    all are closed at the end. For tests/e2e and tests/browser."""
    from tests.procs import Service

    made: list[Service] = []

    def make(**settings) -> Service:
        root = tmp_path / f"service{len(made)}"
        root.mkdir()
        made.append(Service(root, settings))
        return made[-1]

    yield make
    for service in made:
        service.close()


@pytest.fixture(scope="session")
def postgres_server():
    """One real PostgreSQL server (tests/postgres_server.py) for the whole run, started on first
    use (~1 s) and removed at the end; tests take a fresh schema from it with fresh_dsn()."""
    from tests.postgres_server import PostgresServer

    server = PostgresServer()
    server.start()
    yield server
    with reported_if_slow("the PostgreSQL server"):
        server.stop()


@pytest.fixture(scope="session")
def logical_postgres_server():
    """A PostgreSQL server with wal_level=logical for the change data capture tests (replication
    slots, pgoutput), apart from `postgres_server`: those tests also restart it."""
    from tests.postgres_server import PostgresServer

    server = PostgresServer(logical=True)
    server.start()
    yield server
    with reported_if_slow("the logical PostgreSQL server"):
        server.stop()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_backend(request, tmp_path_factory):
    """The serving-store backend a contract test runs against (tests/store_backends.py): every
    test that takes it runs once on SQLite files and once on the session's PostgreSQL server."""
    from tests.store_backends import PostgresBackend, SqliteBackend

    if request.param == "postgres":
        backend = PostgresBackend(request.getfixturevalue("postgres_server"))
    else:
        backend = SqliteBackend(lambda: tmp_path_factory.mktemp("store"))
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def kafka_broker_session(tmp_path_factory):
    """One real Apache Kafka broker (KRaft, single node) for the whole run, started on first
    use (~3 s with the jars there; the JVM's start dominates) and stopped at the end."""
    from tests.kafka_broker import KafkaBroker

    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    broker.start()
    yield broker
    # Killed, not shut down: its data is thrown away with the run's temporary folder, and a
    # controlled shutdown of the few thousand partitions a whole run creates took 35 s to a minute
    # under load (tests/kafka_broker.py `stop`), most of the unexplained teardown after the last test.
    with reported_if_slow("the Kafka broker"):
        broker.stop(kill=True)


@pytest.fixture
def kafka_broker(kafka_broker_session):
    """The session's broker, running: a test that stopped it (a restart scenario) and failed
    before starting it again does not take the broker away from the tests after it."""
    if not kafka_broker_session.running:
        kafka_broker_session.start()
    return kafka_broker_session


@pytest.fixture(scope="module", params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def log_backend(request):
    """The log a pipeline test runs on: the embedded SQLite log, or topics on the session's real
    Kafka broker (read by Spark's Kafka source). One fixture for every test that runs on both
    (tests/log_backends.py). Module-scoped, so a module's shared fixtures (a drained reference
    run) are built once per backend; each test makes its own log with `log_backend.new(root)`
    (Kafka: topics under a prefix of its own)."""
    from tests.log_backends import make_backend

    return make_backend(request)


def every_id_once(items) -> None:
    """Collection fails on two items with one node id: xdist tells items apart by it and runs only one
    of them, with a green exit (older schemathesis gave every operation of the fuzz test one id)."""
    seen: set[str] = set()
    twice = sorted({item.nodeid for item in items if item.nodeid in seen or seen.add(item.nodeid)})
    if twice:
        raise pytest.UsageError(f"items share a node id (xdist would run only one of each): {twice[:5]}")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """The real-process lag scenario costs a Spark start-up (two, with the restart): when its
    browser variant (which runs the same scenario and checks the dashboard as well) is selected
    and not skipped, the process-only variant is skipped instead of paying for it twice."""
    from tests.e2e.lag_scenario import BROWSER_TEST, PROCESS_TEST

    def runs(item) -> bool:  # and counts: an expected failure does not stand in for the process-only variant
        return item.name == BROWSER_TEST and item.get_closest_marker("skip") is None \
            and item.get_closest_marker("xfail") is None

    def on_the_embedded_log(item) -> bool:  # the browser test's log; the Kafka variant still runs
        callspec = getattr(item, "callspec", None)
        return callspec is None or callspec.params.get("log_backend", "embedded") == "embedded"

    every_id_once(items)
    if any(runs(item) for item in items):
        skip = pytest.mark.skip(reason=f"the same scenario runs in {BROWSER_TEST} (tests/browser), with the dashboard")
        for item in items:
            if getattr(item, "originalname", item.name) == PROCESS_TEST and on_the_embedded_log(item):
                item.add_marker(skip)

"""One SparkSession (local[2]) for the whole run: start-up costs ~10 s. It carries Spark's Kafka
connector (jars/spark-kafka, from `make jars`) when present, so the Kafka variants of the
pipeline tests share it; and the `log_backend` fixture that runs a test on both logs."""

from __future__ import annotations

import pytest

from tests.spark.backends import BACKENDS, LogBackend, make_backend


@pytest.fixture(scope="session")
def spark():
    from aggregates.spark import build_spark, kafka_connector_conf
    from sketchboard.settings import Settings

    try:
        extra = kafka_connector_conf(Settings.model_fields["spark_kafka_jars"].default)
    except FileNotFoundError:  # no `make jars` yet: the Kafka variants skip (tests/spark/backends.py)
        extra = {}
    session = build_spark("local[2]", app_name="sketchboard-tests", driver_memory="1g", extra_conf=extra)
    yield session
    session.stop()


@pytest.fixture(scope="module", params=BACKENDS)
def log_backend(request) -> LogBackend:
    """The log a pipeline test runs on: the embedded SQLite log, or topics on the session's real
    Kafka broker (read by Spark's Kafka source). Module-scoped, so a module's shared fixtures
    (a drained reference run) are built once per backend; each test makes its own log with
    `log_backend.new(root)` (Kafka: topics under a prefix of its own)."""
    return make_backend(request)

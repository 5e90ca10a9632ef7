"""One SparkSession (local[2]) for the whole run: start-up costs ~10 s. It carries Spark's Kafka
connector (jars/spark-kafka, from `make jars`) when present, so the Kafka variants of the
pipeline tests (the `log_backend` fixture, tests/conftest.py) share it."""

from __future__ import annotations

import pytest

from tests.support.teardown import reported_if_slow


@pytest.fixture(scope="session")
def spark():
    from aggregates.spark import build_spark, kafka_connector_conf
    from sketchboard.settings import Settings

    try:
        extra = kafka_connector_conf(Settings.model_fields["spark_kafka_jars"].default)
    except FileNotFoundError:  # no `make jars` yet: the Kafka variants fail saying so (tests/log_backends.py)
        extra = {}
    session = build_spark("local[2]", app_name="sketchboard-tests", driver_memory="1g", extra_conf=extra)
    yield session
    # A slow stop names what was still running (a query a test left active waits for its batch).
    active = [q.name or str(q.id) for q in session.streams.active]
    with reported_if_slow(f"the SparkSession (queries still active: {', '.join(active) or 'none'})"):
        session.stop()

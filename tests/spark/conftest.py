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


@pytest.fixture(autouse=True)
def _progress_listeners_removed(monkeypatch):
    """Each pipeline built registers a Python progress listener on the session's listener bus
    (aggregates/progress.py `register`); the service takes its own off when it stops
    (sketchboard/live.py), but a test's pipeline is just dropped. Left on, every later progress
    event went to every earlier test's listener through a Py4J callback: the listener queue fell
    behind, and stopping the SparkSession at the end of a run waited 98-561 s for it to drain
    (thread dumps: `AsyncEventQueue.stop` joining `spark-listener-group-streams`, busy in
    `PythonStreamingQueryListenerWrapper.onQueryProgress`). So they are removed after each test."""
    import aggregates.progress as progress

    added = []
    register = progress.register

    def tracked(spark, *args, **kwargs):
        recorder = register(spark, *args, **kwargs)
        added.append((spark, recorder))
        return recorder

    monkeypatch.setattr(progress, "register", tracked)
    yield
    for spark, recorder in added:
        try:
            spark.streams.removeListener(recorder)
        except Exception:  # a session a test stopped itself: nothing left to remove
            pass

"""The pipeline's SparkSession started at its first use (aggregates/spark.py `LazySpark`): not by
building a pipeline, registering or removing its progress listener, nor reading its master or
settings; once when something asks the session for anything, with the listeners registered
before that first use sees the session. (`tests/e2e/test_up.py` checks a real `sketchboard up`
serving events starts no JVM.)"""

from __future__ import annotations

import pytest

from aggregates.spark import LazySpark, add_listener, conf_value, master_of, remove_listener


class Streams:
    def __init__(self, calls):
        self.calls = calls

    def addListener(self, listener):  # noqa: N802 (Spark's name)
        self.calls.append(("add", listener))

    def removeListener(self, listener):  # noqa: N802
        self.calls.append(("remove", listener))


class Session:
    """What build_spark would return, as far as these calls go (a real one starts a JVM)."""

    def __init__(self, calls):
        self.streams, self.readStream = Streams(calls), "the session's readStream"
        self.conf = {"spark.sql.streaming.minBatchesToRetain": "7"}


@pytest.fixture
def lazy():
    calls = []

    def build():
        calls.append("started")
        return Session(calls)

    return LazySpark("local[2]", build, {"spark.sql.streaming.minBatchesToRetain": "5"}), calls


def test_nothing_starts_it_but_a_use_of_the_session(lazy):
    spark, calls = lazy
    add_listener(spark, "kept")
    add_listener(spark, "removed")
    remove_listener(spark, "removed")
    assert master_of(spark) == "local[2]" and conf_value(spark, "spark.sql.streaming.minBatchesToRetain", "100") == "5"
    assert conf_value(spark, "spark.other", "100") == "100"
    assert calls == [] and not spark.started
    with pytest.raises(AttributeError):
        spark._private  # copy and pickle probe such names: never a start
    assert calls == []
    # The first use starts it, with the listeners still asked for on its bus first; once.
    assert spark.readStream == "the session's readStream"
    assert calls == ["started", ("add", "kept")] and spark.started
    assert spark.readStream and calls.count("started") == 1
    add_listener(spark, "later")
    remove_listener(spark, "kept")
    assert calls[2:] == [("add", "later"), ("remove", "kept")]
    assert conf_value(spark, "spark.sql.streaming.minBatchesToRetain", "100") == "7"  # the session's own now


def test_a_start_that_fails_says_why_and_is_tried_again_at_the_next_use():
    tries = []

    def build():
        tries.append(1)
        raise RuntimeError("JAVA_HOME is not set")

    spark = LazySpark("local[2]", build)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="JAVA_HOME"):
            spark.sparkContext
    assert len(tries) == 2 and not spark.started


def test_a_driver_path_that_needs_a_spark_context_starts_the_session_once_and_says_where(lazy, caplog):
    from pyspark import SparkContext
    from pyspark.sql import functions as F

    from aggregates.spark import start_for_missing_context

    if SparkContext._active_spark_context is not None:  # run beside the Spark tests: F.col has its context
        pytest.skip("a SparkContext is active in this process")

    spark, calls = lazy
    with pytest.raises(AssertionError) as ours:
        assert calls, "an assertion of our own"  # a real failure: never taken for a missing context
    assert start_for_missing_context(spark, ours.value) is False and calls == []
    with pytest.raises(AssertionError) as raised:
        F.col("stream")  # no SparkContext in this process: what pyspark says on a driver path that builds one
    with caplog.at_level("WARNING", logger="sketchboard.spark"):
        assert start_for_missing_context(spark, raised.value) is True
    assert calls == ["started"] and "test_lazy_spark.py" in caplog.text  # the line to make lazy next
    assert start_for_missing_context(spark, raised.value) is False  # started: the error is a real one now
    assert start_for_missing_context(LazySpark("local[2]", lambda: None), RuntimeError("other")) is False

"""A failure met while stopping: the stop's own doing exits 0, a real failure that came with it exits 1
(sketchboard/stop_failures.py, sketchboard/live.py run_pipeline). No JVM: the pipeline and its query
are stand-ins, their failures the texts Spark and Py4J give."""

from __future__ import annotations

import gc
import logging
import sqlite3
import threading

import pytest

import aggregates.batch_gate as batch_gate
import aggregates.bounded_batches as bounded_batches
import sketchboard.wiring as wiring
from aggregates.batch_gate import Stopping
from aggregates.commit_retry import commit_with_retry
from sketchboard.live import run_pipeline
from sketchboard.stop_failures import caused_by_stop


class _JavaErrorOfAGoneJvm(Exception):
    """As py4j's Py4JJavaError once the JVM is gone: its text is asked of the JVM, and that call fails."""

    def __str__(self) -> str:
        raise ConnectionRefusedError(111, "Connection refused")


class StreamingQueryException(Exception):
    """As pyspark's: the batch's Python error, as text, inside Spark's."""


def _given_up_on_the_stop() -> sqlite3.OperationalError:
    def commit():
        raise sqlite3.OperationalError("database is locked")

    with pytest.raises(sqlite3.OperationalError) as raised:
        commit_with_retry(commit, wait=lambda s: True, report=lambda e, a: None)
    return raised.value


STOP_CAUSED = [
    Stopping("batch 4 not processed: the pipeline is stopping"),
    StreamingQueryException("[FOREACH_BATCH_USER_FUNCTION_ERROR] ... aggregates.batch_gate.Stopping: batch 4 not"
                            " processed: the pipeline is stopping"),
    StreamingQueryException("Job 12 cancelled because SparkContext was shut down"),
    StreamingQueryException("java.lang.IllegalStateException: SparkContext has been shutdown"),
    StreamingQueryException("Cannot call methods on a stopped SparkContext."),
    StreamingQueryException("Job 3 cancelled part of cancelled job group: Query main [id = a, runId = b] was stopped"),
    StreamingQueryException("... org.apache.spark.api.python.PythonException: Traceback ...\nKeyboardInterrupt"),
    StreamingQueryException("... org.apache.spark.SparkException: Python worker exited unexpectedly (crashed)"),
    StreamingQueryException("Job 7 cancelled as part of cancellation of all jobs"),
    StreamingQueryException("... java.net.SocketException: Connection reset"),
    StreamingQueryException("... org.apache.spark.rpc.RpcEnvStoppedException: RpcEnv already stopped."),
    StreamingQueryException("... java.util.concurrent.RejectedExecutionException: Task rejected from pool"),
    ConnectionRefusedError(111, "Connection refused"),
    _JavaErrorOfAGoneJvm(),
]

REAL = [
    StreamingQueryException("[FOREACH_BATCH_USER_FUNCTION_ERROR] ... sqlite3.IntegrityError: NOT NULL constraint"
                            " failed: panes.count"),
    StreamingQueryException("... ValueError: a bad record: event time 'yesterday' is not a number"),
    sqlite3.OperationalError("database or disk is full"),  # not given up on the stop: the store refused
    RuntimeError("psycopg.OperationalError: connection to server at 10.0.0.5 failed: Connection refused"),
]


@pytest.mark.parametrize("error", STOP_CAUSED, ids=lambda e: type(e).__name__)
def test_the_stops_own_failures_are_the_stop(error):
    assert caused_by_stop(error)


@pytest.mark.parametrize("error", REAL, ids=lambda e: type(e).__name__)
def test_a_real_failure_is_not_the_stop(error):
    assert not caused_by_stop(error)


def test_a_commit_retry_given_up_on_the_stop_says_so_in_its_text():
    error = _given_up_on_the_stop()
    assert caused_by_stop(error)
    # ... also as Spark hands it back: the Python traceback as text, notes included
    import traceback
    assert caused_by_stop(StreamingQueryException("".join(traceback.format_exception(error))))


class _Query:
    isActive = False

    def __init__(self, failure):
        self.failure = failure

    def exception(self):
        return self.failure


class _Pipeline:
    """The loop's view of a pipeline whose one query has failed with `failure`."""

    spark = progress_recorder = gate = None

    def __init__(self, failure, stopping):
        self.failure, self.stopping = failure, stopping
        self.config = type("Config", (), {"name": "main", "checkpoint_dir": "/nowhere"})()

    def catch_up(self, stopping):
        pass

    def start(self):
        self.stopping.set()  # the signal comes while the query runs, and it has failed meanwhile
        return _Query(self.failure)

    def retry_copies(self):
        pass


def _run_stopped_with(monkeypatch, failure, **options) -> int:
    stopping = threading.Event()
    monkeypatch.setattr(wiring, "build_pipeline", lambda *a, **k: _Pipeline(failure, stopping))
    monkeypatch.setattr(bounded_batches, "drains_on_driver", lambda pipeline: False)
    monkeypatch.setattr(batch_gate, "remove_listeners", lambda *a, **k: None)
    monkeypatch.setattr(batch_gate, "stop_between_batches", lambda *a, **k: True)
    return run_pipeline(settings=None, stopping=stopping, **options)


def test_the_pipelines_own_process_moves_what_start_up_built_out_of_the_collectors_reach(monkeypatch):
    # The collections between batches scanned every module, Spark's gateway and the catalog each time.
    built = []

    def build(*a, **k):
        built.append(_Pipeline(None, stopping))
        return built[-1]

    stopping = threading.Event()
    monkeypatch.setattr(wiring, "build_pipeline", build)
    monkeypatch.setattr(bounded_batches, "drains_on_driver", lambda pipeline: False)
    monkeypatch.setattr(batch_gate, "remove_listeners", lambda *a, **k: None)
    try:
        assert run_pipeline(settings=None, stopping=stopping, freeze_start_up=True) == 0
        assert gc.get_freeze_count() > 0
        assert not any(o is built[0] for o in gc.get_objects())  # the permanent generation's are not listed
    finally:
        gc.unfreeze()  # the test process's objects back where they were
    assert run_pipeline(settings=None, stopping=stopping) == 0  # a caller's own process: nothing frozen
    assert gc.get_freeze_count() == 0 and any(o is built[1] for o in gc.get_objects())


@pytest.mark.parametrize("failure", REAL, ids=lambda e: type(e).__name__)
def test_a_real_query_failure_that_came_with_a_stop_exits_1(monkeypatch, caplog, failure):
    with caplog.at_level(logging.ERROR, logger="sketchboard"):
        assert _run_stopped_with(monkeypatch, failure) == 1
    assert "pipeline failed: " in caplog.text


@pytest.mark.parametrize("failure", STOP_CAUSED, ids=lambda e: type(e).__name__)
def test_a_query_failure_the_stop_caused_exits_0(monkeypatch, caplog, failure):
    with caplog.at_level(logging.ERROR, logger="sketchboard"):
        assert _run_stopped_with(monkeypatch, failure) == 0
    assert "pipeline failed" not in caplog.text

"""Recording Spark's own view of the pipeline query (StreamingQueryListener) into the store,
so the API process can serve input/processed rows/s, batch durations, the watermark and the
last error while the pipeline runs in another process.

PySpark 4 calls Python listeners registered with `spark.streams.addListener` from the
listener bus (through Py4J's callback server in classic mode): callbacks must be quick and
must never raise, or Spark logs and drops them.
"""

from __future__ import annotations

import atexit
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from datetime import datetime, timezone

from pyspark.sql.streaming import StreamingQueryListener

from aggregates.batch_gate import Stopping

log = logging.getLogger("sketchboard.progress")

# How a batch refused by a stopping pipeline's gate shows in the query's exception (its traceback).
STOPPING = f"{Stopping.__module__}.{Stopping.__qualname__}"


class ProgressRecorder(StreamingQueryListener):
    """Writes the events of the query named `query_name` into a health store
    (store.health.SqliteHealthStore); events of other queries are ignored."""

    def __init__(self, health_store, pipeline: str, query_name: str, *, clock: Callable[[], float] = time.time,
                 input_rows: Callable[[int], int | None] | None = None):
        super().__init__()
        self.health = health_store
        self.pipeline = pipeline
        self.query_name = query_name
        self.clock = clock
        self._runs: set[str] = set()  # run ids of our query (terminated events carry no name)
        # The records the pipeline read itself for a batch (Pipeline.rows_read_on_driver.get): a
        # small batch of the embedded log is read on the driver and Spark's DataFrame never runs,
        # so Spark counts no input rows for it; then these are reported instead.
        self.input_rows = input_rows
        self._trigger_ms: dict[str, int] = {}  # run id -> its last trigger's start (rows per second)
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)
        # A process that exits after query.stop() may not live to see onQueryTerminated (the
        # listener bus is asynchronous): record the stop on the way out too.
        atexit.register(self._exiting)

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def onQueryStarted(self, event) -> None:
        if event.name != self.query_name:
            return
        with self._lock:
            self._runs.add(str(event.runId))
        self._safely(self.health.started, self.pipeline, str(event.id), str(event.runId), event.name,
                     _iso_ms(event.timestamp) or self._now_ms())

    def onQueryProgress(self, event) -> None:
        progress = event.progress
        if progress.name != self.query_name:
            return
        run_id = str(progress.runId)
        with self._lock:
            self._runs.add(run_id)
        data = json.loads(progress.json)
        started = _iso_ms(data.get("timestamp"))
        previous, self._trigger_ms[run_id] = self._trigger_ms.get(run_id), started
        read = self.input_rows(progress.batchId) if self.input_rows is not None else None
        if read and not data.get("numInputRows"):
            data = with_input_rows(data, read, None if previous is None or started is None else started - previous)
        self._safely(self.health.progress, self.pipeline, run_id, progress.batchId, data, self._now_ms())

    def onQueryIdle(self, event) -> None:
        run_id = str(event.runId)
        if run_id in self._runs:
            self._safely(self.health.idle, self.pipeline, run_id, self._now_ms())

    def onQueryTerminated(self, event) -> None:
        run_id = str(event.runId)
        if run_id not in self._runs:
            return
        error = event.exception
        if error and STOPPING in error:
            # A batch that began after a stop was asked for was refused (aggregates/batch_gate.py):
            # the query ends with that refusal before query.stop() ends it. A clean stop, not an error.
            error = None
        if error and event.errorClassOnException:
            error = f"[{event.errorClassOnException}] {error}"
        self._safely(self.health.terminated, self.pipeline, run_id, error, self._now_ms())
        with self._lock:
            self._runs.discard(run_id)
            self._ended.notify_all()

    def own_run_started(self, query_id: str) -> str:
        """A run of batches of the pipeline's own, with no Spark query (a catch-up,
        aggregates/bounded_batches.py `drain_bounded`): recorded as a run of the query, so its health
        says running, with each batch's progress, while it catches up. Returns the run's id."""
        run_id = f"own-{uuid.uuid4()}"
        with self._lock:
            self._runs.add(run_id)
        self._safely(self.health.started, self.pipeline, query_id, run_id, self.query_name, self._now_ms())
        return run_id

    def own_batch(self, query_id: str, run_id: str, batch_id: int, rows: int, started_ms: int, took_ms: int) -> None:
        """One batch of an own run: its progress in the shape of Spark's (the fields query_health reads)."""
        previous, self._trigger_ms[run_id] = self._trigger_ms.get(run_id), started_ms
        started = datetime.fromtimestamp(started_ms / 1000, timezone.utc).isoformat(timespec="milliseconds")
        data = {"id": query_id, "runId": run_id, "name": self.query_name, "ownBatch": True,
                "timestamp": started.replace("+00:00", "Z"), "batchId": batch_id, "batchDuration": took_ms,
                "durationMs": {"triggerExecution": took_ms}}
        data = with_input_rows(data, rows, None if previous is None else started_ms - previous)
        self._safely(self.health.progress, self.pipeline, run_id, batch_id, data, self._now_ms())

    def own_idle(self, run_id: str) -> None:
        """An own run waiting for records, as Spark's idle event says it of its query (health's beat)."""
        self._safely(self.health.idle, self.pipeline, run_id, self._now_ms())

    def own_run_ended(self, run_id: str, error: str | None = None) -> None:
        self._trigger_ms.pop(run_id, None)
        self._safely(self.health.terminated, self.pipeline, run_id, error, self._now_ms())
        with self._lock:
            self._runs.discard(run_id)
            self._ended.notify_all()

    def settle(self, timeout_s: float) -> bool:
        """Wait until Spark's listener bus has told us that every run of ours ended, so the
        process can remove this listener and exit with nothing left to deliver (a Python
        listener called after its process shut Py4J down is a logged error)."""
        with self._lock:
            return self._ended.wait_for(lambda: not self._runs, timeout=timeout_s)

    def stopped(self, error: str | None = None) -> None:
        """Record that every run of ours ended (called on shutdown; idempotent)."""
        with self._lock:
            runs, self._runs = list(self._runs), set()
        for run_id in runs:
            self._safely(self.health.terminated, self.pipeline, run_id, error, self._now_ms())

    def _exiting(self) -> None:
        self.stopped()

    def _safely(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as exc:  # never let the listener bus see an exception
            log.warning("recording query progress failed: %s", exc)


class OwnRunProgress:
    """The progress of a run of batches of the pipeline's own into a ProgressRecorder (none: nothing
    recorded): the run starts with its first batch (or `begin`), each batch's progress once it is
    committed, idle beats while it waits (`idle`), and the run ends with the block (with the error
    that ended it, if one did)."""

    def __init__(self, recorder: ProgressRecorder | None, query_id: str):
        self.recorder, self.query_id, self.run_id = recorder, query_id, None

    def __enter__(self) -> OwnRunProgress:
        return self

    def begin(self) -> None:
        """Start the run now, before any batch (a serving loop: running while it waits for records)."""
        if self.recorder is not None and self.run_id is None:
            self.run_id = self.recorder.own_run_started(self.query_id)

    def idle(self) -> None:
        """A beat of a run waiting for records (the query's health says it is alive, not stale)."""
        self.begin()
        if self.run_id is not None:
            self.recorder.own_idle(self.run_id)

    @contextmanager
    def batch(self, batch_id: int, rows: int | Callable[[], int]):
        """`rows`: the batch's input rows, or what says them once it ran (the rows it read)."""
        self.begin()
        started = time.time()
        yield
        if self.recorder is not None:
            self.recorder.own_batch(self.query_id, self.run_id, batch_id, rows() if callable(rows) else rows,
                                    int(started * 1000), int((time.time() - started) * 1000))

    def __exit__(self, kind, error, _traceback) -> None:
        if self.run_id is not None:
            # A batch refused because the pipeline is stopping (aggregates/batch_gate.py): a clean stop.
            failed = error is not None and not isinstance(error, Stopping)
            self.recorder.own_run_ended(self.run_id, f"{kind.__name__}: {error}" if failed else None)
            self.run_id = None


def with_input_rows(progress: dict, rows: int, since_previous_ms: int | None) -> dict:
    """Spark's progress of a batch it counted no input rows for, with the `rows` the pipeline read
    itself, and the rates Spark derives from them: per second since the previous trigger started
    (`since_previous_ms`; unknown for a run's first: left as Spark wrote it) and per second of this
    trigger's execution."""
    out = dict(progress, numInputRows=rows)
    if since_previous_ms:
        out["inputRowsPerSecond"] = rows * 1000 / since_previous_ms
    took = (progress.get("durationMs") or {}).get("triggerExecution")
    if took:
        out["processedRowsPerSecond"] = rows * 1000 / took
    sources = progress.get("sources") or []
    if len(sources) == 1:  # one source, the embedded log's: its share is the whole
        out["sources"] = [{**sources[0], **{k: out[k] for k in ("numInputRows", "inputRowsPerSecond",
                                                               "processedRowsPerSecond") if k in out}}]
    return out


def register(spark, health_store, pipeline: str, query_name: str, **kwargs) -> ProgressRecorder:
    from aggregates.spark import add_listener

    recorder = ProgressRecorder(health_store, pipeline, query_name, **kwargs)
    add_listener(spark, recorder)  # a LazySpark's when it starts
    return recorder


def _iso_ms(text: str | None) -> int | None:
    """Spark's event timestamps ('2026-11-21T06:30:00.123Z') as epoch ms."""
    if not text:
        return None
    try:
        return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None

"""Stopping a streaming query between batches, not in the middle of one.

`query.stop()` interrupts Spark's stream thread wherever it is. In the middle of a
foreachBatch that is one of our Spark jobs (a `collect`), which then fails with an
InterruptedException that Py4J prints as a long traceback, and Spark's listener bus reports
the Python listener gone. Nothing is lost (the store never saw the batch, and Spark replays it
from its offset log at the next start), but a SIGTERM from a service manager should be a clean
stop. So every foreachBatch call goes through a gate:

- `close()` lets no new batch start its work (the call raises `Stopping` at once, before any
  Spark job: the batch is replayed at the next start, exactly as an interrupted one would be);
- `wait_idle()` waits, bounded, for the batch that is running to commit to the store;
- then the query is stopped, with the stop's expected noise (Spark's warnings about the
  interrupted trigger, Py4J's report of the refused call) silenced, and one line said instead
  when the wait ran out."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)


# In the text of every failure the stop causes (Stopping; a commit's retry given up on the stop,
# aggregates/commit_retry.py): Spark hands a batch's Python error back as text, and the pipeline's
# loop tells the stop's failures from real ones by it (sketchboard/stop_failures.py).
STOPPING_MARK = "the pipeline is stopping"


class Stopping(RuntimeError):
    """A batch that began after the stop was asked for: not processed, replayed at the next start."""


class BatchGate:
    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._running = 0
        self._closed = False
        self._stopping = threading.Event()

    def wrap(self, process_batch: Callable) -> Callable:
        def run(batch, batch_id):
            with self._changed:
                if self._closed:
                    raise Stopping(f"batch {batch_id} not processed: {STOPPING_MARK}")
                self._running += 1
            try:
                return process_batch(batch, batch_id)
            finally:
                with self._changed:
                    self._running -= 1
                    self._changed.notify_all()

        return run

    def close(self) -> None:
        with self._changed:
            self._closed = True
        self._stopping.set()

    def sleep(self, seconds: float) -> bool:
        """Sleep inside a batch (a retry's back-off); True, at once, when the stop comes."""
        return self._stopping.wait(seconds)

    @property
    def running(self) -> bool:
        with self._changed:
            return self._running > 0

    def wait_idle(self, timeout_s: float) -> bool:
        """True once no batch is running; False if one still is after timeout_s."""
        with self._changed:
            return self._changed.wait_for(lambda: self._running == 0, timeout=timeout_s)


def stop_between_batches(spark, queries: Iterable[tuple[object, BatchGate]], *, listeners: Iterable = (),
                         timeout_s: float = 60.0) -> bool:
    """Stop the queries once their running batches have committed (or at the deadline); True
    when no batch was cut short."""
    queries = list(queries)
    # What follows is expected and harmless, and would read as failures: Spark's warnings about the
    # trigger the stop interrupts, Py4J's report of a refused (Stopping) or interrupted call.
    # Quieted before the gates close: a query whose next batch begins right after (the session
    # queries trigger often) is refused at once, and its report must not reach the output.
    logging.getLogger("py4j.clientserver").setLevel(logging.CRITICAL)
    spark.sparkContext.setLogLevel("OFF")
    for _, gate in queries:
        gate.close()
    idle = all([gate.wait_idle(timeout_s) for _, gate in queries])
    for query, _ in queries:
        query.stop()
    remove_listeners(spark, listeners)
    if not idle:
        log.info("stopped in the middle of a batch (still running after %.0f s); it is replayed at the next start",
                 timeout_s)
    return idle


def remove_listeners(spark, listeners: Iterable, settle_s: float = 5.0) -> None:
    """Spark's listener bus delivers events asynchronously: one delivered to a Python process on
    its way out fails with a Py4J network error. Let each listener see its queries end (bounded),
    then take it off the bus (a session never started: off the list it would register them from);
    the recorders also mark their runs stopped at exit."""
    from aggregates.spark import remove_listener

    for listener in listeners:
        settle = getattr(listener, "settle", None)
        if settle is not None:
            settle(settle_s)
        remove_listener(spark, listener)

"""`sketchboard pipeline`'s loop: run the pipeline (its one query; sessions run inside its batches) until told to stop.
With every batch on the driver (a local master; on Kafka, the topics read by the pipeline's own consumer), there is no
Spark query at all: the pipeline triggers batches of its own (aggregates/driver_serving.py). Elsewhere it runs Spark's query, after catching up a
backlog in batches of its own (`Pipeline.catch_up`, aggregates/bounded_batches.py): on Kafka, one over `max_records_per_batch`
cut at one append time where Spark's Kafka source would split it by partition (docs/tables.md), and again whenever the query refused a
batch its source may have split so (a burst while it serves); and start it again, in the same process
and Spark session, when a switch fenced one of its batches (docs/reprocessing.md#switch): built again, it applies
the switch's offset move to its checkpoint and computes the stream with the new definition; and, a few times, when
a batch failed on the host's load rather than on its data (sketchboard/restarts.py). Any other failure ends the
loop, with exit status 1: also one that came with a stop but was not caused by it (sketchboard/stop_failures.py)."""

from __future__ import annotations

import gc
import logging
import threading
import time

from sketchboard.definitions import switched
from sketchboard.restarts import RestartBudget, transient
from sketchboard.settings import Settings
from sketchboard.stop_failures import caused_by_stop, first_line

log = logging.getLogger("sketchboard")


def run_pipeline(settings: Settings, stopping: threading.Event, *, name: str | None = None, start: str | None = None,
                 once: bool = False, spark=None, freeze_start_up: bool = False) -> int:
    """0 when stopped (or, with `once`, drained); 1 when a query failed for another reason than a switch.
    `freeze_start_up`: the process is the pipeline's own (`sketchboard pipeline`), see below."""
    from aggregates.batch_gate import Stopping, remove_listeners, stop_between_batches
    from aggregates.bounded_batches import drains_on_driver, split_by_spark
    from aggregates.driver_serving import serve_on_driver
    from aggregates.spark import SparkNeeded
    from sketchboard.wiring import build_pipeline

    pipeline = build_pipeline(settings, spark, name=name, starting_offsets=start)
    if freeze_start_up:
        # What start-up loaded (modules, Spark's gateway, the catalog, the kernels) is moved out of
        # the collector's reach, as the API process does (sketchboard/cli.py): the collections that
        # run between batches scanned it all each time, ~4 % of the pipeline's CPU in the end to end
        # (docs/benchmarks.md, session 101). Not where the caller's process has more of its own.
        gc.collect()
        gc.freeze()
    budget = RestartBudget()

    def restartable(failure) -> bool:
        if switched(failure) or split_by_spark(failure):  # the latter: caught up cut at one append time first
            return True
        if isinstance(failure, SparkNeeded):  # its session started: the batch runs again in a pipeline built anew
            return True
        if transient(failure) and budget.allow(time.monotonic()):
            log.warning("a batch failed on the host's load, not on its data: starting the pipeline again from its"
                        " checkpoint (%s)", str(failure).splitlines()[0][:200])
            return True
        return False

    def stop_ends(failure) -> int:
        """Exit status of a failure met while stopping: 0 for the stop's own doing, or for one the
        loop would have restarted from (replayed at the next start anyway); 1 for a real failure."""
        if caused_by_stop(failure) or switched(failure) or split_by_spark(failure) or transient(failure) \
                or isinstance(failure, SparkNeeded):
            return _stopped_with_spark(failure)
        log.error("pipeline failed: %s", first_line(failure))
        return 1

    while True:
        if once:
            try:  # on Kafka, a backlog of a pipeline that enriches: cut at one append time first
                pipeline.run_until_drained(stopping.is_set)
            except Exception as exc:  # Spark's StreamingQueryException, with the store's error inside
                if not restartable(exc):
                    raise
                if switched(exc):
                    log.warning("a stream's output was switched to another definition: restarting the pipeline")
                remove_listeners(pipeline.spark, [pipeline.progress_recorder])
                pipeline.store.close()  # as the serving loop's restarts do: its connection and checkpoint thread
                pipeline = build_pipeline(settings, pipeline.spark, name=name, starting_offsets=start)
                continue
            remove_listeners(pipeline.spark, [pipeline.progress_recorder])  # nothing left to deliver at exit
            return 0
        try:
            if drains_on_driver(pipeline):  # every batch on the driver: no Spark query at all, until stopped
                serve_on_driver(pipeline, stopping.is_set, stopping.wait)
            else:  # a backlog in batches of our own first (Kafka's, cut at one append time)
                pipeline.catch_up(stopping.is_set)
        except Exception as exc:  # as a failed batch of the query below
            if stopping.is_set() and caused_by_stop(exc):  # refused by the closed gate, a retry given up on the stop
                (log.info if isinstance(exc, Stopping) else log.warning)(  # first_line: str() may ask a gone JVM
                    "stopped; the batch under way is not recorded and runs again at the next start (%s)",
                    first_line(exc))
                remove_listeners(pipeline.spark, [pipeline.progress_recorder])
                return 0
            if stopping.is_set():  # a failure that came with the stop: a real one is not hidden behind it
                remove_listeners(pipeline.spark, [pipeline.progress_recorder])
                return stop_ends(exc)
            if not restartable(exc):
                log.error("pipeline failed: %s", exc)
                remove_listeners(pipeline.spark, [pipeline.progress_recorder])
                return 1
            if switched(exc):
                log.warning("a stream's output was switched to another definition: restarting the pipeline")
            remove_listeners(pipeline.spark, [pipeline.progress_recorder])
            pipeline.store.close()
            pipeline = build_pipeline(settings, pipeline.spark, name=name, starting_offsets=start)
            continue
        if stopping.is_set():  # told to stop between our own batches
            remove_listeners(pipeline.spark, [pipeline.progress_recorder])
            return 0
        query = pipeline.start()
        log.info("pipeline %r running (checkpoints in %s)", pipeline.config.name, pipeline.config.checkpoint_dir)
        try:
            while not stopping.is_set() and query.isActive:
                stopping.wait(1)
                pipeline.retry_copies()  # the offsets' copies a batch failed to make, while no batch does
            failures = [f for f in (query.exception(),) if f]
        except Exception as exc:  # Spark's JVM gone under a signal to the process group: see _stopped_with_spark
            if not stopping.is_set():
                raise
            # A Py4J call of ours (isActive, exception()) failed while stopping: the JVM going with the
            # signal, whatever its words; a failure of the query itself is read below, not here.
            return _stopped_with_spark(exc)
        if failures and stopping.is_set():
            return stop_ends(failures[0])
        running = [(query, pipeline.gate)]
        if failures and not stopping.is_set() and all(restartable(f) for f in failures):
            # A switch fenced a batch computed the old way: start again with the new definition, from
            # the offsets the switch moved into the checkpoint. Or the host's load failed a batch.
            if any(switched(f) for f in failures):
                log.warning("a stream's output was switched to another definition: restarting the pipeline")
            if any(split_by_spark(f) for f in failures):
                log.info("a batch Spark's Kafka source may have shared by partition was refused: catching the"
                         " backlog up in batches cut at one append time, then starting the query again")
            stop_between_batches(pipeline.spark, running, listeners=[pipeline.progress_recorder])
            pipeline.store.close()
            pipeline = build_pipeline(settings, pipeline.spark, name=name, starting_offsets=start)
            continue
        for failure in failures:
            log.error("pipeline failed: %s", failure)
            return 1
        log.info("stopping: letting the running batch commit first")
        try:
            stop_between_batches(pipeline.spark, running, listeners=[pipeline.progress_recorder])
        except Exception as exc:  # the query was running without a failure when the stop came: its stop
            return _stopped_with_spark(exc)  # failed on the JVM going too (Py4J's words vary with the moment)
        return 0


def _stopped_with_spark(error: BaseException) -> int:
    """A stop asked for (SIGTERM, SIGINT) while Spark's JVM was stopping too: a signal to the whole
    process group (systemd's default KillMode, Ctrl-C in a terminal, `docker stop` of a shell's
    children) reaches the JVM, whose shutdown hook stops the SparkContext and the query under the
    batch being waited for. That is the stop asked for, not a failure: the batch under way was not
    committed and runs again from the checkpoint at the next start (the store records each batch
    with its id in the commit's transaction), so the exit status is 0."""
    log.warning("stopped; Spark's JVM stopped with the signal too, so the batch under way is not recorded and runs"
                " again at the next start (%s)", first_line(error))
    return 0

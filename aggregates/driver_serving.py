"""Serving the log with batches of the pipeline's own, with no Spark query at all.

With every batch held on the driver (a local master, the default: aggregates/bounded_batches.py
`drains_on_driver`; on Kafka `reads_kafka_on_driver`, the topics read by the pipeline's own
consumer), Spark's streaming query only plans batches the
driver then reads and runs itself, and that planning is most of a small batch's time: measured here,
a micro-batch of ~150 events took 1.1-1.5 s through Spark's query, and a Python worker process per
planning step holds a core. So `sketchboard pipeline` serves such a log with a trigger loop of its
own: every `trigger_interval` (Spark's processing-time trigger: the next multiple of the interval),
it drains what the log holds in batches planned, logged and committed exactly as a catch-up's are
(`drain_bounded`), so Spark's query, if it ever runs on the checkpoint again (another master, a
Kafka log), resumes after them. Around it, what Spark's query gave for free:

- the query's health: one run for the whole loop, started at once, each batch's progress, and an
  idle beat every 10 s without a batch (Spark's `noDataProgressEventInterval`), so a waiting
  pipeline is not taken for a dead one (store/health.py `STALE_AFTER_MS`);
- the checkpoint's offset and commit logs purged to the last `minBatchesToRetain` batches;
- a log that cannot be read (a Kafka broker away) waited out, trying again every second, as
  Spark's Kafka source waits it out;
- on the embedded log, one read-ahead worker (aggregates/read_ahead.py) for the whole loop, started
  on the first backlog of two batches more than the one running, not per trigger.

One thing Spark's AvailableNow does not: where what is left of a drain's backlog after the running
batch is a rest (less than a full batch), that rest is planned when the running batch
ends, so the records that came meanwhile join it (`follow_rest`) rather than making one more
batch after it (bounded_batches.py `is_remainder`). The first rest is planned again within the
drain; at a later one the drain ends, and the next drain plans it with what came meanwhile.

Nothing here needs Spark: the pipeline's session is a LazySpark (aggregates/spark.py), and its JVM
is never started while the loop serves.

A stop is asked between batches: the running one commits first, unless its commit is waiting a
failing store out (the stop closes the batch gate, as a Spark query's stop does: the batch is not
recorded and runs again at the next start). The timing is pure
(`next_trigger_ms`, `idle_due`; intervals read by catalog/durations.py `trigger_ms`); `serve_on_driver` does the I/O."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

from aggregates.bounded_batches import batches_to_retain, drain_bounded, own_batches, query_id_of
from aggregates.progress import OwnRunProgress
from catalog.durations import trigger_ms
from ingest.log import LogUnavailable

log = logging.getLogger("sketchboard.pipeline")

IDLE_EVERY_S = 10.0  # spark.sql.streaming.noDataProgressEventInterval's default
IDLE_POLL_S = 0.01  # a trigger with nothing to read waits at least this (Spark's pollingDelayMs): a 0 interval never spins
LOG_RETRY_S = 1.0  # a log that cannot be read (a Kafka broker away) is asked again this often


def next_trigger_ms(triggered_ms: int, interval_ms: int) -> int:
    """When the trigger after one that fired at `triggered_ms` fires: the next multiple of the
    interval, as Spark's ProcessingTimeExecutor times it (a batch that ran longer is followed at once)."""
    if interval_ms <= 0:
        return triggered_ms
    return (triggered_ms // interval_ms + 1) * interval_ms


def idle_due(last_beat_s: float, now_s: float, every_s: float = IDLE_EVERY_S) -> bool:
    """Whether a run with no batch since `last_beat_s` says it is waiting."""
    return now_s - last_beat_s >= every_s


def serve_on_driver(pipeline, stopping: Callable[[], bool], wait: Callable[[float], object], *,
                    clock: Callable[[], float] = time.monotonic, idle_every_s: float = IDLE_EVERY_S) -> None:
    """Serve the pipeline's log in batches of its own until `stopping()` (the module doc);
    `wait(seconds)` sleeps until the next trigger and returns early when a stop is asked for."""
    config = pipeline.config
    interval_ms = trigger_ms(config.trigger_interval)
    query_id = query_id_of(Path(config.checkpoint_dir))
    keep = batches_to_retain(pipeline)
    own = own_batches(pipeline)
    log.info("pipeline %r running its own batches of %s every %d ms (checkpoints in %s)", config.name,
             "Kafka's topics" if config.kafka is not None else "the embedded log", interval_ms, config.checkpoint_dir)
    # A stop closes the pipeline's batch gate, as a Spark query's stop does (aggregates/batch_gate.py):
    # a commit retrying a failing store (aggregates/commit_retry.py) gives up then instead of waiting
    # the store out; its batch was not recorded and runs again at the next start.
    serving = threading.Event()
    watcher = threading.Thread(target=_close_gate_on_stop, args=(pipeline.gate, stopping, serving), daemon=True,
                               name="pipeline-stop")
    watcher.start()
    try:
        with OwnRunProgress(getattr(pipeline, "progress_recorder", None), query_id) as progress, closing(own):
            progress.begin()
            last_beat = clock()
            away_since = None
            while not stopping():
                triggered = clock()
                try:
                    ran = drain_bounded(pipeline, {}, stopping, own=own, progress=progress, keep=keep,
                                      follow_rest=True)
                except LogUnavailable as exc:
                    # The broker away: waited out, as Spark's Kafka source waits it out; a batch it
                    # stopped was logged, not committed, and runs again with its range.
                    if away_since is None:
                        away_since = clock()
                        log.warning("the log cannot be read (%s): trying again every %g s", exc, LOG_RETRY_S)
                    wait(LOG_RETRY_S)
                    continue
                if away_since is not None:
                    log.warning("the log answers again after %.0f s", clock() - away_since)
                    away_since = None
                if ran:
                    last_beat = clock()
                else:
                    pipeline.retry_copies()  # a copy of the offsets that failed: no batch will make it
                    if idle_due(last_beat, clock(), idle_every_s):
                        progress.idle()
                        last_beat = clock()
                next_s = next_trigger_ms(int(triggered * 1000), interval_ms) / 1000 - clock()
                wait(max(0.0 if ran else IDLE_POLL_S, next_s))
    finally:
        serving.set()


def _close_gate_on_stop(gate, stopping: Callable[[], bool], serving_ended: threading.Event,
                        every_s: float = 0.2) -> None:
    while not serving_ended.wait(every_s):
        if stopping():
            gate.close()
            return

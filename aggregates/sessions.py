"""Session windows: per-key sessions ended by an inactivity gap, a stateful streaming query.

Panes cannot express sessions (a session's extent depends on the events themselves), so
each stream declaring `sessions: {key, gap}` gets its own query over the same log source,
with its own checkpoint directory:

    withWatermark(ts, allowed_lateness) . groupBy(key, session_window(ts, gap))
        -> first event, last event, events                (Spark's state store keeps open sessions)
    output mode append: a session is emitted once, when the watermark passes its end (last event + gap)

Each micro-batch of closed sessions becomes panes of the derived stream `<stream>_sessions`
(event time = session start; values duration_ms = last - first event and events; distinct
= the key) through the same per-batch partial aggregation and exactly-once store commit as
every other stream (pipeline name `<pipeline>-sessions-<stream>`, batch id recorded in the
same transaction). So `/api/v1/query` and the dashboard serve sessions like any metric:
sessions started per window (count), duration percentiles (KLL), events per session.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from aggregates.commit import build_commit
from aggregates.partials import partial_aggregates
from aggregates.batch_gate import BatchGate
from aggregates.pipeline import PipelineConfig, batch_end_offsets, configure_tiers, drain, read_log, start_query
from aggregates.store_commit import ReportsStoreErrors, StoreCommitter
from catalog import Catalog
from catalog.features import sessions_stream_name, source_field
from store import CommitResult, PaneStore

log = logging.getLogger("sketchboard.sessions")


def session_pipeline_name(pipeline: str, stream: str) -> str:
    return f"{pipeline}-sessions-{stream}"


class SessionPipeline(ReportsStoreErrors):
    def __init__(self, spark: SparkSession, catalog: Catalog, store: PaneStore, config: PipelineConfig, stream: str,
                 *, clock: Callable[[], float] = time.time):
        source = catalog.stream(stream)
        if source.sessions is None:
            raise ValueError(f"stream {stream!r} declares no sessions")
        self.spark, self.store, self.clock = spark, store, clock
        self.source = source
        self.derived = catalog.stream(sessions_stream_name(stream))
        self.name = session_pipeline_name(config.name, stream)
        self.checkpoint_dir = Path(config.checkpoint_dir).parent / self.name
        self.config = config
        self.gate = BatchGate()  # whether a batch is running: a stop waits for it (aggregates/batch_gate.py)
        # Store commits retried while the storage fails, reported under the serving pipeline's name
        # (the one the API shows) with this query's name in the message.
        self.committer = StoreCommitter(store, self.name, self.gate, log=log, clock=clock, reported_as=config.name)
        # The source reads only this stream; the aggregation knows only the derived stream. Without
        # its `enrich`: the tables are not in this catalog, and sessions carry no dimension of the
        # parent (the dimensions stay, so the log's columns read the same).
        self.source_catalog = Catalog(streams={stream: source.model_copy(update={"sessions": None, "enrich": ()})})
        self.derived_catalog = Catalog(streams={self.derived.name: self.derived})
        self.last_result: CommitResult | None = None
        self.last_watermark_ms: int | None = None
        configure_tiers(store, self.derived_catalog, clock)

    def sessions(self, events: DataFrame) -> DataFrame:
        """Closed sessions (append mode): key, first_ms, last_ms, events."""
        column, index = source_field(self.source, self.source.sessions.key)
        key = F.get(F.col(column), index)
        return (
            events.where(F.col("stream") == self.source.name)
            # Records the pane pipeline dead-letters as unparseable, invalid or from a clock in the future
            # stay out of sessions too (a future clock would drag this query's watermark ahead);
            # records beyond retention are far behind the watermark, which drops them.
            .where(F.col("error").isNull() & F.col("ingest_time").isNotNull()
                   & (F.col("event_time") <= F.col("ingest_time") + F.lit(self.source.max_future_skew)))
            .select(key.alias("key"), F.timestamp_millis("event_time").alias("ts"), "event_time")
            .where(F.col("key").isNotNull() & (F.col("key") != ""))
            .withWatermark("ts", f"{self.source.allowed_lateness} milliseconds")
            .groupBy("key", F.session_window("ts", f"{self.source.sessions.gap} milliseconds").alias("session"))
            .agg(F.min("event_time").alias("first_ms"), F.max("event_time").alias("last_ms"),
                 F.count(F.lit(1)).alias("events"))
        )

    def as_source_rows(self, sessions: DataFrame) -> DataFrame:
        """Closed sessions in the log source's row shape, as events of the derived stream."""
        return sessions.select(
            F.lit(self.derived.name).alias("stream"),
            F.lit(0).cast("int").alias("partition"),
            # A session dead-lettered (say, beyond the derived stream's retention) is stored under
            # (pipeline, stream, partition, offset), which must be unique: one stable number per
            # session, the same when a batch is replayed (a key opens one session per instant).
            F.xxhash64(F.col("key"), F.col("first_ms")).alias("offset"),
            F.col("first_ms").alias("event_time"),
            F.col("first_ms").alias("ingest_time"),
            F.array().cast("array<string>").alias("dims"),
            F.array((F.col("last_ms") - F.col("first_ms")).cast("double"), F.col("events").cast("double")).alias("vals"),
            F.array(F.col("key")).alias("ids"),
            F.lit(None).cast("string").alias("error"),
            F.lit(None).cast("string").alias("error_kind"),
        )

    def process_batch(self, batch: DataFrame, batch_id: int) -> CommitResult:
        last = self.store.last_batch_id(self.name)
        if last is not None and batch_id <= last:
            log.info("%s: batch %d already committed, skipped", self.name, batch_id)
            self.last_result = CommitResult(committed=False)
            return self.last_result
        c = self.config
        batch_now_ms = int(self.clock() * 1000)
        # A session older than the retention comes from events the pane pipeline dead-letters as
        # beyond_retention already (the session query's watermark is not set yet on its first
        # batch): not dead-lettered a second time as a session.
        kept = self.as_source_rows(batch).where(F.col("event_time") >= F.lit(batch_now_ms - self.derived.retention))
        rows = [r.asDict() for r in partial_aggregates(kept, self.derived_catalog,
                                                       batch_now_ms=batch_now_ms, lg_k=c.lg_k,
                                                       kll_k=c.kll_k).collect()]
        commit = build_commit(self.name, batch_id, rows, self.derived_catalog,
                              batch_end_offsets(self.config, self.source_catalog, self.checkpoint_dir, batch_id),
                              batch_now_ms=batch_now_ms)
        result = self.committer.commit(commit, lateness_ms={self.derived.name: self.derived.allowed_lateness},
                                       retention_ms={self.derived.name: self.derived.retention})
        log.info("%s: batch %d: %d sessions closed -> %d panes", self.name, batch_id, commit.events_read,
                 len(commit.partials))
        self.last_result = result
        return result

    def start(self, *, available_now: bool = False) -> StreamingQuery:
        events = read_log(self.spark, self.source_catalog, self.config, self.checkpoint_dir)
        writer = self.sessions(events).writeStream.outputMode("append")  # a session is emitted once, when closed
        return start_query(writer, f"sketchboard-{self.name}", self.checkpoint_dir, self.process_batch,
                           self.config.trigger_interval, available_now=available_now, gate=self.gate)

    def run_until_drained(self) -> None:
        query = self.start(available_now=True)
        drain(query, f"session pipeline {self.name}")
        self.last_watermark_ms = _watermark_ms(query)


def _watermark_ms(query: StreamingQuery) -> int | None:
    progress = query.lastProgress or {}
    text = (progress.get("eventTime") or {}).get("watermark")
    if not text:
        return None
    from datetime import datetime

    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def session_pipelines(spark: SparkSession, catalog: Catalog, store_factory: Callable[[], PaneStore],
                      config: PipelineConfig) -> list[SessionPipeline]:
    """One session query per stream that declares sessions."""
    return [
        SessionPipeline(spark, catalog, store_factory(), config, name)
        for name, stream in catalog.streams.items()
        if stream.sessions is not None and not stream.derived_from
    ]

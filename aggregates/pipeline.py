"""The aggregation pipeline: log -> per-batch partial aggregates -> exactly-once store commit."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from aggregates.batch_clock import BatchClock
from aggregates.batch_gate import BatchGate
from aggregates.cluster import check_log_fits_master, master_kind
from aggregates.commit import build_commit, checkpointed_end_offsets, checkpointed_kafka_start, clock_corrected
from aggregates.commit_retry import commit_with_retry
from aggregates.consumers import CommitCopies, CommitListener
from aggregates.device_clocks import DeviceClocks, with_clocks
from aggregates.driver_batch import rows_at_most, streams_with_rows
from aggregates.driver_rows import DriverRows
from aggregates.duplicates import DuplicateFilter
from aggregates.enrichment import Enrichment
from aggregates.firstseen import BloomFeatures
from aggregates.joins import WindowJoins, with_joins
from aggregates.log_gaps import unread_by_stream
from aggregates.partials import (PARTIALS, arrow_partials_table, catalog_layout, dead_letter_reason_column,
                                 partial_aggregates)
from aggregates.patterns import PatternRunner, with_patterns
from aggregates.session_batch import SessionWindows, bloom_and_runs, with_sessions
from aggregates.side_step import side_step
from aggregates.spark import SparkNeeded, master_of, start_for_missing_context
from aggregates.tables import TableChanges
from aggregates.views import Views, with_views
from aggregates.store_commit import ReportsStoreErrors, StoreCommitter
from aggregates.stream_codes import forget_stream_codes
from catalog import Catalog
from ingest.kafka_source import KafkaSourceConfig, read_kafka, read_kafka_rows, stream_offsets, topics_of
from ingest.log import EventLog, LogUnavailable, SqliteEventLog
from ingest.source_rows import SOURCE_SCHEMA
from ingest.spark_source import SOURCE_NAME, initial_offsets, read_batch, source_options
from store import CommitResult, PaneStore
from store.gc_pause import paused_gc
from store.tiers import catalog_layouts

LOGGER = "sketchboard.pipeline"
log = logging.getLogger(LOGGER)


@dataclass(frozen=True)
class PipelineConfig:
    name: str
    log_path: Path  # the embedded log (unused when `kafka` is set)
    checkpoint_dir: Path
    max_records_per_batch: int = 1_000_000
    max_records_per_task: int = 250_000
    trigger_interval: str = "1 second"
    lg_k: int = 12
    kll_k: int = 200
    # Set: read the log's Kafka topics with Spark's Kafka source instead of the embedded log.
    kafka: KafkaSourceConfig | None = None
    # Where a new checkpoint starts reading: the earliest retained record (a replay) or the log's
    # end (only later records). A checkpointed query resumes from its checkpoint whatever this says.
    starting_offsets: str = "earliest"
    # {stream: {partition: offset}} read no further than: a reprocessing run reads a window join's
    # other stream as far as the serving pipeline has (aggregates/reprocess.py); on Kafka by
    # `run_until_drained` only, in batches of its own (aggregates/bounded_batches.py). Given, even
    # empty (a table's run that rebuilds the streams it enriches), a run's batches on Kafka are
    # planned as the embedded source plans them, not by Spark's Kafka source.
    end_offsets: dict[str, dict[int, int]] | None = None
    # A batch of at most this many records is read once onto the driver instead of persisted, and
    # runs in Arrow there with no Spark job (aggregates/driver_batch.py); 0: always persisted;
    # None: by the master (driver_rows_limit).
    driver_batch_rows: int | None = None
    # How a batch's partial aggregates are computed: "arrow", an Arrow group-by on the executors
    # (aggregates/arrow_partials.py), or "spark", Spark's groupBy with its sketch aggregates. A batch
    # held on the driver (driver_batch_rows) is grouped there by the Arrow group-by either way.
    partials: str = "spark"

    def __post_init__(self) -> None:
        if self.partials not in PARTIALS:
            raise ValueError(f"partials must be one of {', '.join(PARTIALS)}, not {self.partials!r}")


CLUSTER_DRIVER_BATCH_ROWS = 50_000


def driver_rows_limit(driver_batch_rows: int | None, master: str, max_records_per_batch: int) -> int:
    """The largest batch held on the driver. As set, or by the master: on this machine (`local`,
    `local[N]`) every batch, since the driver and Spark's executors share its cores and a batch in
    Arrow on the driver runs 2-3x the rate of Spark's jobs over it (docs/benchmarks.md, "Every batch
    on the driver"); on a cluster (or `local-cluster`) batches of at most 50 000 records, the
    small ones whose latency Spark's per-job cost would set, the larger ones spread over the
    executors."""
    if driver_batch_rows is not None:
        return driver_batch_rows
    return max_records_per_batch if master_kind(master) == "local" else CLUSTER_DRIVER_BATCH_ROWS


class Pipeline(ReportsStoreErrors):
    def __init__(self, spark: SparkSession, catalog: Catalog, store: PaneStore, config: PipelineConfig,
                 *, clock: Callable[[], float] = time.time, log: EventLog | None = None):
        # Before anything else: the embedded log cannot be read by executors on other machines.
        check_log_fits_master(master_of(spark), "embedded" if config.kafka is None else "kafka")
        self.spark = spark
        self.catalog = catalog
        self.store = store
        self.config = config
        self.driver_batch_rows = driver_rows_limit(config.driver_batch_rows, master_of(spark),
                                                   config.max_records_per_batch)
        self.clock = clock
        # What each batch judges retention by: the clock, held at the last commit's instant through
        # a small step back (aggregates/batch_clock.py).
        self.batch_clock = BatchClock(clock, lambda: store.last_commit_ms(config.name))
        # The driver's own handle on the log: its end offsets at commit say which partitions
        # still have unread records (the per-partition watermarks, store/watermarks.py).
        self.log = log if log is not None else driver_log(config)
        self.last_result: CommitResult | None = None
        # {batch id: records} of the recent batches read on the driver from the embedded log: Spark
        # never runs their DataFrame, so its progress counts no input rows (aggregates/progress.py).
        self.rows_read_on_driver: dict[int, int] = {}
        self.read_ahead = None  # a catch-up's reader of the next batch (aggregates/read_ahead.py), while it runs
        self.definition_versions: dict[str, str] = {}  # set by the wiring: a switch fences commits (store/switch.py)
        self.gate = BatchGate()  # whether a batch is running: a stop waits for it (aggregates/batch_gate.py)
        # Store commits retried while the storage fails, errors reported (aggregates/store_commit.py).
        self.committer = StoreCommitter(store, config.name, self.gate, log=logging.getLogger(LOGGER), clock=clock)
        # Called after each batch the store committed, with (batch id, end offsets, commit time):
        # copies of the offsets for others to see (the consumer registry, a Kafka consumer group).
        # Never the source of truth: a listener's failure is logged and counted, the batch stands.
        self.commit_listeners: list[CommitListener] = []
        self.copies = CommitCopies(self.commit_listeners)  # a failed copy made again while idle
        self.listener_failures = 0
        # Called with where the query starts (batch 0's start) once it is pinned: the consumer
        # registry's record of it, the pipeline's position for lag until it commits (store/consumers.py).
        self.start_listeners: list[Callable[[dict[str, dict[int, int]]], None]] = []
        self._start_told: dict | None = None
        self.bloom = BloomFeatures(spark, catalog, store.bloom_reader())  # first-seen keys and membership filters
        self.duplicates = DuplicateFilter(spark, catalog, store)  # streams with an event_id_field
        self.clocks = DeviceClocks(spark, catalog, store)  # device clock offsets (streams with a sent_time_field)
        self.joins = WindowJoins(catalog, store, kll_k=config.kll_k)  # stream-stream window joins (catalog joins:)
        self.tables = TableChanges(catalog)  # changelog tables' current rows (kind: table)
        self.views = Views(catalog, store, kll_k=config.kll_k)  # table-table join views (catalog views:)
        self.patterns = PatternRunner(catalog, store, kll_k=config.kll_k)  # patterns (catalog patterns:)
        self.pattern_definitions = None  # set by the wiring: patterns defined through the API (aggregates/pattern_definitions.py)
        self.sessions = SessionWindows(catalog, store, lg_k=config.lg_k, kll_k=config.kll_k)  # streams' sessions:
        self.enrichment = Enrichment(spark, catalog, store)  # stream-table joins (catalog enrich:)
        configure_tiers(store, catalog, clock)

    def stream(self) -> DataFrame:
        return read_log(self.spark, self.catalog, self.config, self.config.checkpoint_dir)

    def process_batch(self, batch: DataFrame, batch_id: int) -> CommitResult:
        # The cycle collector held off for the whole batch, not only while the commit is built
        # and written (store/gc_pause.py): the commit's objects (a backfill's ~450 000 partials,
        # their stats and sketches) were allocated with it off, so each of its collections in
        # the steps between (joins, keys, sessions) traversed them all again. They are freed by
        # reference counting when the batch returns.
        with paused_gc():
            try:
                return self._process_batch(batch, batch_id)
            except AssertionError as exc:  # pyspark's "no SparkContext" on the driver path of a LazySpark
                if not start_for_missing_context(self.spark, exc):
                    raise
                raise SparkNeeded(f"batch {batch_id} needed Spark's session, now started: it runs again") from exc
            finally:
                forget_stream_codes()  # the batch's stream columns are not held past it

    def _process_batch(self, batch: DataFrame, batch_id: int) -> CommitResult:
        started = time.perf_counter()
        last = self.store.last_batch_id(self.config.name)
        if last is not None and batch_id <= last:
            # A batch Spark replays after a crash: the store already has it, skip the work too.
            log.info("batch %d already committed, skipped", batch_id)
            self.last_result = CommitResult(committed=False)
            return self.last_result
        if self.pattern_definitions is not None:  # patterns defined through the API: followed between batches
            self.follow_patterns()
        # The clock is read once per batch and passed into the job as a literal: every
        # executor judges retention against the same instant.
        batch_now_ms = self.batch_clock.now_ms()
        offsets = self.logged_offsets(batch_id)  # read once: the path, the skipped steps, the commit
        # No DataFrame at all: a batch of the pipeline's own (aggregates/bounded_batches.py), held on the
        # driver whatever its size (one an earlier run logged with a larger max_records_per_batch).
        small = batch is None or self.fits_driver(batch_id, offsets)
        # A small batch: its records as Arrow on the driver, every step in Python over them
        # (aggregates/driver_rules.py); from the embedded log Spark's DataFrame is never run.
        if small:
            batch = self.read_on_driver(batch, batch_id, offsets)
        read_at = time.perf_counter()
        event_ids = None
        if self.duplicates.enabled:
            # Copies of an event id counted before are taken out first: nothing below sees them.
            deduped = self.duplicates.process(batch, batch_now_ms, on_driver=small)
            batch, event_ids = deduped.batch, deduped.commit
        deduped_at = time.perf_counter()
        clocks = None
        # Read twice (the clock samples or the joins' records, then the aggregation): kept rather than read again.
        # On the driver path, the streams with records in the batch (from the offsets): the steps
        # of the others are skipped.
        present = streams_with_rows(*offsets) if small else None
        kept = (None if small else batch.persist() if self.clocks.enabled or self.joins.enabled
                or self.patterns.enabled or self.enrichment.enabled or self.sessions.enabled else None)
        joined = matched = enriched = sessioned = keyed_later = None
        try:
            if kept is not None:
                batch = kept
            if self.clocks.enabled:
                clocks = self.clocks.plan(batch, batch_now_ms=batch_now_ms, on_driver=small, streams=present)
                batch = self.clocks.apply(batch, clocks, on_driver=small, streams=present)
            if self.enrichment.enabled:  # after the clock step (corrected times), before patterns, joins and panes
                enriched = self.enrichment.process(batch, batch_now_ms, last, on_driver=small, streams=present)
                batch = enriched.batch
            # On the driver the batch's keyed rows are made once for the steps below (aggregates/driver_rows.py).
            driver_rows = ((enriched.rows if enriched is not None else None)
                           or (DriverRows(batch, self.catalog, batch_now_ms) if small else None))
            if driver_rows is not None and (self.bloom.enabled or self.sessions.enabled):
                # The keys for the Bloom features and the sessions need only the rows: computed beside
                # the partials, the commit's plan and the joins (aggregates/side_step.py). The rows'
                # lazy columns are made first, here, so the two threads never race to make them.
                driver_rows.good  # noqa: B018 - made now (and `table` with it)
                driver_rows.ids  # noqa: B018 - and the ids' encoding, which both threads read
                keyed_later = side_step(bloom_and_runs, None, self.bloom, self.sessions, streams=present,
                                        rows=driver_rows)
            if self.patterns.enabled:  # after the clock step too: patterns match in corrected event time
                matched = self.patterns.process(batch, batch_now_ms, on_driver=small, streams=present, rows=driver_rows)
            rows = self.partial_rows(batch, batch_now_ms, on_driver=small, driver_rows=driver_rows)
            commit = build_commit(self.config.name, batch_id, rows, self.catalog, offsets[1], batch_now_ms=batch_now_ms,
                                  log_end_offsets=self.log_end_offsets(), event_ids=event_ids)
            if self.definition_versions:
                commit = replace(commit, definition_versions=self.definition_versions)
            if clocks is not None:
                commit = with_clocks(commit, clocks, self.clocks.streams, kll_k=self.config.kll_k, lg_k=self.config.lg_k)
            idle = {name: s.partition_idle_timeout for name, s in self.catalog.streams.items()}
            if self.joins.enabled:
                # After the clock step (joins see corrected event times) and once the commit says
                # how far each joined stream's watermark moves (the join's clock); the derived
                # panes and the join's state go into the batch's own transaction.
                joined = self.joins.process(batch, batch_now_ms, commit, idle_timeout_ms=idle, on_driver=small,
                                            streams=present, rows=driver_rows)
                commit = with_joins(commit, joined, self.joins.names)
            bloomed = runs = None
            if keyed_later is not None:
                bloomed, runs = keyed_later.result()
            elif self.bloom.enabled or self.sessions.enabled:
                # One Spark job groups the merged records (dead letters are no keys seen, in no
                # session) by key for both the Bloom filters and the sessions' runs.
                merged = (None if driver_rows is not None  # projected from the driver's rows: no plan needed
                          else batch.where(dead_letter_reason_column(self.catalog, batch_now_ms).isNull()))
                bloomed, runs = bloom_and_runs(merged, self.bloom, self.sessions, streams=present, rows=driver_rows)
            if self.sessions.enabled:
                # Like the joins: corrected event times, the stream's watermark after this batch
                # closes sessions; closed sessions and open ones' changes go into its transaction.
                sessioned = self.sessions.sessionize(runs, commit, now_ms=batch_now_ms, idle_timeout_ms=idle)
                commit = with_sessions(commit, sessioned, self.sessions.names)
            if matched is not None:  # the patterns' derived panes, state, matches and late events, in it too
                commit = with_patterns(commit, matched, self.patterns.names)
            if self.tables.enabled:
                commit = replace(commit, table_changes=self.tables.process(batch, streams=present, on_driver=small))
            if self.views.enabled:  # after the tables: a view joins their rows as this batch leaves them
                commit = with_views(commit, self.views.process(commit.table_changes, batch_now_ms=batch_now_ms),
                                    self.views.names)
            if enriched is not None:  # the tables' new versions and the misses, in the batch's transaction
                commit = replace(commit, enrichment=enriched.commit)
            if self.bloom.enabled:
                commit = replace(commit, bloom=bloomed)
            lateness = {name: s.allowed_lateness for name, s in self.catalog.streams.items()}
            retention = {name: s.retention for name, s in self.catalog.streams.items()}
            # The retention run drops a membership bucket once all of it is past retention: the store needs its width.
            buckets = {name: s.membership.bucket for name, s in self.catalog.streams.items() if s.membership}
            computed = time.perf_counter()
            try:
                result = self.committer.commit(commit, lateness_ms=lateness, retention_ms=retention,
                                               idle_timeout_ms=idle, membership_bucket_ms=buckets)
            except BaseException:
                self.clocks.forget()  # committed or not: the store says which state the next batch starts from
                self.enrichment.forget()
                raise
            if result.committed:
                self.batch_clock.committed(batch_now_ms)
            if clocks is not None and result.committed:
                self.clocks.committed(clocks)
            if enriched is not None and result.committed:  # the kept table versions take the batch's
                self.enrichment.committed(batch_id, enriched)
        finally:
            if keyed_later is not None:
                keyed_later.wait()  # a batch that failed before its result: nothing of it outlives the batch
            if kept is not None:
                kept.unpersist()
            if enriched is not None and enriched.cached is not None:
                enriched.cached.unpersist()
        done = time.perf_counter()
        # "compute": the partials, enrichment, joins, keys and sessions: Spark's jobs, or on the
        # driver (driver_batch_rows) the same steps in Arrow, no job.
        log.info(
            "batch %d: %d events -> %d panes (%d new, %d updated, %d corrections), %d dead-lettered,"
            " %d duplicates dropped in %.0f ms (read %.0f ms, event ids %.0f ms, compute %.0f ms, store commit %.0f ms)",
            batch_id, commit.events_read, commit.partial_count, result.panes_new, result.panes_updated,
            result.corrections, result.dead_letters, sum(event_ids.duplicates.values()) if event_ids else 0,
            (done - started) * 1000, (read_at - started) * 1000, (deduped_at - read_at) * 1000,
            (computed - deduped_at) * 1000,
            (done - computed) * 1000,
        )
        if result.committed and self.config.kafka is None:
            for stream, n in sorted(unread_by_stream(*offsets, commit.read_by_stream, self.catalog).items()):
                log.warning("batch %d: %d records of stream %r were dropped by the log's retention (log_retention,"
                            " log_retention_bytes) before this pipeline read them: skipped", batch_id, n, stream)
        if clocks is not None:
            shifted = clock_corrected(rows)
            biggest = max(clocks.corrections.values(), key=abs, default=0)
            log.info("batch %d: device clocks: %d events shifted by their device's offset (%d devices corrected,"
                     " largest %+d ms), %d estimates changed", batch_id, shifted, len(clocks.corrections), biggest,
                     sum(len(c) for c in clocks.changed.values()))
        if joined is not None:
            log.info("batch %d: joins: %d pairs, %d right events unmatched", batch_id, joined.pairs,
                     joined.unmatched_right)
        if sessioned is not None:
            log.info("batch %d: sessions: %d runs, %d sessions closed, %d open sessions written", batch_id,
                     sessioned.runs, sessioned.closed, sessioned.opened)
        if matched is not None:
            log.info("batch %d: patterns: %d events released in order, %d matches, %d late events", batch_id,
                     matched.released, matched.matches, matched.late)
        self.last_result = result
        if result.committed:
            self.notify_listeners(batch_id, commit.end_offsets, int(self.clock() * 1000))
        return result

    def partial_rows(self, batch: DataFrame, batch_now_ms: int, *, on_driver: bool,
                     driver_rows: DriverRows | None = None):
        """The batch's partial aggregates: for a batch held on the driver, the Arrow group-by's table
        (aggregates/arrow_partials.py) over `driver_rows`, without a Spark job (whatever `partials`
        says: measured faster than Spark's one job there); else
        Spark's groupBy collected as dicts, or (`partials: arrow`) the Arrow group-by on the executors."""
        c = self.config
        if on_driver:
            from aggregates.arrow_partials import group_partials

            return group_partials(driver_rows.arrow_input(), catalog_layout(self.catalog, c.lg_k, c.kll_k),
                                  ids=driver_rows.ids)
        if c.partials == "spark":
            rows = partial_aggregates(batch, self.catalog, batch_now_ms=batch_now_ms, lg_k=c.lg_k, kll_k=c.kll_k)
            with paused_gc():  # a Row and a dict per group (aggregates/commit.py)
                return [r.asDict() for r in rows.collect()]
        return arrow_partials_table(batch, self.catalog, batch_now_ms=batch_now_ms, lg_k=c.lg_k, kll_k=c.kll_k,
                                    merge="driver")

    def logged_offsets(self, batch_id: int) -> tuple[dict, dict]:
        """The end offsets Spark logged for the batch before `batch_id` (before batch 0: the start the
        embedded source pinned, or the one Spark's Kafka source logged) and for `batch_id`: the
        batch's range. A stream or partition the batch reads and the batch before did not (a stream
        added since: a pattern defined through the API) starts at the log's start, as both sources
        start it: only then is the log asked."""
        c = self.config
        if batch_id > 0:
            start = batch_end_offsets(c, self.catalog, c.checkpoint_dir, batch_id - 1)
        else:
            start = self.pinned_start()
        end = batch_end_offsets(c, self.catalog, c.checkpoint_dir, batch_id)
        new = {s for s, parts in end.items() for p in parts if p not in start.get(s, {})}
        if start and new:  # (no start at all is unknown, not "the log's start": a query may start at its end)
            start = {s: dict(parts) for s, parts in start.items()}
            for stream in sorted(new):
                for partition, offsets in self.log.offsets(stream).items():
                    start.setdefault(stream, {}).setdefault(partition, offsets.start)
        return start, end

    def read_on_driver(self, batch: DataFrame, batch_id: int, offsets: tuple[dict, dict]) -> pa.Table:
        """A small batch's records as Arrow (ingest.source_rows.SOURCE_SCHEMA): from the embedded log
        read on the driver for its logged offset range, by the source's own reader
        (ingest.spark_source.read_batch), with no Spark job; from Kafka, a batch of the pipeline's
        own read by its own consumer (ingest.kafka_source.read_kafka_rows), else collected from
        Spark's Kafka source (one job: it reads in the JVM)."""
        if batch is None and self.config.kafka is not None:  # a batch of our own: read with our consumer
            records = read_kafka_rows(self.log, self.catalog, self.config.kafka, *offsets)
        elif self.config.kafka is not None or not isinstance(self.log, SqliteEventLog):
            return batch.toArrow().select(SOURCE_SCHEMA.names).cast(SOURCE_SCHEMA)
        else:
            # Read by a catch-up's worker while the batch before ran, if it was (aggregates/read_ahead.py).
            records = self.read_ahead.take(self.catalog, *offsets) if self.read_ahead is not None else None
            if records is None:
                began = time.perf_counter()
                records = read_batch(self.log, self.catalog, *offsets)
                if self.read_ahead is not None:  # how long a worker's read is worth waiting for
                    self.read_ahead.read_here(records.num_rows, time.perf_counter() - began)
        self.rows_read_on_driver[batch_id] = records.num_rows
        for old in [b for b in self.rows_read_on_driver if b < batch_id - 100]:  # the listener's reach
            del self.rows_read_on_driver[old]
        return records

    def fits_driver(self, batch_id: int, offsets: tuple[dict, dict] | None = None) -> bool:
        """Whether batch `batch_id` has at most `driver_batch_rows` records (driver_rows_limit), from the offsets Spark
        logged for it and the batch before (no Spark job); `offsets`: logged_offsets', if read."""
        if self.driver_batch_rows <= 0:
            return False
        rows = rows_at_most(*(offsets or self.logged_offsets(batch_id)))
        return rows is not None and rows <= self.driver_batch_rows

    def follow_patterns(self) -> None:
        """Run the patterns defined through the API as they are now (a poll of one row per batch;
        aggregates/pattern_definitions.py); the state changes go into this batch's commit."""
        catalog = self.pattern_definitions.poll()
        if catalog is None:
            return
        for stream in catalog.streams.values():
            if stream.name not in self.catalog.streams:
                self.log.ensure_topic(stream)  # a new `<pattern>_matches`, as every derived stream has
        self.catalog = catalog
        self.patterns = PatternRunner(catalog, self.store, kll_k=self.config.kll_k)
        configure_tiers(self.store, catalog, self.clock)

    def pinned_start(self) -> dict[str, dict[int, int]]:
        """Where the query started (batch 0's start) as its checkpoint keeps it; empty before it is pinned."""
        c = self.config
        if c.kafka is None:  # the embedded source pins where the query started
            return initial_offsets(c.checkpoint_dir)
        # Spark's Kafka source logs it in its own file
        return stream_offsets(checkpointed_kafka_start(c.checkpoint_dir), topics_of(self.catalog, c.kafka.topic_prefix))

    def notify_start(self, start: Mapping[str, Mapping[int, int]]) -> None:
        """Tell the start listeners where the query started (nothing when not pinned yet); one that
        fails is logged and counted, as a commit listener is: a copy, never the source of truth."""
        start = {s: dict(parts) for s, parts in start.items()}
        # A pinned start never changes: told once (an idle pipeline before its first batch asks at
        # every trigger, and each time was a write transaction on the root store).
        if not start or start == self._start_told:
            return
        failed = False
        for listener in self.start_listeners:
            try:
                listener(start)
            except Exception as exc:  # noqa: BLE001 - a copy of the start failed, not the pipeline
                failed = True
                self.listener_failures += 1
                log.warning("recording where the query started failed: %s", exc)
        if not failed:  # else told again at the next trigger
            self._start_told = start

    def notify_listeners(self, batch_id: int, end_offsets: Mapping[str, Mapping[int, int]], at_ms: int) -> None:
        self.listener_failures += self.copies.notify(batch_id, end_offsets, at_ms)

    def retry_copies(self) -> None:
        """The copies of the offsets a batch failed to make (a consumer group, the registry),
        made again: called while no batch runs (aggregates/consumers.py CommitCopies)."""
        self.copies.retry_due()

    def log_end_offsets(self) -> dict[str, dict[int, int]]:
        """The log's end offsets now (per-partition watermarks, event-id pruning). A Kafka broker
        that is away is waited out with back-off, as the source waits for it, instead of failing
        the query (the batch is not recorded if the pipeline stops meanwhile)."""
        def read() -> dict[str, dict[int, int]]:
            offsets = self.log.offsets_of(self.catalog.streams)
            return {name: {p: o.end for p, o in parts.items()} for name, parts in offsets.items()}

        def report(error: BaseException | None, attempt: int) -> None:
            if error is None:
                log.warning("the log answers again after %d failed tries", attempt)
            else:
                log.warning("the log's end offsets cannot be read (try %d), retrying: %s", attempt + 1, error)

        return commit_with_retry(read, wait=self.gate.sleep, report=report, transient=(LogUnavailable,))

    def start(self, *, available_now: bool = False) -> StreamingQuery:
        c = self.config
        return start_query(self.stream().writeStream, f"sketchboard-{c.name}", c.checkpoint_dir, self.spark_batch,
                           c.trigger_interval, available_now=available_now, gate=self.gate)

    def spark_batch(self, batch: DataFrame, batch_id: int) -> CommitResult:
        """A batch Spark's query planned. On Kafka, a pipeline that enriches refuses one its source
        may have shared by partitions' backlogs (aggregates/bounded_batches.py `refuse_split`):
        the query fails on it with nothing stored, and the pipeline catches the backlog up cut at
        one append time (`catch_up`) before its query starts again."""
        from aggregates.bounded_batches import refuse_split

        refuse_split(self, batch_id)
        return self.process_batch(batch, batch_id)

    def run_until_drained(self, stopping: Callable[[], bool] | None = None) -> None:
        """Process everything in the log now, then stop (Trigger.AvailableNow); on Kafka, a pipeline
        that enriches catches a backlog up cut at one append time first (`catch_up`), and again
        whenever its query refused a batch Spark's source may have split. `stopping`: asked
        between the catch-up's batches; true ends the drain there."""
        from aggregates.bounded_batches import drain_bounded, drains_on_driver, split_by_spark

        if self.config.kafka is not None and self.config.end_offsets is not None:
            # Spark's Kafka source takes no per-partition end: batches of our own, read by batch reads.
            drain_bounded(self, self.config.end_offsets)
            return
        if drains_on_driver(self):
            # Every batch on the driver from the embedded log: batches of our own, no query to start
            # (as `catch_up` does); what the log holds now is read, the query's AvailableNow.
            drain_bounded(self, {}, stopping)
            return
        while True:
            self.catch_up(stopping)
            if stopping is not None and stopping():
                return
            try:
                drain(self.start(available_now=True), "pipeline")
                return
            except RuntimeError as exc:
                if not split_by_spark(exc):
                    raise
                log.info("a batch Spark's Kafka source may have split by partition was refused: catching up")

    def catch_up(self, stopping: Callable[[], bool] | None = None) -> None:
        """Before a query starts (`sketchboard pipeline`, sketchboard/live.py, and `run_until_drained`):
        - on the embedded log with every batch on the driver (`drains_on_driver`), the log up to its
          end now, in batches of our own planned as its source plans them (aggregates/bounded_batches.py),
          with no Spark query: neither its start nor its planning of each batch;
        - on Kafka, a backlog of a pipeline that enriches that Spark's source could share
          by partition (more than `max_records_per_batch` records, or about as many) caught up in
          batches cut at one append time, until what is left is less (a batch Spark logged and did not
          run, a refused split or a crash, is planned again).
        Spark's query then resumes from the checkpoint they logged, with no batch of its own until new
        records come (the offsets logged in the very text its source gives, ingest/kafka_offset_json.py,
        ingest/spark_source.py `offsets_text`). A no-op elsewhere. `stopping`: asked between those batches."""
        from aggregates.bounded_batches import catches_up_cut, cuts_batches, drain_bounded, drains_on_driver
        from aggregates.checkpoint_moves import settle_last_batch

        if drains_on_driver(self):
            drain_bounded(self, {}, stopping)
            return
        if not cuts_batches(self):
            return
        settle_last_batch(self.config.checkpoint_dir, self.store.last_batch_id(self.config.name), commit=False)
        while stopping is None or not stopping():
            try:
                behind = catches_up_cut(self)
            except LogUnavailable as exc:  # the broker away: Spark's query waits it out, as it always has
                log.warning("cannot tell the backlog to catch up (%s): leaving it to Spark's Kafka source", exc)
                return
            if not behind or drain_bounded(self, {}, stopping) == 0:
                return


def configure_tiers(store: PaneStore, catalog: Catalog, clock: Callable[[], float] = time.time) -> list[str]:
    """Keep the roll-up tiers the catalog declares; a stream whose tiers changed (or a store
    from before tiers) gets them rebuilt from its panes first, with progress in the log."""
    rebuilt = store.configure_tiers(catalog_layouts(catalog), now_ms=int(clock() * 1000), progress=log.info)
    for stream in rebuilt:
        log.info("roll-up tiers of %r built from its panes", stream)
    return rebuilt


def read_log(spark: SparkSession, catalog: Catalog, config: PipelineConfig, checkpoint_dir: Path) -> DataFrame:
    """The log's streams of `catalog` as a streaming DataFrame (ingest.source_rows' uniform
    schema), from the embedded log's source or from Spark's Kafka source, for the query
    checkpointed in `checkpoint_dir`."""
    if config.kafka is not None:
        kafka = replace(config.kafka, starting_offsets=config.starting_offsets)
        return read_kafka(spark, catalog, kafka, config.max_records_per_batch)
    options = source_options(str(config.log_path), catalog, config.max_records_per_batch, config.max_records_per_task,
                             starting_offsets=config.starting_offsets, checkpoint_dir=str(checkpoint_dir),
                             end_offsets=config.end_offsets)
    return spark.readStream.format(SOURCE_NAME).options(**options).load()


def driver_log(config: PipelineConfig) -> EventLog:
    """The log as the driver reads its offsets: the embedded file, or the Kafka topics."""
    if config.kafka is None:
        return SqliteEventLog(config.log_path)
    from ingest.log.kafka import KafkaEventLog

    # Committed records only (its default), as Spark's Kafka source reads them: a batch's end is never
    # past a partition's last stable offset (a transaction still open), and its reads skip aborted records.
    return KafkaEventLog(config.kafka.bootstrap_servers, topic_prefix=config.kafka.topic_prefix,
                         options=dict(config.kafka.kafka_options), json_limits=config.kafka.json_limits)


def batch_end_offsets(config: PipelineConfig, catalog: Catalog, checkpoint_dir: Path,
                      batch_id: int) -> dict[str, dict[int, int]]:
    """The end offsets of a batch per stream and partition, as the store records them with the
    batch id: what Spark logged for the batch before running it. The embedded source's offsets
    are per stream already; the Kafka source's are per topic."""
    logged = checkpointed_end_offsets(checkpoint_dir, batch_id)
    if config.kafka is None:
        return logged
    return stream_offsets(logged, topics_of(catalog, config.kafka.topic_prefix))


def start_query(writer: DataStreamWriter, name: str, checkpoint_dir: Path, process_batch, trigger_interval: str,
                *, available_now: bool, gate: BatchGate) -> StreamingQuery:
    """A foreachBatch query, checkpointed, on a processing-time trigger or AvailableNow; its
    batches run through `gate`, so a stop can wait for the running one (aggregates/batch_gate.py)."""
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    writer = writer.queryName(name).option("checkpointLocation", str(checkpoint_dir)).foreachBatch(gate.wrap(process_batch))
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime=trigger_interval)
    return writer.start()


def drain(query: StreamingQuery, what: str) -> None:
    """Wait for an AvailableNow query to finish; its failure becomes an exception here."""
    query.awaitTermination()
    if query.exception():
        raise RuntimeError(f"{what} failed: {query.exception()}")

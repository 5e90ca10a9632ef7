"""Batches of the pipeline's own: with chosen end offsets on Kafka (issue 16: the synchronized
switch on Kafka, docs/reprocessing.md), and a backlog of the embedded log held on the driver.

A reprocessing run of a stream that feeds a window join, a pattern over two streams or a view
must read their other streams no further than the serving pipeline has, to the partition
(`end_offsets`). The embedded log's source takes such caps (ingest/spark_source.py). Spark's
Kafka source does not: a streaming query reads every topic to its latest offsets on each
AvailableNow start, and `maxOffsetsPerTrigger` bounds a batch's total only. A batch read
(`spark.read.format("kafka")`) does take startingOffsets and endingOffsets per partition, so on
Kafka such a run drives its batches itself, each one as Spark would run it:

- planned like the embedded source plans one (ingest/spark_source.py `plan_end_offsets`: at most
  `max_records_per_batch` records, fair across partitions; a pipeline that enriches cuts its tables
  and enriched streams at one append time, ingest/append_cut.py, found by the broker's time index),
  from where the last batch ended to the log's end as of the drain's start (AvailableNow's end),
  each capped stream to its cap;
- its end offsets written to the query's Spark offset log (`offsets/<id>`, keyed by topic in the
  very text Spark's Kafka source writes, ingest/kafka_offset_json.py, so that Spark's query
  resuming after them finds no new data where there is none; the query's `metadata` first) before
  it runs, and `commits/<id>` after, so Spark's own source can resume from the checkpoint: the batch body
  (`Pipeline.process_batch`, the one the streaming query runs) reads its range there and the store
  records it with the batch id, exactly once (a batch the store has is skipped);
- its records read by one batch read of exactly that range, converted as the streaming source's
  are (ingest/kafka_source.py `read_kafka_range`).

A batch logged but not committed (a crash) is run again with the same range, as Spark does.

The serving pipeline of a catalog that enriches keeps Spark's streaming query for the batches it
plans whole (a trigger's backlog within `max_records_per_batch`: everything the source found,
which is a cut), and refuses any batch Spark's source may have cut short in proportion to the
partitions' backlogs (`may_be_split`, `refuse_split`): nothing of it is stored, the batch Spark
logged is planned again (`settle_last_batch`) and the backlog is caught up here, cut at one append
time (`Pipeline.catch_up`), before the query starts again (sketchboard/live.py).
On the embedded log, a pipeline whose every batch is held on the driver (`drains_on_driver`: a
local master, the default) catches any backlog up the same way before its query starts, and
`run_until_drained` is that catch-up alone: such a batch never runs Spark's DataFrame (the driver
reads its range from the log), so Spark's query would only plan it, at the cost of a query start
(5-6 s here) and a planning step per batch. Its batches are planned as the embedded source plans
them, logged in the text the source gives Spark (ingest/spark_source.py `offsets_text`), batch 0's
start pinned where the source pins it; Spark's query resumes after them (`embedded_batches`).

The planning is pure (`capped_targets`, `next_batch`, `may_be_split`); `drain_bounded` does the I/O."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from contextlib import closing, nullcontext
from dataclasses import dataclass
from pathlib import Path

from aggregates.checkpoint_moves import logged_batches, purge_before, write_whole
from aggregates.commit import KAFKA_SOURCE_START, checkpointed_kafka_start
from aggregates.progress import OwnRunProgress
from aggregates.read_ahead import ReadAhead
from ingest.append_cut import Cut, catalog_cut
from ingest.kafka_offset_json import spark_offsets_json
from ingest.log import SqliteEventLog
from ingest.log.kafka import topic_name
from ingest.spark_source import (INITIAL_OFFSETS_FILE, initial_offsets, offsets_text, pin_offsets, plan_end_offsets,
                                 records_between)

log = logging.getLogger("sketchboard.pipeline")

Offsets = dict[str, dict[int, int]]  # {stream: {partition: offset}}

_COMMIT = 'v1\n{"nextBatchWatermarkMs":0}'


def capped_targets(start: Mapping[str, Mapping[int, int]], available: Mapping[str, Mapping[int, int]],
                   caps: Mapping[str, Mapping[int, int]]) -> Offsets:
    """How far a drain reads each partition: the log's end (`available`); a stream with caps no
    further than its cap, and not past where the query stands in a partition it has no cap for
    (the serving pipeline has read nothing of it); never behind where the query stands."""
    out: Offsets = {}
    for stream, parts in available.items():
        cap = caps.get(stream)
        out[stream] = {}
        for partition, end in parts.items():
            lo = start.get(stream, {}).get(partition, 0)
            hi = end if cap is None else min(end, cap.get(partition, lo))
            out[stream][partition] = max(lo, hi)
    return out


def next_batch(start: Mapping[str, Mapping[int, int]], targets: Mapping[str, Mapping[int, int]],
               max_rows: int, cut: Cut | None = None) -> Offsets | None:
    """The end offsets of the next batch from `start` towards `targets`, at most `max_rows` records
    shared fairly across partitions, re-planned by `cut` (a pipeline that enriches: its tables and
    enriched streams at one append time, ingest/append_cut.py); None when nothing is left to read."""
    end = plan_end_offsets({s: dict(p) for s, p in start.items()}, targets, max_rows)
    if cut is not None:
        end = cut(start, targets, end)
    if records_between(start, end) == 0:
        return None
    return end


def partitions_between(start: Mapping[str, Mapping[int, int]], end: Mapping[str, Mapping[int, int]]) -> int:
    """How many partitions have at least one record between `start` and `end`."""
    return sum(1 for s, parts in end.items() for p, hi in parts.items() if hi > start.get(s, {}).get(p, 0))


def may_be_split(records: int, partitions: int, max_rows: int) -> bool:
    """Whether a batch of `records` in `partitions` partitions may be one that Spark's Kafka source
    cut short (`maxOffsetsPerTrigger` = `max_rows` < its backlog) rather than all it found. Its
    `rateLimit` gives each partition with a backlog `floor(max_rows * backlog / total)` records, at
    least one: so such a batch reads every partition that had a backlog, and loses less than one
    record per partition to the rounding; a batch of fewer than `max_rows - partitions` records
    was the whole backlog. Never a false "no": a batch this says yes to may also be a whole one."""
    return records > 0 and records >= max_rows - partitions


class SplitBySpark(RuntimeError):
    """A batch Spark's Kafka source may have shared by partitions' backlogs, refused before anything
    of it was computed or stored: the pipeline catches the backlog up cut at one append time."""

    MARK = "may have been split by Spark's Kafka source"


def split_by_spark(error: BaseException | object) -> bool:
    """Whether a query failed on `SplitBySpark` (Spark hands the Python error back as text)."""
    return SplitBySpark.MARK in str(error)


def with_starts(offsets: Mapping[str, Mapping[int, int]], starts: Mapping[str, Mapping[int, int]]) -> Offsets:
    """`offsets` with every partition of `starts` it lacks (a stream or partition the query has not
    read yet) at its log start: Kafka's `earliest`."""
    out = {s: dict(p) for s, p in offsets.items()}
    for stream, parts in starts.items():
        for partition, first in parts.items():
            out.setdefault(stream, {}).setdefault(partition, first)
    return out


def offset_log_text(offsets: Mapping[str, Mapping[int, int]], topic_prefix: str, metadata: str) -> str:
    """A Spark offset log entry ('v1' / metadata / the one source's offsets) with the offsets keyed
    by topic, in the very text Spark's Kafka source writes (ingest/kafka_offset_json.py): Spark
    compares it as text with what its source finds when its query resumes after our batches, and
    any other order would make it run one more batch, empty, with the same offsets."""
    by_topic = {topic_name(topic_prefix, s): dict(parts) for s, parts in offsets.items()}
    return "\n".join(["v1", metadata, spark_offsets_json(by_topic)])


def source_start_text(offsets: Mapping[str, Mapping[int, int]], topic_prefix: str) -> str:
    """Where the query started, as Spark's Kafka source logs it in `sources/0/0` when its query
    starts with no offset log (KafkaSourceInitialOffsetWriter: a 0 byte, 'v1', the offsets' JSON;
    `aggregates.commit.checkpointed_kafka_start` reads it).
    Written for a batch 0 of our own, so batch 0's start is known as if Spark had planned it
    (`Pipeline.logged_offsets`: its size, the driver's path); Spark reads the file only for a
    query without an offset log, which ours never is after it."""
    by_topic = {topic_name(topic_prefix, s): dict(parts) for s, parts in offsets.items()}
    return "\x00v1\n" + spark_offsets_json(by_topic)


def _metadata(offsets_dir: Path, planned: list[int], now_ms: int) -> str:
    """The metadata line of the last logged batch (Spark's session settings), else a fresh one."""
    if planned:
        lines = (offsets_dir / str(planned[-1])).read_text(encoding="utf-8").splitlines()
        if len(lines) >= 2:
            return lines[1]
    return json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": now_ms, "conf": {}}, separators=(",", ":"))


def cuts_batches(pipeline) -> bool:
    """Whether the pipeline reads Kafka and enriches: Spark's Kafka source must not share a backlog
    of its tables and enriched streams by partition (the module doc)."""
    from catalog.enrichment import append_cut_streams

    return pipeline.config.kafka is not None and bool(append_cut_streams(pipeline.catalog)[0])


def catches_up_cut(pipeline) -> bool:
    """Whether a pipeline on Kafka that enriches has a backlog (from its checkpoint's last logged
    batch, or the log's start for a new one reading from the earliest) that Spark's Kafka source
    may share in proportion to each partition's backlog (`may_be_split`), so that an event could be
    read a batch before a change of its key appended ahead of it; `drain_bounded` cuts it at one
    append time instead (ingest/append_cut.py). A smaller backlog is one whole batch, left to
    Spark; so is a new query reading from the log's end (Spark's source records where it started)."""
    from aggregates.pipeline import batch_end_offsets

    config, catalog = pipeline.config, pipeline.catalog
    if not cuts_batches(pipeline):
        return False
    checkpoint = Path(config.checkpoint_dir)
    planned = logged_batches(checkpoint / "offsets")
    if not planned and config.starting_offsets != "earliest":
        return False
    offsets_now = pipeline.log.offsets_of(catalog.streams)
    starts = {name: {p: o.start for p, o in parts.items()} for name, parts in offsets_now.items()}
    available = {name: {p: o.end for p, o in parts.items()} for name, parts in offsets_now.items()}
    start = with_starts(batch_end_offsets(config, catalog, checkpoint, planned[-1]), starts) if planned else starts
    return may_be_split(records_between(start, available), partitions_between(start, available),
                        config.max_records_per_batch)


def refuse_split(pipeline, batch_id: int) -> None:
    """Raise `SplitBySpark` for a batch Spark's query planned that its Kafka source may have shared
    by partitions' backlogs, in a pipeline that enriches, where that could enrich an event before
    a change of its table appended ahead of it (`reads_an_event_before_a_change`); before anything
    of it is computed or stored. A batch the store has (a replay, skipped anyway) and the first batch of a query that
    started at the log's end (whatever came after its start, planned from offsets Spark keeps
    elsewhere) pass."""
    config = pipeline.config
    if not cuts_batches(pipeline):
        return
    last = pipeline.store.last_batch_id(config.name)
    if (last is not None and batch_id <= last) or (batch_id == 0 and config.starting_offsets != "earliest"):
        return
    start, end = pipeline.logged_offsets(batch_id)
    # A partition the query has no offset of yet starts at the log's start: counted from 0 first
    # (more records, never fewer), from the log's start only where that may be a split.
    if not may_be_split(records_between(start, end), partitions_between(start, end), config.max_records_per_batch):
        return
    starts = {name: {p: o.start for p, o in parts.items()} for name, parts in pipeline.log.offsets_of(end).items()}
    start = with_starts(start, starts)
    records = records_between(start, end)
    if may_be_split(records, partitions_between(start, end), config.max_records_per_batch) and \
            reads_an_event_before_a_change(pipeline, start, end):
        raise SplitBySpark(f"batch {batch_id} ({records} records, max_records_per_batch"
                           f" {config.max_records_per_batch}) {SplitBySpark.MARK}: caught up cut at one append"
                           f" time instead (docs/tables.md)")


def reads_an_event_before_a_change(pipeline, start: Offsets, end: Offsets) -> bool:
    """Whether a batch [`start`, `end`) could enrich an event before a change of its table appended
    ahead of it: some table partition (read directly or through a view) stops before a record
    appended at or before the newest append time of the batch's enriched events. A batch of no
    enriched event, or one that reads every table to its changes after that time, is as good as
    one cut at one append time (a share of a stream's partitions alone is harmless). Where the log
    cannot tell an append time, it answers yes."""
    from catalog.enrichment import append_cut_streams

    catalog, log = pipeline.catalog, pipeline.log
    group, tables = append_cut_streams(catalog)
    newest = None
    for stream in (s for s in group if catalog.streams[s].enrich):
        for partition, hi in end.get(stream, {}).items():
            if hi > start.get(stream, {}).get(partition, 0):
                at = log.ingest_time_ms(stream, int(partition), hi - 1)
                if at is None:
                    return True
                newest = at if newest is None else max(newest, at)
    if newest is None:
        return False
    for table in tables:
        offsets = log.offsets(table)
        read_to = {int(p): end.get(table, {}).get(p, o.start) for p, o in offsets.items()}
        unread = {p: at for p, at in read_to.items() if at < offsets[p].end}
        if not unread:
            continue
        after = log.first_appended_after(table, unread, newest)
        if any(after.get(p) is None or after[p] > at for p, at in unread.items()):
            return True
    return False


@dataclass(frozen=True)
class OwnBatches:
    """How batches of our own are logged and read on one log (`drain_bounded`)."""

    offsets_text: Callable[[Offsets, str], str]  # a batch's end offsets and the metadata line -> offsets/<id>
    pin_start: Callable[[Offsets], None]  # batch 0's start, where the pipeline (logged_offsets) and Spark read it
    pinned_start: Callable[[], Offsets]  # a start pinned already (a query started and logged nothing), else {}
    read: Callable[[Offsets, Offsets], object]  # a batch's records as process_batch takes them
    # The next batch and the records left from its start, to read ahead where it can.
    ask: Callable[[Offsets, Offsets, int], None] = lambda start, end, left: None
    close: Callable[[], None] = lambda: None


def kafka_batches(pipeline) -> OwnBatches:
    """On Kafka: the offsets in the very text of Spark's Kafka source, batch 0's start in its own
    file (`sources/0/0`), the records read by one batch read of the range; with every batch on the
    driver (`reads_kafka_on_driver`), no DataFrame at all: the batch body reads its range with the
    driver's own consumer (`Pipeline.read_on_driver`)."""
    from ingest.kafka_source import read_kafka_range, stream_offsets, topics_of

    config, checkpoint = pipeline.config, Path(pipeline.config.checkpoint_dir)
    prefix = config.kafka.topic_prefix

    def pin_start(start: Offsets) -> None:
        if not (checkpoint / KAFKA_SOURCE_START).exists():
            write_whole(checkpoint / KAFKA_SOURCE_START, source_start_text(start, prefix))

    def pinned_start() -> Offsets:
        return stream_offsets(checkpointed_kafka_start(checkpoint), topics_of(pipeline.catalog, prefix))

    on_driver = reads_kafka_on_driver(pipeline)

    def read(start: Offsets, end: Offsets):
        return None if on_driver else read_kafka_range(pipeline.spark, pipeline.catalog, config.kafka, start, end)

    return OwnBatches(lambda end, metadata: offset_log_text(end, prefix, metadata), pin_start, pinned_start, read)


def own_batches(pipeline) -> OwnBatches:
    """How this pipeline's log is logged and read in batches of its own."""
    return kafka_batches(pipeline) if pipeline.config.kafka is not None else embedded_batches(pipeline)


def embedded_batches(pipeline) -> OwnBatches:
    """On the embedded log, every batch on the driver: the offsets in the text the embedded source
    gives Spark, batch 0's start pinned where that source pins it, and no DataFrame at all (the
    batch body reads its range from the log itself: `Pipeline.read_on_driver`)."""
    checkpoint = Path(pipeline.config.checkpoint_dir)

    def pin_start(start: Offsets) -> None:
        if not (checkpoint / INITIAL_OFFSETS_FILE).exists():
            pin_offsets(checkpoint / INITIAL_OFFSETS_FILE, start)

    # The next batch read in another process while one runs (aggregates/read_ahead.py), taken by
    # `Pipeline.read_on_driver`; the pipeline reads itself whatever it was not given.
    ahead = pipeline.read_ahead = ReadAhead(pipeline.config.log_path)

    def close() -> None:
        ahead.close()
        pipeline.read_ahead = None

    return OwnBatches(lambda end, metadata: "\n".join(["v1", metadata, offsets_text(end)]), pin_start,
                      lambda: initial_offsets(checkpoint), lambda start, end: None,
                      lambda start, end, left: ahead.ask(pipeline.catalog, start, end, left), close)


def drains_on_driver(pipeline) -> bool:
    """Whether the pipeline drains a backlog of the embedded log in batches of its own, with no
    Spark query: every batch it would plan is held on the driver (a local master), where Spark's
    DataFrame is never run anyway, so Spark's part is only its planning: a query's start (5-6 s
    here: a Python worker per planning step) and each batch's. Not a reprocessing run with
    caps (`end_offsets`): the embedded source applies those as it always has."""
    config = pipeline.config
    if config.end_offsets is not None:
        return False
    if config.kafka is not None:
        return reads_kafka_on_driver(pipeline)
    return isinstance(pipeline.log, SqliteEventLog) and pipeline.driver_batch_rows >= config.max_records_per_batch


def reads_kafka_on_driver(pipeline) -> bool:
    """Whether the pipeline reads Kafka's records itself, with its own consumer (read_committed,
    as Spark's source), and so needs neither Spark's query nor its Kafka source: every batch is held
    on the driver (a local master by default; any master with driver_batch_rows at least
    max_records_per_batch, where Spark's query would only plan them) and nothing is configured that
    only Spark applies (`kafka_needs_spark`)."""
    from ingest.log.kafka import KafkaEventLog

    config = pipeline.config
    return (config.kafka is not None and not kafka_needs_spark(config.kafka)
            and isinstance(pipeline.log, KafkaEventLog) and pipeline.driver_batch_rows >= config.max_records_per_batch)


def kafka_needs_spark(kafka) -> bool:
    """Whether reading these topics takes Spark's Kafka source: the JVM fast path
    (`kafka_jvm_validation`: the JVM's from_json is its point), or `kafka_source_options`, options of
    Spark's source and of its Java client that the pipeline's own consumer would not apply."""
    return kafka.fast_path or bool(kafka.source_options)


def query_id_of(checkpoint: Path) -> str:
    """The query's id in its checkpoint's `metadata`, written first when there is none: Spark
    refuses an offset log without it."""
    if not (checkpoint / "metadata").exists():
        write_whole(checkpoint / "metadata", json.dumps({"id": str(uuid.uuid4())}))
    return json.loads((checkpoint / "metadata").read_text(encoding="utf-8")).get("id", "")


def batches_to_retain(pipeline) -> int:
    """How many batches' offset and commit log entries a checkpoint keeps, as Spark's query keeps
    them (`spark.sql.streaming.minBatchesToRetain`, 100 unless set)."""
    from aggregates.spark import conf_value

    try:
        return max(1, int(conf_value(pipeline.spark, "spark.sql.streaming.minBatchesToRetain", "100")))
    except Exception:  # no session (a test's stand-in pipeline), or a value that is no number
        return 100


def drain_bounded(pipeline, caps: Mapping[str, Mapping[int, int]], stopping: Callable[[], bool] | None = None, *,
                  own: OwnBatches | None = None, progress: OwnRunProgress | None = None, keep: int | None = None,
                  follow_rest: bool = False) -> int:
    """Process the log up to its end as of now, each stream of `caps` no further than its caps,
    in batches of the pipeline's own (the module doc; on the embedded log `embedded_batches`);
    returns how many batches ran. `stopping`: asked between batches; true ends the drain there
    (the serving pipeline told to stop). `own` and `progress`: a serving loop's, kept across its
    drains (aggregates/driver_serving.py), whose caller wrote the checkpoint's query id
    (`query_id_of`) once; else the drain's own, closed and ended with it. `keep`:
    how many batches the checkpoint's logs keep (`batches_to_retain`, asked of Spark when None).
    `follow_rest`: the serving loop's; the records that come while the batch before a rest of the
    backlog (less than a batch) runs join that rest (`is_remainder`): the first rest of a drain is
    planned again in it, with what the log holds then; at a later one the drain ends after the
    batch before it, so the serving loop's next drain plans it with what came meanwhile."""
    config = pipeline.config
    keep = batches_to_retain(pipeline) if keep is None else keep
    if progress is None:  # the query's id first: Spark refuses an offset log without it
        progress = OwnRunProgress(getattr(pipeline, "progress_recorder", None),
                                  query_id_of(Path(config.checkpoint_dir)))
    else:
        progress = nullcontext(progress)
    if own is None:
        own = closing(own_batches(pipeline))
    else:
        own = nullcontext(own)
    with progress as progress, own as own:
        return _drain(pipeline, caps, stopping, own, progress, keep, follow_rest)


def _drain(pipeline, caps: Mapping[str, Mapping[int, int]], stopping: Callable[[], bool] | None, own: OwnBatches,
           progress: OwnRunProgress, keep: int, follow_rest: bool) -> int:
    from aggregates.pipeline import batch_end_offsets

    config, catalog = pipeline.config, pipeline.catalog
    checkpoint = Path(config.checkpoint_dir)
    offsets_dir, commits_dir = checkpoint / "offsets", checkpoint / "commits"
    starts: Offsets = {}
    available: Offsets = {}

    def look() -> None:  # the log's starts and ends now
        offsets_now = pipeline.log.offsets_of(catalog.streams)
        starts.clear()
        starts.update({name: {p: o.start for p, o in parts.items()} for name, parts in offsets_now.items()})
        available.clear()
        available.update({name: {p: o.end for p, o in parts.items()} for name, parts in offsets_now.items()})

    look()
    process = pipeline.gate.wrap(pipeline.process_batch)
    cut = catalog_cut(catalog, pipeline.log.first_appended_after, pipeline.log.ingest_time_ms)

    def logged(batch_id: int) -> Offsets:
        return batch_end_offsets(config, catalog, checkpoint, batch_id)

    def write(batch_id: int, path: Path, text: str) -> None:
        # A full disk or an I/O error is waited out as a store commit's is (reported, retried).
        committer = getattr(pipeline, "committer", None)
        if committer is None:  # a test's stand-in pipeline
            write_whole(path, text)
        else:
            committer.write_checkpoint(batch_id, lambda: write_whole(path, text))

    def first_start() -> Offsets:
        # Where a query with no batch yet starts: as pinned at an earlier start, else as
        # `starting_offsets` says (the log's start, or its end now), pinned for the next one.
        pinned = own.pinned_start()
        if pinned:
            return with_starts(pinned, starts)
        return with_starts(available, starts) if config.starting_offsets == "latest" else starts

    planned_ends: dict[str, Offsets | None] = {}  # a batch's end by its start, planned once

    def plan(start: Offsets) -> Offsets | None:
        key = json.dumps(start, sort_keys=True)
        if key not in planned_ends:
            planned_ends[key] = next_batch(start, capped_targets(start, available, caps), config.max_records_per_batch, cut)
        return planned_ends[key]

    # The query's health says running, batch by batch, while no query runs (aggregates/progress.py).
    def run(batch_id: int, start: Offsets, end: Offsets) -> None:
        # The rows the pipeline read itself where it did (records retention dropped unread, or a
        # compacted table's gaps, are not in them), else the offset span.
        with progress.batch(batch_id, lambda: pipeline.rows_read_on_driver.get(batch_id, records_between(start, end))):
            process(own.read(start, end), batch_id)
            write(batch_id, commits_dir / str(batch_id), _COMMIT)
        purge_before(checkpoint, batch_id - keep)

    ran = 0
    followed = False  # a rest followed in this drain already
    planned = logged_batches(offsets_dir)
    if planned and planned[-1] not in logged_batches(commits_dir):  # logged, not done: again, the same range
        last = planned[-1]
        before = with_starts(logged(planned[-2]), starts) if len(planned) > 1 else first_start()
        run(last, before, logged(last))
        ran += 1
    while stopping is None or not stopping():
        planned = logged_batches(offsets_dir)
        start = with_starts(logged(planned[-1]), starts) if planned else first_start()
        if not planned:
            own.pin_start(start)
            # Its position until a batch commits: a `latest` start that finds nothing new commits none.
            pipeline.notify_start(own.pinned_start() or start)
        end = plan(start)
        if end is None:
            break
        batch_id = planned[-1] + 1 if planned else 0
        write(batch_id, offsets_dir / str(batch_id), own.offsets_text(end, _metadata(offsets_dir, planned,
                                                                                     int(time.time() * 1000))))
        log.info("batch %d with chosen end offsets: %d offsets", batch_id, records_between(start, end))
        after_start = with_starts(end, starts)
        after = plan(after_start)
        # The rest of the backlog, not the next batch (which an append-time cut may have shortened).
        left = records_between(after_start, capped_targets(after_start, available, caps)) if after is not None else 0
        rest = follow_rest and after is not None and is_remainder(left, config.max_records_per_batch)
        if after is not None and not rest:  # read while this one runs
            own.ask(after_start, after, left)
        run(batch_id, start, end)
        ran += 1
        if rest:
            if followed:
                # Not a batch of its own planned from the log's end as this drain saw it: the drain
                # ends, even beside a stream as fast as it, and the serving loop's next drain plans the
                # rest with what came meanwhile (issue 28's end to end: 80 000 events then 310 000,
                # two batches' fixed costs, where one batch of 390 000 pays it once).
                break
            followed = True  # planned again with what the log holds now: one batch with what came meanwhile
            look()
            planned_ends.clear()
    return ran


def is_remainder(records: int, max_records: int) -> bool:
    """Whether what is left of a serving loop's backlog after the running batch is a rest (less
    than a full batch). It is then not read ahead but planned when the running batch ends, with
    what the log holds by then: records that came meanwhile (a live stream faster than the
    pipeline) join it, where they would otherwise be a batch of their own after it, each batch
    paying the store's per-batch writes (every open session, the tier rows, the keys' lookups)
    again. Issue 28's end to end: a 1 M-event batch, then its 70 000-event rest, then the 710 000
    that came meanwhile; and, with rests up to a quarter of a batch followed, a 1 M-event batch
    then its 250 000 rest (1.3 s) and the 350 000 that came meanwhile (1.6 s), where one batch of
    600 000 pays the fixed ~0.6 s once. A rest read here rather than ahead costs its read (~0.3 s
    for 1 M events), less than a batch's fixed cost."""
    return records < max_records

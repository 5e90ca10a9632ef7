"""The Spark source: a Python streaming data source over the event log.

Offsets are {stream: {partition: next offset}}; Spark checkpoints them, so a restarted
query resumes exactly where its last committed batch ended. Each micro-batch reads at
most `max_records_per_batch` records (admission control, fair across partitions; the tables
and the streams they enrich cut at one append time: ingest/append_cut.py) and
each task at most `max_records_per_task`. A new query starts at the earliest retained record
(`starting_offsets=earliest`, the default) or at the log's end (`latest`: only records appended
after its first start; those offsets are kept in the checkpoint folder until Spark has logged a
first batch, so a `latest` query that found nothing new does not skip what arrives before its
next start, as Spark's Kafka source keeps its own). Rows come out in the uniform schema of
`ingest.source_rows`, shared with the Kafka source.

The source never fails on a bad record: a record without a usable event time or ingest time,
and every offset of a segment that cannot be decoded, come out as rows whose `error` column
says why (null for good rows) and whose `error_kind` is `unparseable`: the pipeline dead-letters
them with that reason.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from catalog import Catalog, StreamDef
from ingest.append_cut import catalog_cut, share
from ingest.log import SqliteEventLog
from ingest.log.records import OFFSET
from ingest.source_rows import MISSING_EVENT_TIME, SOURCE_SCHEMA, SPARK_SCHEMA, error_batch, to_source_batch

__all__ = ["INITIAL_OFFSETS_FILE", "MISSING_EVENT_TIME", "SOURCE_NAME", "SOURCE_SCHEMA", "SPARK_SCHEMA",
           "SketchboardLogSource", "initial_offsets", "offsets_text", "pin_offsets", "read_batch", "read_slice",
           "source_options", "to_source_batch"]

SOURCE_NAME = "sketchboard_log"
INITIAL_OFFSETS_FILE = "sketchboard-initial-offsets.json"  # in the query's checkpoint folder

Offsets = dict[str, dict[str, int]]  # JSON-friendly: partition numbers as strings


@dataclass(frozen=True)
class LogSlice(InputPartition):
    stream: str
    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class LogTask(InputPartition):
    """What one Spark task reads: several slices, at most max_records_per_task records in all."""

    slices: tuple[LogSlice, ...]


def pack_slices(slices: list[LogSlice], max_records: int) -> list[LogTask]:
    """One task for a batch of at most `max_records` records, else one task per slice. A small
    batch (the steady state of a live stream) over many partitions would otherwise be one Python
    task per partition, each costing a fixed ~100 ms on a small machine: most of its latency.
    Big batches keep a task per slice, which spreads best over the cores."""
    if sum(s.end - s.start for s in slices) <= max_records:
        return [LogTask(tuple(slices))] if slices else []
    return [LogTask((s,)) for s in slices]


def read_slice(log: SqliteEventLog, stream: StreamDef, partition: int, start: int, end: int) -> Iterator[pa.RecordBatch]:
    """The source rows of [start, end) of one partition; never raises on a bad segment: its
    offsets come out as error rows instead and reading goes on after it."""
    for batch, good in _slice_batches(log, stream, partition, start, end):
        yield to_source_batch(stream, partition, batch) if good else batch


def _slice_batches(log: SqliteEventLog, stream: StreamDef, partition: int, start: int,
                   end: int) -> Iterator[tuple[pa.RecordBatch, bool]]:
    """[start, end) of one partition as (the log's batch, True) per segment read, or (the source's
    error rows, False) for the offsets of a segment that cannot be decoded, in offset order."""
    pos = start
    while pos < end:
        try:
            for batch in log.read(stream, partition, pos, end):
                if batch.num_rows:
                    pos = batch.column(OFFSET)[-1].as_py() + 1
                yield batch, True
            return
        except (sqlite3.Error, OSError, MemoryError):
            raise  # the log itself is unreadable right now: fail the batch (Spark retries it), lose nothing
        except Exception as exc:  # a corrupt segment: report its offsets, read on after it
            bounds = log.segment_at(stream.name, partition, pos)
            if bounds is None or bounds[0] >= end:
                raise  # not a segment problem we can step over
            lo, hi = max(bounds[0], pos), min(bounds[1], end)
            if hi <= lo:
                raise
            message = f"undecodable log segment (offsets {bounds[0]}..{bounds[1] - 1}): {type(exc).__name__}: {exc}"
            yield error_batch(stream.name, partition, lo, hi, message), False
            pos = hi


def batch_slices(catalog: Catalog, start: dict, end: dict, max_records: int) -> list[LogSlice]:
    """The slices of a batch from `start` to `end` offsets ({stream: {partition: offset}}, partitions
    as JSON strings or ints), at most `max_records` records each, streams of `catalog` only."""
    slices: list[LogSlice] = []
    for stream, parts in end.items():
        if stream not in catalog.streams:
            continue
        began = start.get(stream, {})
        for p, hi in parts.items():
            lo = began.get(p, began.get(str(p), 0))
            for a in range(lo, hi, max_records):
                slices.append(LogSlice(stream, int(p), a, min(hi, a + max_records)))
    return slices


def read_batch(log: SqliteEventLog, catalog: Catalog, start: dict, end: dict) -> pa.Table:
    """A batch's source rows, read in this process as the source's tasks read them (same slices,
    same order, same error rows): the pipeline reads a small batch on the driver this way, with no
    Spark job (aggregates/driver_batch.py).

    Each column is one chunk (none for a read of no rows): every step after the read wants its
    columns whole, and the copy that makes them so is made here, where a catch-up's read-ahead
    worker makes it on the other core (aggregates/read_ahead.py), not on the batch's own. The
    segments of a stream read one after the other become the source's rows together, in one
    conversion: its lists are then made by one take over the whole run, which is also the copy
    that puts them in one chunk (a segment at a time, a 10 000-event POST's share of a partition,
    cost a third more)."""
    out: list[pa.RecordBatch] = []
    run: list[pa.RecordBatch] = []
    partitions: list[int] = []
    run_stream: StreamDef | None = None

    def convert_run() -> None:
        if run:
            part = pa.array(np.repeat(np.array(partitions, np.int32), [b.num_rows for b in run]))
            out.append(to_source_batch(run_stream, part, pa.Table.from_batches(run)))
            run.clear()
            partitions.clear()

    for s in batch_slices(catalog, start, end, 2**62):
        stream = catalog.stream(s.stream)
        for batch, good in _slice_batches(log, stream, s.partition, s.start, s.end):
            if not good or run_stream is None or stream.name != run_stream.name:
                convert_run()
            if good:
                run_stream = stream
                run.append(batch)
                partitions.append(s.partition)
            else:
                run_stream = None
                out.append(batch)
    convert_run()
    return pa.Table.from_batches(out, schema=SOURCE_SCHEMA).combine_chunks()


def records_between(start: Mapping[str, Mapping[int, int]], end: Mapping[str, Mapping[int, int]]) -> int:
    """The records from `start` to `end` (a partition missing from `start`: from offset 0)."""
    return sum(max(0, hi - start.get(s, {}).get(p, 0)) for s, parts in end.items() for p, hi in parts.items())


def plan_end_offsets(start: Offsets, available: Offsets, max_rows: int | None) -> Offsets:
    """End offsets for the next batch: everything available, or at most max_rows in total,
    shared fairly (round-robin water-filling) so no partition starves."""
    end = {s: dict(parts) for s, parts in start.items()}
    backlog = {
        (s, p): hi - start.get(s, {}).get(p, 0)
        for s, parts in available.items()
        for p, hi in parts.items()
        if hi > start.get(s, {}).get(p, 0)
    }
    grant = backlog if max_rows is None else share(backlog, max_rows)
    for s, parts in available.items():
        for p, hi in parts.items():
            lo = start.get(s, {}).get(p, 0)
            end.setdefault(s, {})[p] = lo + grant.get((s, p), 0) if hi > lo else max(lo, 0)
    return end


class SketchboardLogReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]):
        self.log_path = options["log_path"]
        self.catalog = Catalog.model_validate_json(options["catalog"])
        self.max_records_per_batch = int(options.get("max_records_per_batch", "1000000"))
        self.max_records_per_task = int(options.get("max_records_per_task", "250000"))
        self.starting_offsets = options.get("starting_offsets", "earliest")
        self.initial_offsets_path = options.get("initial_offsets_path")
        self.end_offsets: Offsets = json.loads(options.get("end_offsets", "{}"))  # caps per stream and partition
        self._available_now: Offsets | None = None
        self._log: SqliteEventLog | None = None

    def _open(self) -> SqliteEventLog:
        if self._log is None:
            self._log = SqliteEventLog(self.log_path)
        return self._log

    def _available(self) -> Offsets:
        log = self._open()
        out = {name: {str(p): o.end for p, o in log.offsets(name).items()} for name in self.catalog.streams}
        for name, caps in self.end_offsets.items():
            for p, cap in caps.items():
                if p in out.get(name, {}):
                    out[name][p] = min(out[name][p], cap)
        return out

    def initialOffset(self) -> dict:
        log = self._open()
        if self.starting_offsets == "latest":
            return self._pinned(self._available)
        # Start from the earliest retained record of every stream (Kafka's "earliest"), pinned too:
        # the pipeline reads batch 0's start there (initial_offsets) to know its size before it runs.
        return self._pinned(lambda: {name: {str(p): o.start for p, o in log.offsets(name).items()}
                                     for name in self.catalog.streams})

    def _pinned(self, offsets) -> dict:
        """The offsets the query's first start chose, read back on later starts until Spark's
        own offset log takes over (it asks only when that log is empty)."""
        path = self.initial_offsets_path
        if path and os.path.exists(path):
            with open(path) as f:
                return json.load(f)
        chosen = offsets()
        if path:
            pin_offsets(path, chosen)
        return chosen

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_records_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self._available()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        available = self._available_now if self._available_now is not None else self._available()
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if isinstance(limit, ReadAllAvailable):
            max_rows = None
        # Streams added to the configuration after the query started begin at their log start.
        log = self._open()
        start = {s: dict(parts) for s, parts in start.items()}
        for name in self.catalog.streams:
            if name not in start:
                start[name] = {str(p): o.start for p, o in log.offsets(name).items()}
        planned = plan_end_offsets(start, available, max_rows)
        # A pipeline that enriches: its tables and enriched streams end at one append time, so an
        # event is never read before a change of its key appended ahead of it (ingest/append_cut.py).
        cut = catalog_cut(self.catalog, log.first_appended_after, log.ingest_time_ms)
        return planned if max_rows is None or cut is None else cut(start, available, planned)

    def reportLatestOffset(self) -> dict:
        return self._available()

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return pack_slices(batch_slices(self.catalog, start, end, self.max_records_per_task), self.max_records_per_task)

    def read(self, partition: LogTask) -> Iterator[pa.RecordBatch]:
        log = self._open()
        for part in partition.slices:
            yield from read_slice(log, self.catalog.stream(part.stream), part.partition, part.start, part.end)

    def commit(self, end: dict) -> None:
        # Retention is by age and size, independent of readers (as in Kafka): nothing to do.
        pass

    def stop(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


class SketchboardLogSource(DataSource):
    """Options: log_path, catalog (the Catalog as JSON), max_records_per_batch, max_records_per_task,
    starting_offsets (earliest | latest), initial_offsets_path."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SPARK_SCHEMA

    def streamReader(self, schema) -> DataSourceStreamReader:
        return SketchboardLogReader(self.options)


def offsets_text(offsets: dict) -> str:
    """Offsets as this source hands them to Spark, which logs and compares them as this very text
    (pyspark's streaming source runner: `json.dumps`, partitions as strings, in the dict's order)."""
    return json.dumps({stream: {str(p): int(o) for p, o in parts.items()} for stream, parts in offsets.items()})


def pin_offsets(path: str | os.PathLike, offsets: dict) -> None:
    """Keep where a query starts (`initial_offsets` reads it back), written whole."""
    path = str(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(offsets_text(offsets))
    os.replace(path + ".tmp", path)


def initial_offsets(checkpoint_dir: str | os.PathLike) -> dict[str, dict[int, int]]:
    """The start offsets the query checkpointed in `checkpoint_dir` chose at its first start (the
    source pins them there): batch 0's start, which Spark's offset log does not hold. Empty when
    not pinned (yet)."""
    try:
        with open(os.path.join(str(checkpoint_dir), INITIAL_OFFSETS_FILE)) as f:
            pinned = json.load(f)
    except (OSError, ValueError):
        return {}
    return {stream: {int(p): int(o) for p, o in parts.items()} for stream, parts in pinned.items()}


def source_options(log_path: str, catalog: Catalog, max_records_per_batch: int, max_records_per_task: int,
                   *, starting_offsets: str = "earliest", checkpoint_dir: str | None = None,
                   end_offsets: dict[str, dict[int, int]] | None = None) -> dict[str, str]:
    """`end_offsets`: {stream: {partition: offset}} the query reads no further than (a reprocessing
    run reads a window join's other stream only as far as the serving pipeline has: aggregates/reprocess.py)."""
    if starting_offsets not in ("earliest", "latest"):
        raise ValueError(f"starting offsets {starting_offsets!r}: earliest or latest")
    options = {
        "log_path": str(log_path),
        "catalog": catalog.model_dump_json(),
        "max_records_per_batch": str(max_records_per_batch),
        "max_records_per_task": str(max_records_per_task),
        "starting_offsets": starting_offsets,
    }
    if end_offsets:
        options["end_offsets"] = json.dumps({s: {str(p): int(o) for p, o in parts.items()}
                                             for s, parts in end_offsets.items()})
    if checkpoint_dir is not None:
        options["initial_offsets_path"] = os.path.join(str(checkpoint_dir), INITIAL_OFFSETS_FILE)
    return options


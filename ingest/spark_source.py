"""The Spark source: a Python streaming data source over the event log.

Offsets are {stream: {partition: next offset}}; Spark checkpoints them, so a restarted
query resumes exactly where its last committed batch ended. Each micro-batch reads at
most `max_records_per_batch` records (admission control, fair across partitions) and
each task at most `max_records_per_task`. Rows come out in one schema for every stream:
dimensions, values and distinct fields as arrays in the stream's declared order, so one
query aggregates all streams.

The source never fails on a bad record: a record without a usable event time or ingest time,
and every offset of a segment that cannot be decoded, come out as rows whose `error` column
says why (null for good rows); the pipeline dead-letters them as `unparseable`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from catalog import Catalog, StreamDef
from ingest.log import SqliteEventLog
from ingest.log.records import EVENT_TIME, INGEST_TIME, OFFSET

SOURCE_NAME = "sketchboard_log"

def _list(value_type: pa.DataType) -> pa.DataType:
    return pa.list_(pa.field("element", value_type))  # Spark's name for list items


# Exactly what Spark expects for SPARK_SCHEMA (nullable fields, "element" list items).
SOURCE_SCHEMA = pa.schema(
    [
        pa.field("stream", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("event_time", pa.int64()),
        pa.field("ingest_time", pa.int64()),
        pa.field("dims", _list(pa.string())),
        pa.field("vals", _list(pa.float64())),
        pa.field("ids", _list(pa.string())),
        pa.field("error", pa.string()),
    ]
)
SPARK_SCHEMA = (
    "stream string, partition int, offset bigint, event_time bigint, ingest_time bigint,"
    " dims array<string>, vals array<double>, ids array<string>, error string"
)
MISSING_EVENT_TIME = "record has no valid event time"
MISSING_INGEST_TIME = "record has no valid ingest time"

Offsets = dict[str, dict[str, int]]  # JSON-friendly: partition numbers as strings


@dataclass(frozen=True)
class LogSlice(InputPartition):
    stream: str
    partition: int
    start: int
    end: int


def _interleave(columns: list[pa.Array], n: int, value_type: pa.DataType, fill: str | None = None) -> pa.Array:
    """Row i of the result is [columns[0][i], columns[1][i], ...] (vectorised, no Python loop per row)."""
    width = len(columns)
    offsets = pa.array(np.arange(0, n * width + 1, width, dtype=np.int32) if width else np.zeros(n + 1, np.int32))
    if not width:
        return pa.ListArray.from_arrays(offsets, pa.array([], value_type), type=_list(value_type))
    flat = pa.concat_arrays([c.cast(value_type) for c in columns])
    order = (np.arange(n)[:, None] + np.arange(width)[None, :] * n).ravel()
    values = flat.take(pa.array(order))
    if fill is not None:
        values = values.fill_null(fill)
    return pa.ListArray.from_arrays(offsets, values, type=_list(value_type))


def to_source_batch(stream: StreamDef, partition: int, batch: pa.RecordBatch) -> pa.RecordBatch:
    """A log batch (projected onto the stream's definition) in the source's uniform schema."""
    n = batch.num_rows
    event_time, ingest_time = batch.column(EVENT_TIME), batch.column(INGEST_TIME)
    if event_time.null_count or ingest_time.null_count:
        error = pc.if_else(
            pc.is_null(event_time), pa.scalar(MISSING_EVENT_TIME),
            pc.if_else(pc.is_null(ingest_time), pa.scalar(MISSING_INGEST_TIME), pa.scalar(None, pa.string())),
        )
    else:
        error = pa.nulls(n, pa.string())
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(n, stream.name, dtype=object), pa.string()),
            pa.array(np.full(n, partition, dtype=np.int32)),
            batch.column(OFFSET),
            batch.column(EVENT_TIME),
            batch.column(INGEST_TIME),
            _interleave([batch.column(d) for d in stream.dimensions], n, pa.string(), fill=""),
            _interleave([batch.column(v) for v in stream.values], n, pa.float64()),
            _interleave([batch.column(f) for f in stream.distinct_fields], n, pa.string()),
            error,
        ],
        schema=SOURCE_SCHEMA,
    )


def error_batch(stream: str, partition: int, start: int, end: int, error: str) -> pa.RecordBatch:
    """One row per offset in [start, end) that could not be decoded, carrying the error."""
    n = end - start
    empty_strings = pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.string()),
                                             type=_list(pa.string()))
    empty_doubles = pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.float64()),
                                             type=_list(pa.float64()))
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(n, stream, dtype=object), pa.string()),
            pa.array(np.full(n, partition, dtype=np.int32)),
            pa.array(np.arange(start, end, dtype=np.int64)),
            pa.nulls(n, pa.int64()),
            pa.nulls(n, pa.int64()),
            empty_strings,
            empty_doubles,
            empty_strings,
            pa.array(np.full(n, error[:500], dtype=object), pa.string()),
        ],
        schema=SOURCE_SCHEMA,
    )


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
    pos = start
    while pos < end:
        try:
            for batch in log.read(stream, partition, pos, end):
                out = to_source_batch(stream, partition, batch)
                if out.num_rows:
                    pos = out.column(2)[-1].as_py() + 1
                yield out
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
            yield error_batch(stream.name, partition, lo, hi, message)
            pos = hi


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
    grant = dict.fromkeys(backlog, 0)
    if max_rows is None:
        grant = backlog
    else:
        budget = max_rows
        pending = sorted(backlog, key=lambda k: backlog[k])
        while budget > 0 and pending:
            share = max(1, budget // len(pending))
            still = []
            for k in pending:
                take = min(share, backlog[k] - grant[k], budget)
                grant[k] += take
                budget -= take
                if grant[k] < backlog[k]:
                    still.append(k)
                if budget == 0:
                    break
            pending = still
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
        self._available_now: Offsets | None = None
        self._log: SqliteEventLog | None = None

    def _open(self) -> SqliteEventLog:
        if self._log is None:
            self._log = SqliteEventLog(self.log_path)
        return self._log

    def _available(self) -> Offsets:
        log = self._open()
        return {
            name: {str(p): o.end for p, o in log.offsets(name).items()} for name in self.catalog.streams
        }

    def initialOffset(self) -> dict:
        log = self._open()
        # Start from the earliest retained record of every stream (Kafka's "earliest").
        return {name: {str(p): o.start for p, o in log.offsets(name).items()} for name in self.catalog.streams}

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
        return plan_end_offsets(start, available, max_rows)

    def reportLatestOffset(self) -> dict:
        return self._available()

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        slices: list[LogSlice] = []
        for stream, parts in end.items():
            if stream not in self.catalog.streams:
                continue
            for p, hi in parts.items():
                lo = start.get(stream, {}).get(p, 0)
                for a in range(lo, hi, self.max_records_per_task):
                    slices.append(LogSlice(stream, int(p), a, min(hi, a + self.max_records_per_task)))
        return pack_slices(slices, self.max_records_per_task)

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
    """Options: log_path, catalog (the Catalog as JSON), max_records_per_batch, max_records_per_task."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SPARK_SCHEMA

    def streamReader(self, schema) -> DataSourceStreamReader:
        return SketchboardLogReader(self.options)


def source_options(log_path: str, catalog: Catalog, max_records_per_batch: int, max_records_per_task: int) -> dict[str, str]:
    return {
        "log_path": str(log_path),
        "catalog": catalog.model_dump_json(),
        "max_records_per_batch": str(max_records_per_batch),
        "max_records_per_task": str(max_records_per_task),
    }


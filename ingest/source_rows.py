"""The rows every Spark source of the log produces, whatever the backend (pure Arrow, no Spark).

One schema for every stream: dimensions, values and distinct fields as arrays in the stream's
declared order, so one query aggregates all streams. Both sources build their rows here, so the
projection onto a stream's definition is written once: the embedded log's source
(`ingest.spark_source`) from its stored segments, Spark's Kafka source (`ingest.kafka_source`)
from JSON records it validated with the API's own validator.

A record that is not a usable event is a row too, never an exception: `error` says why and
`error_kind` which dead-letter reason it gets — `unparseable` (the source could not decode it:
a corrupt embedded segment, a record without an event or ingest time) or `invalid` (a record
that bypassed the API, e.g. produced straight to Kafka, and fails the API's validation).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from catalog import StreamDef
from ingest.log.records import EVENT_TIME, INGEST_TIME, OFFSET, bools, one_chunk

UNPARSEABLE = "unparseable"
INVALID = "invalid"
MISSING_EVENT_TIME = "record has no valid event time"
MISSING_INGEST_TIME = "record has no valid ingest time"
MAX_ERROR_CHARS = 500  # an error message is kept, not a whole 1 MB record echoed back


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
        pa.field("error_kind", pa.string()),
        # Device clocks (catalog: sent_time_field): when the device sent the record, by its clock,
        # and whose clock it is; null for streams that declare no sent time.
        pa.field("sent_time", pa.int64()),
        pa.field("device", pa.string()),
    ]
)
SPARK_SCHEMA = (
    "stream string, partition int, offset bigint, event_time bigint, ingest_time bigint,"
    " dims array<string>, vals array<double>, ids array<string>, error string, error_kind string,"
    " sent_time bigint, device string"
)


def interleave(columns: list[pa.Array | pa.ChunkedArray], n: int, value_type: pa.DataType,
               fill: str | None = None) -> pa.Array:
    """Row i of the result is [columns[0][i], columns[1][i], ...] (vectorised, no Python loop per row).
    A column may come in chunks (a batch's segments): they are concatenated here, in the one copy
    the take needs anyway, not put together first."""
    width = len(columns)
    offsets = pa.array(np.arange(0, n * width + 1, width, dtype=np.int32) if width else np.zeros(n + 1, np.int32))
    if not width:
        return pa.ListArray.from_arrays(offsets, pa.array([], value_type), type=_list(value_type))
    if pa.types.is_floating(value_type) and fill is None:
        return pa.ListArray.from_arrays(offsets, _interleaved_numbers(columns, n, value_type), type=_list(value_type))
    flat = pa.concat_arrays([chunk for c in columns for chunk in _chunks(c.cast(value_type))])
    # int32 where the items fit (always, but past 2^31): a 1 M-event batch's 7 dimensions make 28 MB
    # of indices, not 56. Past 32 MiB glibc maps an array on its own and unmaps it when freed, so each
    # batch faulted all of it in again (sketchboard/allocators.py); below, its heap keeps the pages.
    index = np.int32 if n * width < 2**31 else np.int64
    order = (np.arange(n, dtype=index)[:, None] + (np.arange(width, dtype=index) * index(n))[None, :]).ravel()
    values = flat.take(pa.array(order))
    if fill is not None and values.null_count:
        values = values.fill_null(fill)
    return pa.ListArray.from_arrays(offsets, values, type=_list(value_type))


def _interleaved_numbers(columns: list[pa.Array | pa.ChunkedArray], n: int, value_type: pa.DataType) -> pa.Array:
    """The columns' numbers row by row, written into one (rows, columns) numpy array: what
    `interleave`'s take does for strings, at a fifth of its cost for numbers (a batch of 500 000
    events' two values: ~9 against ~1.2 ms; 10 against 3-5 with nulls)."""
    out = np.empty((n, len(columns)), value_type.to_pandas_dtype())
    valid = np.ones((n, len(columns)), bool)
    nulls = 0
    for j, column in enumerate(columns):
        column = one_chunk(column.cast(value_type))
        out[:, j] = column.to_numpy(zero_copy_only=False)
        if column.null_count:
            valid[:, j] = bools(column.is_valid())
            nulls += column.null_count
    return pa.array(out.ravel(), value_type, mask=~valid.ravel() if nulls else None)


def repeated_text(text: str, n: int) -> pa.Array:
    """`text` n times as Arrow strings: one kernel, where an object array of n references converted
    cost ~100 times more (100 000 rows: 26 against 0.3 ms; a batch of the demo makes several such
    columns of ~50 000 rows: the stream of its source rows, its Bloom rows and runs)."""
    return pa.repeat(pa.scalar(text, pa.string()), n)


def _chunks(column: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    return column.chunks if isinstance(column, pa.ChunkedArray) else [column]


def _partitions(partition: int | pa.Array, n: int) -> pa.Array:
    if isinstance(partition, pa.Array):
        return partition.cast(pa.int32())
    return pa.array(np.full(n, partition, dtype=np.int32))


def to_source_batch(stream: StreamDef, partition: int | pa.Array,
                    batch: pa.RecordBatch | pa.Table) -> pa.RecordBatch:
    """A log batch (projected onto the stream's definition, offset column first) in the source's
    uniform schema; `partition` is one for all rows, or one per row (an array). A table's chunks
    (a batch's segments, read one by one) become one batch."""
    n = batch.num_rows
    event_time, ingest_time = one_chunk(batch.column(EVENT_TIME)), one_chunk(batch.column(INGEST_TIME))
    if event_time.null_count or ingest_time.null_count:
        error = pc.if_else(
            pc.is_null(event_time), pa.scalar(MISSING_EVENT_TIME),
            pc.if_else(pc.is_null(ingest_time), pa.scalar(MISSING_INGEST_TIME), pa.scalar(None, pa.string())),
        )
        kind = pc.if_else(pc.is_null(error), pa.scalar(None, pa.string()), pa.scalar(UNPARSEABLE))
    else:
        error = kind = pa.nulls(n, pa.string())
    return pa.RecordBatch.from_arrays(
        [
            repeated_text(stream.name, n),
            _partitions(partition, n),
            one_chunk(batch.column(OFFSET)),
            event_time,
            ingest_time,
            interleave([batch.column(d) for d in stream.dimensions], n, pa.string(), fill=""),
            interleave([batch.column(v) for v in stream.values], n, pa.float64()),
            interleave([batch.column(f) for f in stream.source_ids], n, pa.string()),
            error,
            kind,
            one_chunk(batch.column(stream.sent_time_field)) if stream.sent_time_field else pa.nulls(n, pa.int64()),
            _device(batch.column(stream.device_key_field)) if stream.sent_time_field else pa.nulls(n, pa.string()),
        ],
        schema=SOURCE_SCHEMA,
    )


def _device(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The device whose clock stamped the record: null where the event names none. A missing
    dimension is stored as "" (ingest/events.py), and "" as a device would make every event
    without one a single device, whose offset the smallest among them corrects them all by."""
    column = one_chunk(column)
    return pc.if_else(pc.equal(column, ""), pa.scalar(None, pa.string()), column)


def error_rows(stream: str, partition: int | pa.Array, offsets: pa.Array, errors: list[str], kind: str,
               ingest_time: pa.Array | None = None) -> pa.RecordBatch:
    """One row per record that is not an event: its place, its error and its dead-letter reason
    (`kind`); the ingest time where the source knows it (a Kafka record's timestamp)."""
    n = len(offsets)
    empty_strings = pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.string()),
                                             type=_list(pa.string()))
    empty_doubles = pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.float64()),
                                             type=_list(pa.float64()))
    return pa.RecordBatch.from_arrays(
        [
            repeated_text(stream, n),
            _partitions(partition, n),
            offsets.cast(pa.int64()),
            pa.nulls(n, pa.int64()),
            pa.nulls(n, pa.int64()) if ingest_time is None else ingest_time.cast(pa.int64()),
            empty_strings,
            empty_doubles,
            empty_strings,
            pa.array([e[:MAX_ERROR_CHARS] for e in errors], pa.string()),
            repeated_text(kind, n),
            pa.nulls(n, pa.int64()),
            pa.nulls(n, pa.string()),
        ],
        schema=SOURCE_SCHEMA,
    )


def error_batch(stream: str, partition: int, start: int, end: int, error: str) -> pa.RecordBatch:
    """One `unparseable` row per offset in [start, end) that could not be decoded, carrying the error."""
    return error_rows(stream, partition, pa.array(np.arange(start, end, dtype=np.int64)), [error] * (end - start),
                      UNPARSEABLE)

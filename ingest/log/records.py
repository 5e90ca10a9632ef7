"""The record format of the log: a batch of events as one Arrow IPC message.

Like a Kafka record batch, one append of a partition's events becomes one segment:
columns for the event and ingest times, each declared field typed (strings as
strings, values as float64) and undeclared fields as a JSON text column. Offsets are
implicit (base offset + row number). Readers project segments onto the stream's
current definition, so a field added later reads as null in older segments.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import pyarrow as pa

from catalog import StreamDef
from ingest.events import Event

EVENT_TIME = "__event_time"
INGEST_TIME = "__ingest_time"
EXTRA = "__extra"
OFFSET = "__offset"

_WRITE_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")


def segment_schema(stream: StreamDef) -> pa.Schema:
    fields = [pa.field(EVENT_TIME, pa.int64(), nullable=False), pa.field(INGEST_TIME, pa.int64(), nullable=False)]
    fields += [pa.field(name, pa.string()) for name in stream.string_fields]
    fields += [pa.field(name, pa.float64()) for name in stream.values]
    fields.append(pa.field(EXTRA, pa.string()))
    return pa.schema(fields)


def events_to_batch(stream: StreamDef, events: Sequence[Event], ingest_time_ms: int) -> pa.RecordBatch:
    columns: list[pa.Array] = [
        pa.array([e.event_time_ms for e in events], pa.int64()),
        pa.array([ingest_time_ms] * len(events), pa.int64()),
    ]
    columns += [pa.array([e.strings.get(name) for e in events], pa.string()) for name in stream.string_fields]
    columns += [pa.array([e.numbers.get(name) for e in events], pa.float64()) for name in stream.values]
    columns.append(
        pa.array([json.dumps(e.extra, separators=(",", ":")) if e.extra else None for e in events], pa.string())
    )
    return pa.RecordBatch.from_arrays(columns, schema=segment_schema(stream))


def encode_segment(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=_WRITE_OPTIONS) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def decode_segment(data: bytes) -> pa.RecordBatch:
    reader = pa.ipc.open_stream(pa.py_buffer(data))
    batches = list(reader)
    return batches[0] if len(batches) == 1 else pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def project(batch: pa.RecordBatch, stream: StreamDef) -> pa.RecordBatch:
    """Conform a stored segment to the stream's current definition (missing fields -> null,
    missing dimensions -> "", undeclared columns dropped)."""
    schema = segment_schema(stream)
    n = batch.num_rows
    names = set(batch.schema.names)
    columns = []
    for field in schema:
        if field.name in names:
            column = batch.column(field.name)
            if column.type != field.type:
                column = column.cast(field.type, safe=False)
        elif field.name in stream.dimensions:
            column = pa.array([""] * n, pa.string())
        else:
            column = pa.nulls(n, field.type)
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=schema)

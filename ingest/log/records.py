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
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa

from catalog import StreamDef
from catalog.times import EPOCH_MS_THRESHOLD, parse_event_time_ms
from ingest.json_limits import JsonLimits, violation
from ingest.events import Event, EventValidator, label_problem

EVENT_TIME = "__event_time"
INGEST_TIME = "__ingest_time"
EXTRA = "__extra"
OFFSET = "__offset"

# A segment is an Arrow IPC stream in one LZ4 frame. Arrow's own IPC compression (lz4 per
# buffer: what segments were before, still read) starts a compressor for each of a batch's ~24
# buffers: 0.35-0.55 ms for a 250-record segment (a 1 000-event request makes four), half the
# ingest API's work per request; one frame is ~0.03 ms, the same size, and faster to read.
LZ4_FRAME_MAGIC = b"\x04\x22\x4d\x18"


def segment_schema(stream: StreamDef) -> pa.Schema:
    fields = [pa.field(EVENT_TIME, pa.int64(), nullable=False), pa.field(INGEST_TIME, pa.int64(), nullable=False)]
    fields += [pa.field(name, pa.string()) for name in stream.string_fields]
    fields += [pa.field(name, pa.float64()) for name in stream.values]
    if stream.sent_time_field:  # epoch ms by the device's clock (catalog: sent_time_field)
        fields.append(pa.field(stream.sent_time_field, pa.int64()))
    fields.append(pa.field(EXTRA, pa.string()))
    return pa.schema(fields)


def events_to_batch(stream: StreamDef, events: Sequence[Event], ingest_time_ms: int | Sequence[int]) -> pa.RecordBatch:
    """One ingest time for all (an embedded append) or one per event (Kafka record timestamps)."""
    # Anything but a sequence is the one time of the whole append (an int, or numpy's, say).
    ingest = list(ingest_time_ms) if isinstance(ingest_time_ms, Sequence) else [ingest_time_ms] * len(events)
    columns: list[pa.Array] = [
        pa.array([e.event_time_ms for e in events], pa.int64()),
        pa.array(ingest, pa.int64()),
    ]
    columns += [pa.array([e.strings.get(name) for e in events], pa.string()) for name in stream.string_fields]
    columns += [pa.array([e.numbers.get(name) for e in events], pa.float64()) for name in stream.values]
    if stream.sent_time_field:
        columns.append(pa.array([e.sent_time_ms for e in events], pa.int64()))
    columns.append(
        pa.array([json.dumps(e.extra, separators=(",", ":")) if e.extra else None for e in events], pa.string())
    )
    return pa.RecordBatch.from_arrays(columns, schema=segment_schema(stream))


def columns_to_batch(stream: StreamDef, columns: pa.Table, ingest_time_ms: int | pa.Array) -> pa.RecordBatch:
    """The segment batch of events already in columns (ingest/columnar.py): the same layout as
    `events_to_batch` gives for the same events (no undeclared fields: `__extra` is null). One
    ingest time for all (an API append) or an array of one per event (Kafka record timestamps)."""
    n = columns.num_rows
    ingest = (ingest_time_ms.cast(pa.int64()) if isinstance(ingest_time_ms, pa.Array)
              else pa.array(np.full(n, ingest_time_ms, dtype=np.int64)))
    arrays: list[pa.Array] = [
        one_chunk(columns.column(stream.time_field)),
        ingest,
    ]
    arrays += [one_chunk(columns.column(name)) for name in stream.string_fields]
    arrays += [one_chunk(columns.column(name)) for name in stream.values]
    arrays.append(pa.nulls(n, pa.string()))
    return pa.RecordBatch.from_arrays(arrays, schema=segment_schema(stream))


def one_chunk(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A column as one Arrow array: a ChunkedArray's combine_chunks copies even a single chunk
    (~24 ms for 1 M strings), so one chunk is taken as it is."""
    if isinstance(column, pa.ChunkedArray):
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return column


def bools(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A boolean column without nulls as numpy booleans, unpacked from its bitmap by numpy: Arrow's
    `to_numpy(zero_copy_only=False)` converts bit by bit, ~1.2 ms a million rows against ~0.06,
    and a batch makes a few dozen such masks (~2 % of the pipeline's CPU in the end to end). A
    column with nulls is converted as Arrow converts it (an object array: the caller's choice)."""
    array = one_chunk(column)
    if array.null_count or not pa.types.is_boolean(array.type):
        return array.to_numpy(zero_copy_only=False)
    n = len(array)
    if n == 0:
        return np.zeros(0, bool)
    bits = np.frombuffer(array.buffers()[1], np.uint8)
    return np.unpackbits(bits, count=array.offset + n, bitorder="little")[array.offset:].view(bool)


_LZ4_FRAME = pa.Codec("lz4")  # Arrow's "lz4" codec writes the LZ4 frame format


def encode_segment(batch: pa.RecordBatch) -> bytes:
    """The IPC stream written whole, then compressed into one frame in one call: streaming it
    through a CompressedOutputStream cost ~0.13 ms a 250-record segment against ~0.09 (a
    1 000-event request writes four). `decode_segment` reads either."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return _LZ4_FRAME.compress(sink.getvalue(), asbytes=True)


def restamped_segment(data: bytes, ingest_time_ms: int) -> bytes:
    """A segment whose records all carry `ingest_time_ms` as their ingest time (the log's
    append time, which it keeps monotone per partition: ingest/log/sqlite.py)."""
    return encode_segment(with_ingest_time(decode_segment(data), ingest_time_ms))


def with_ingest_time(batch: pa.RecordBatch, ingest_time_ms: int) -> pa.RecordBatch:
    """The batch with every record's ingest time `ingest_time_ms` (its other columns shared)."""
    at = batch.schema.get_field_index(INGEST_TIME)
    times = pa.array(np.full(batch.num_rows, ingest_time_ms, np.int64), batch.schema.field(at).type)
    return batch.set_column(at, batch.schema.field(at), times)


def decode_segment(data: bytes) -> pa.RecordBatch:
    """A segment's batch: one LZ4 frame holding an IPC stream, or (older segments) an IPC
    stream with lz4-compressed buffers. A corrupt frame raises ValueError, not Arrow's OSError:
    the source steps over a segment it cannot decode but fails the batch on an I/O error
    (ingest/spark_source.py)."""
    source = pa.py_buffer(data)
    if data[:4] == LZ4_FRAME_MAGIC:
        try:
            source = pa.CompressedInputStream(pa.BufferReader(source), "lz4").read_buffer()
        except OSError as exc:
            raise ValueError(f"corrupt segment frame: {exc}") from None
    reader = pa.ipc.open_stream(source)
    batches = list(reader)
    return batches[0] if len(batches) == 1 else pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def project(batch: pa.RecordBatch, stream: StreamDef) -> pa.RecordBatch:
    """Conform a stored segment to the stream's current definition (missing fields -> null,
    missing dimensions -> "", undeclared columns dropped)."""
    schema = segment_schema(stream)
    if batch.schema.equals(schema):
        # Written under the stream's current definition, as nearly every segment is: nothing to
        # conform. Rebuilt field by field it cost ~45 us a segment (~15 ms of a 500 000-event read).
        return batch
    n = batch.num_rows
    names = set(batch.schema.names)
    extras: list[dict] | None = None
    columns = []
    for field in schema:
        if field.name in names:
            column = batch.column(field.name)
            if column.type != field.type:
                column = _cast_or_null(column, field.type)
        else:
            # Declared after these records were written: the value may be among their extra fields.
            if extras is None:
                extras = [json.loads(x) if x else {} for x in batch.column(EXTRA).to_pylist()] if EXTRA in names else []
            column = (_times_from_extras(extras, field.name, n) if field.name == stream.sent_time_field
                      else _from_extras(extras, field.name, field.type, n))
            if field.name in stream.dimensions:
                column = column.fill_null("")
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _cast_or_null(column: pa.Array, target: pa.DataType) -> pa.Array:
    """A field whose role changed (say, a dimension became a value): what converts, converts;
    the rest reads as null rather than failing every read of the old segments."""
    try:
        return column.cast(target, safe=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return pa.array([_coerce(v, target) for v in column.to_pylist()], target)


def _from_extras(extras: list[dict], name: str, target: pa.DataType, n: int) -> pa.Array:
    if not extras or not any(name in e for e in extras):
        return pa.nulls(n, target)
    return pa.array([_coerce(e.get(name), target) for e in extras], target)


def _times_from_extras(extras: list[dict], name: str, n: int) -> pa.Array:
    """A sent time declared after these records were written: read as the validator reads it
    (epoch ms, epoch s or RFC 3339); a value that is not a time reads as null (no clock sample)."""
    def parsed(value):
        try:
            return None if value is None else parse_event_time_ms(value)
        except ValueError:
            return None
    if not extras:
        return pa.nulls(n, pa.int64())
    return pa.array([parsed(e.get(name)) for e in extras], pa.int64())


def _coerce(value, target: pa.DataType):
    if value is None or isinstance(value, (dict, list)):
        return None
    if pa.types.is_string(target):
        label = ("true" if value else "false") if isinstance(value, bool) else str(value)
        # Kept unchecked as an extra field: what the validator would refuse as a label (a NUL, a
        # lone surrogate, too long) reads as null, as a value that does not convert.
        return None if label_problem(label) else label
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None


# -- JSON records (Kafka) ------------------------------------------------------------------
# On Kafka a record's value is one JSON event, exactly what a producer may send to the
# stream's topic directly, so the API's records and a direct producer's read the same way.


def event_to_json(stream: StreamDef, event: Event) -> bytes:
    """The JSON record of a validated event; validating it again gives the same event."""
    record: dict = dict(event.extra)
    record[stream.time_field] = _time_text(event.event_time_ms)
    record.update((k, v) for k, v in event.strings.items() if v is not None)
    record.update((k, v) for k, v in event.numbers.items() if v is not None)
    if stream.sent_time_field and event.sent_time_ms is not None:
        record[stream.sent_time_field] = _time_text(event.sent_time_ms)
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _time_text(ms: int) -> int | str:
    # Below 10^11 a number reads as epoch *seconds*: such times (before 1973) go as RFC 3339
    # text, which reads back to the same millisecond; every real one stays a cheap integer.
    if ms >= EPOCH_MS_THRESHOLD:
        return ms
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def json_to_event(validator: EventValidator, value: bytes | None, limits: JsonLimits | None = None) -> Event:
    """Decode and validate one JSON record; ValueError says why it is not an event. With
    `limits`, the record is bounded as the ingest API bounds an event (after the validator,
    whose messages about declared fields say more), with the same message."""
    if value is None:
        raise ValueError("record has no value (a tombstone), not a JSON event")
    try:
        raw = json.loads(value)
    except RecursionError:  # a value nested thousands deep: a bad record, not a crashed reader
        raise ValueError("record is not JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of over 4300 digits
        raise ValueError(f"record is not JSON: {exc}") from None
    event = validator.validate(raw)
    if limits is not None and (problem := violation(raw, limits)):
        raise ValueError(problem)
    return event


def with_offsets(offsets: Sequence[int] | range | pa.Array, batch: pa.RecordBatch) -> pa.RecordBatch:
    """The read format of every backend: the offset column first, then the projected columns."""
    if isinstance(offsets, range) and offsets.step == 1:
        # A segment's offsets are a range: made by numpy, not converted int by int from Python
        # (~0.1 s of a 1 M-event batch's read).
        column = pa.array(np.arange(offsets.start, max(offsets.start, offsets.stop), dtype=np.int64))
    else:
        column = (offsets.cast(pa.int64()) if isinstance(offsets, pa.Array)
                  else pa.array(offsets, pa.int64()))
    return pa.RecordBatch.from_arrays(
        [column, *batch.columns],
        schema=batch.schema.insert(0, pa.field(OFFSET, pa.int64(), nullable=False)),
    )

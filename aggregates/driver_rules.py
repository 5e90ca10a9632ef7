"""The batch's Spark rules again, in Arrow, for a small batch held on the driver.

A small batch (aggregates/driver_batch.py) is a pyarrow table of source rows: read in Python from
the embedded log, or collected once from Spark's Kafka source. Every step runs over that table
in Python and Arrow, so a batch at the demo's rate makes no call into the JVM besides Spark's own
trigger: each such call was ~0.5-1 ms, a Catalyst plan over local rows ~50 ms, and a collect of
20 000 local rows as Python Row objects several seconds. What the rules are (the dead-letter
reason, the pane, the device clock correction) is written here a second time, beside Spark's
expressions (aggregates/partials.py, aggregates/device_clocks.py) that the large batches run;
tests/spark/test_driver_rules.py draws random records with Hypothesis and checks the two agree,
nulls, out-of-range array slots and all.

Pure: no pyspark import, no I/O; the batch's instant is given.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aggregates.clock_offsets import DEFAULT_BUCKET_MS
from aggregates.eventtime import BEYOND_RETENTION, FUTURE_SKEW, MISSING_EVENT_ID, UNPARSEABLE
from aggregates.stream_codes import per_stream_values, stream_rows
from catalog import Catalog
from ingest.log.records import bools, one_chunk

DEAD_RECORD_FIELDS = ("partition", "offset", "event_time", "ingest_time", "error", "dims", "raw_event_time",
                      "clock_correction")


def list_get(lists: pa.Array | pa.ChunkedArray, index: int, rows: np.ndarray | None = None) -> pa.Array:
    """Spark's `get(array, index)`: the item at `index`, null for a null list or one too short
    (`pyarrow.compute.list_element` raises on those). `rows`: of those rows only, in that order
    (the lists are not copied to pick them first)."""
    lists = one_chunk(lists)
    lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False)
    starts = lists.offsets.to_numpy()[:-1]
    if rows is not None:
        lengths, starts = lengths[rows], starts[rows]
    where = pa.array(starts + index, pa.int64(), mask=lengths <= index)
    return lists.values.take(where)


def stream_is(streams: pa.Array, names: Iterable[str]) -> pa.Array:
    """Whether each row's stream is one of `names` (false, never null)."""
    return pa.array(stream_rows(streams, names), pa.bool_())


def dead_reasons(records: pa.Table, catalog: Catalog, batch_now_ms: int) -> pa.Array:
    """Each row's dead-letter reason, null for a row to merge: `partials.dead_letter_reason_column`
    (the rule of aggregates/eventtime.py, first match wins)."""
    n = records.num_rows
    stream = one_chunk(records.column("stream"))
    event_time = one_chunk(records.column("event_time"))
    ingest_time = one_chunk(records.column("ingest_time"))
    error = one_chunk(records.column("error"))
    # Each row's reason as an index into `labels` (-1: none yet), made strings by one take at the
    # end: an object array of a batch's rows and its Python strings cost ~5 times as much.
    labels: list[str] = []
    code = np.full(n, -1, np.int64)

    def label(value: str) -> int:
        if value not in labels:
            labels.append(value)
        return labels.index(value)

    def rule(matches: np.ndarray, value) -> None:
        """The rows still without a reason that `matches` get `value`: one reason, or an Arrow
        array of one per row."""
        hit = np.flatnonzero((code < 0) & matches)
        if not len(hit):
            return
        if isinstance(value, str):
            code[hit] = label(value)
            return
        encoded = pc.dictionary_encode(value.take(pa.array(hit)))
        codes = np.array([label(v) for v in encoded.dictionary.to_pylist()], np.int64)
        code[hit] = codes[encoded.indices.to_numpy(zero_copy_only=False)]

    has_error = bools(error.is_valid())
    rule(has_error, pc.fill_null(one_chunk(records.column("error_kind")), UNPARSEABLE))
    rule(~(bools(event_time.is_valid()) & bools(ingest_time.is_valid())), UNPARSEABLE)
    with_ids = [s for s in catalog.streams.values() if s.event_id_field]
    if with_ids:
        missing = np.zeros(n, dtype=bool)
        for s in with_ids:
            of_stream = stream_rows(stream, [s.name])
            no_id = bools(list_get(records.column("ids"), s.source_ids.index(s.event_id_field)).is_null())
            missing |= of_stream & no_id
        rule(missing, MISSING_EVENT_ID)
    retention = per_stream_values(stream, {name: s.retention for name, s in catalog.streams.items()})
    skew = per_stream_values(stream, {name: s.max_future_skew for name, s in catalog.streams.items()})
    beyond = pc.less(event_time, pc.subtract(pa.scalar(batch_now_ms, pa.int64()), retention))
    rule(_true(beyond), BEYOND_RETENTION)
    future = pc.greater(event_time, pc.add(ingest_time, skew))
    rule(_true(future), FUTURE_SKEW)
    if not labels:
        return pa.nulls(n, pa.string())
    return pa.array(labels, pa.string()).take(pa.array(code, mask=code < 0))


def keyed(records: pa.Table, catalog: Catalog, batch_now_ms: int) -> pa.Table:
    """`records` with their dead-letter reason, pane start, grouping dims and dead record, as
    `partials.keyed_on_driver` collects them from Spark (same columns, same order)."""
    records = records.combine_chunks()
    if "clock_correction" not in records.column_names:  # no device clock step ran
        records = with_clock_columns(records)
    reason = dead_reasons(records, catalog, batch_now_ms)
    good = reason.is_null()
    event_time = one_chunk(records.column("event_time"))
    pane_ms = per_stream_values(one_chunk(records.column("stream")), {n: s.pane for n, s in catalog.streams.items()})
    # Spark's pmod: never negative for a positive pane, as numpy's % is.
    times = pc.fill_null(event_time, 0).to_numpy(zero_copy_only=False)
    panes = pc.fill_null(pane_ms, 1).to_numpy(zero_copy_only=False)
    start = pa.array(times - np.mod(times, panes), pa.int64(),
                     mask=~(bools(good) & bools(event_time.is_valid()) & bools(pane_ms.is_valid())))
    dims = one_chunk(records.column("dims"))
    fields = [records.schema.field(f) for f in DEAD_RECORD_FIELDS]
    if reason.null_count == len(reason):
        # Nothing dead-lettered (a batch's usual case): the grouping dims are the dims and no row
        # has a dead record, which the choices below give too, at two copies of the lists less.
        g_dims = dims
        dead_record = pa.nulls(len(dims), pa.struct(fields))
    else:
        g_dims = pc.if_else(good, dims, pa.nulls(len(dims), dims.type))
        struct = pa.StructArray.from_arrays([one_chunk(records.column(f.name)) for f in fields], fields=fields)
        dead_record = pc.if_else(good, pa.nulls(len(struct), struct.type), struct)
    return (records.append_column("dead_reason", reason).append_column("pane_start", start)
            .append_column("g_dims", g_dims).append_column("dead_record", dead_record))


def with_clock_columns(records: pa.Table) -> pa.Table:
    """`device_clocks.with_clock_columns`: the batch no device clock touched."""
    return (records.append_column("raw_event_time", records.column("event_time"))
            .append_column("clock_correction", pa.nulls(records.num_rows, pa.int64())))


def clock_samples(records: pa.Table, streams: Iterable[str]) -> list[tuple[str, str, int, int]]:
    """`DeviceClocks.samples` on the driver: per (stream, device, bucket of receive time) the
    smallest received - sent, in the order the groups first appear."""
    streams = list(streams)
    condition = pc.and_(stream_is(records.column("stream"), streams), pc.and_(
        pc.and_(records.column("sent_time").is_valid(), records.column("device").is_valid()),
        pc.and_(records.column("ingest_time").is_valid(), records.column("error").is_null())))
    # Only the columns read below are filtered: not the batch's list columns (its dims and values).
    sampled = records.select(["stream", "device", "ingest_time", "sent_time"]).filter(condition)
    if not sampled.num_rows:
        return []
    ingest = sampled.column("ingest_time")
    rows = pa.table({
        "stream": sampled.column("stream"), "device": sampled.column("device"),
        "bucket": pc.subtract(ingest, _pmod(ingest, DEFAULT_BUCKET_MS)),
        "offset": pc.subtract(ingest, sampled.column("sent_time")),
    })
    grouped = pa.TableGroupBy(rows, ["stream", "device", "bucket"], use_threads=False).aggregate([("offset", "min")])
    return list(zip(*(grouped.column(c).to_pylist() for c in ("stream", "device", "bucket", "offset_min")), strict=True))


def corrected(records: pa.Table, corrections: Mapping[tuple[str, str], int]) -> pa.Table:
    """`DeviceClocks.apply` on the driver: a row of a (stream, device) with a correction gets
    `event_time += correction`; `raw_event_time` keeps the device's stamp, `clock_correction`
    what was added (null without an event time or a correction)."""
    if not corrections:
        return with_clock_columns(records)
    records = records.combine_chunks()
    keys = pc.binary_join_element_wise(records.column("stream"), records.column("device"), " ")
    at = pc.index_in(keys, value_set=pa.array([f"{s} {d}" for s, d in corrections], pa.string()))
    correction = pa.array(list(corrections.values()), pa.int64()).take(at)
    event_time = one_chunk(records.column("event_time"))
    shifted = pc.if_else(pc.and_(correction.is_valid(), event_time.is_valid()), pc.add(event_time, correction),
                         event_time)
    correction = pc.if_else(event_time.is_valid(), correction, pa.nulls(len(correction), pa.int64()))
    at_time = records.schema.get_field_index("event_time")
    return (records.set_column(at_time, records.schema.field(at_time), shifted)
            .append_column("raw_event_time", event_time).append_column("clock_correction", correction))


def _pmod(values: pa.Array | pa.ChunkedArray, divisor: int) -> pa.Array:
    array = one_chunk(values)
    numbers = pc.fill_null(array, 0).to_numpy(zero_copy_only=False)
    return pa.array(np.mod(numbers, divisor), pa.int64(), mask=bools(array.is_null()))


def _true(condition: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A condition as numpy booleans, null as false (Spark's `when` takes a null as not matched)."""
    return bools(pc.fill_null(condition, False))


__all__ = ["clock_samples", "corrected", "dead_reasons", "keyed", "list_get", "per_stream_values", "stream_is",
           "with_clock_columns"]

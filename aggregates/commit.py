"""Driver side of a micro-batch: turn the collected partial rows into one store commit."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from catalog import Catalog
from ingest.events import storable
from ingest.log.records import bools
from store import BatchCommit, DeadLetter, PaneData, PanePartial, ValueStats
from store.event_ids import EventIdCommit
from store.gc_pause import paused_gc
from store.partial_columns import PartialColumns


def rows_to_partials(rows: Iterable[Mapping[str, Any]], catalog: Catalog) -> tuple[list[PanePartial], dict[str, int]]:
    """Map positional slots back to field names; return the partials and the newest event
    time per stream (rows of dead-lettered records are not partials: they are skipped)."""
    partials: list[PanePartial] = []
    max_event: dict[str, int] = {}
    for row in rows:
        stream = catalog.streams.get(row["stream"])
        if stream is None:  # a stream removed from the configuration: its records are skipped
            continue
        if row.get("dead_reason") is not None:
            continue
        values = {}
        for i, name in enumerate(stream.values):
            n = row[f"n_{i}"]
            if n:
                values[name] = ValueStats(n, row[f"sum_{i}"], row[f"min_{i}"], row[f"max_{i}"], _bytes(row[f"kll_{i}"]))
        distincts = {
            name: _bytes(row[f"hll_{j}"])
            for j, name in enumerate(stream.distinct_fields)
            if row[f"hll_{j}"] is not None
        }
        dims = dict(zip(stream.dimensions, row["dims"] or [], strict=False))
        start = row["pane_start"]
        partials.append(
            PanePartial(stream.name, start, start + stream.pane, dims, PaneData(row["count"], values, distincts))
        )
        max_event[stream.name] = max(max_event.get(stream.name, row["max_event_time"]), row["max_event_time"])
    return partials, max_event


def rows_to_dead_letters(rows: Iterable[Mapping[str, Any]], catalog: Catalog) -> list[DeadLetter]:
    """The dead-lettered records of a batch (listed in the per-reason rows), in log order."""
    out = []
    for row in rows:
        stream = catalog.streams.get(row["stream"])
        if stream is None or row.get("dead_reason") is None:
            continue
        for rec in row.get("dead_records") or ():
            rec = rec.asDict() if hasattr(rec, "asDict") else rec
            dims = rec.get("dims")
            out.append(DeadLetter(
                stream=stream.name,
                partition=int(rec["partition"]),
                offset=int(rec["offset"]),
                reason=row["dead_reason"],
                event_time_ms=rec.get("raw_event_time", rec.get("event_time")),
                ingest_time_ms=rec.get("ingest_time"),
                # It may quote what the producer sent (an undeclared field's name): as escapes
                # where that is no text a store can hold, or the batch could never commit.
                error=None if rec.get("error") is None else storable(rec["error"]),
                dims=dict(zip(stream.dimensions, dims, strict=False)) if dims else None,
                # The device clock rule (aggregates/device_clocks.py): event_time_ms is the device's
                # own stamp, and this what was added to it before the rules judged it.
                clock_correction_ms=rec.get("clock_correction"),
            ))
    out.sort(key=lambda d: (d.stream, d.partition, d.offset))
    return out


def partition_max_events(rows: Iterable[Mapping[str, Any]], catalog: Catalog,
                         streams: Iterable[str]) -> dict[str, dict[int, int]]:
    """Per stream (every one of `streams`, so each gets per-partition watermarks even when the
    batch merged nothing of it) and partition: the newest event time merged in this batch."""
    out: dict[str, dict[int, int]] = {s: {} for s in streams if s in catalog.streams}
    for row in rows:
        if row["stream"] not in catalog.streams or row.get("dead_reason") is not None:
            continue
        newest = out.setdefault(row["stream"], {})
        for partition, t in enumerate(row.get("partition_max_event_time") or ()):
            if t is not None:
                newest[partition] = max(newest.get(partition, t), t)
    return out


def build_commit(pipeline: str, batch_id: int, rows: Iterable[Mapping[str, Any]] | pa.Table, catalog: Catalog,
                 end_offsets: Mapping[str, Mapping[int, int]], *, batch_now_ms: int | None = None,
                 log_end_offsets: Mapping[str, Mapping[int, int]] | None = None,
                 event_ids: EventIdCommit | None = None) -> BatchCommit:
    """The store commit of a batch; `log_end_offsets` are the log's end offsets as seen now,
    which tell the store which partitions still have unread records (store/watermarks.py).
    `event_ids`: the batch's duplicates were taken out before `rows` were aggregated
    (aggregates/duplicates.py); they count as read. `rows`: the partial aggregates' rows as dicts,
    or their Arrow table."""
    # The cycle collector off meanwhile (store/gc_pause.py, which the pipeline already holds for
    # the whole batch): a backfill's batch builds ~3 objects per group for hundreds of thousands of
    # groups (no cycles among them), and the collector ran again and again over everything alive:
    # 18.6 s instead of 5.8 s for 290 000 partials (load 12).
    with paused_gc():
        return _build_commit(pipeline, batch_id, rows, catalog, end_offsets, batch_now_ms=batch_now_ms,
                             log_end_offsets=log_end_offsets, event_ids=event_ids)


def _build_commit(pipeline: str, batch_id: int, rows, catalog: Catalog, end_offsets, *, batch_now_ms,
                  log_end_offsets, event_ids) -> BatchCommit:
    if isinstance(rows, pa.Table):
        # The Arrow partials (aggregates/arrow_partials.py): read column by column; only the
        # (few) per-reason rows of dead records become dicts.
        max_event, columns = table_to_partials(rows, catalog)
        partials = []
        read = defaultdict(int, table_reads(rows, catalog))
        partition_max = table_partition_max_events(rows, catalog, end_offsets)
        rows = rows.filter(pc.is_valid(rows["dead_reason"])).to_pylist()
        dead = rows_to_dead_letters(rows, catalog)
    else:
        rows = list(rows)
        partials, max_event = rows_to_partials(rows, catalog)
        columns = {}
        dead = rows_to_dead_letters(rows, catalog)
        partition_max = partition_max_events(rows, catalog, end_offsets)
        read = None
    # Counts come from the executors' aggregate (count per group), not from list lengths.
    dead_counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    if read is None:
        read = defaultdict(int)
        for row in rows:
            if row["stream"] in catalog.streams:
                read[row["stream"]] += row["count"]
    for row in rows:
        if row["stream"] not in catalog.streams:
            continue
        if row.get("dead_reason") is not None:
            dead_counts[row["stream"]][row["dead_reason"]] += row["count"]
    for stream, n in (event_ids.duplicates if event_ids is not None else {}).items():
        read[stream] += n
    return BatchCommit(
        pipeline=pipeline,
        batch_id=batch_id,
        partials=partials,
        events_read=sum(read.values()),
        max_event_ms=max_event,
        end_offsets=end_offsets,
        partition_max_event_ms=partition_max,
        log_end_offsets=log_end_offsets or {},
        dead_letters=dead,
        read_by_stream=dict(read),
        dead_by_stream={s: dict(r) for s, r in dead_counts.items()},
        batch_now_ms=batch_now_ms,
        event_ids=event_ids,
        partial_columns=columns,
    )


def table_to_partials(table: pa.Table, catalog: Catalog) -> tuple[dict[str, int], dict[str, PartialColumns]]:
    """The partial aggregates' Arrow table as columns: per stream, its good rows' columns made
    Python lists at once (numpy's tolist, no Row, dict, Arrow scalar or PanePartial per group),
    as PartialColumns (store/partial_columns.py: the commit's plan writes new panes and tier
    deltas from them); and the newest event time per stream."""
    max_event: dict[str, int] = {}
    columns: dict[str, PartialColumns] = {}
    good = table.filter(pc.is_null(table["dead_reason"]))
    for stream in catalog.streams.values():
        rows = good.filter(pc.equal(good["stream"], stream.name))
        if not rows.num_rows:
            continue
        # A value's sum/min/max are null only where its n is 0, and then unused: filled, not masked.
        values = [(name, *(_pylist(rows[f"{c}_{i}"]) for c in ("n", "sum", "min", "max", "kll")))
                  for i, name in enumerate(stream.values)]
        distincts = [(name, _pylist(rows[f"hll_{j}"])) for j, name in enumerate(stream.distinct_fields)]
        combo, dims, keys = _combos(_dims(rows["dims"]), stream.dimensions)
        columns[stream.name] = PartialColumns(stream.name, stream.pane, _pylist(rows["pane_start"]),
                                              _pylist(rows["count"]), values, distincts, combo, dims, keys)
        max_event[stream.name] = pc.max(rows["max_event_time"]).as_py()
    return max_event, columns


def _combos(rows: list, dimensions: Sequence[str]) -> tuple[list[int], list[dict], list[str]]:
    """PartialColumns' combo, dims and keys of rows with these dimension values (lists): each
    distinct list made a dict and its dims_key once (not per row)."""
    by_values: dict[tuple, int] = {}
    firsts = []
    for values in rows:
        values = tuple(values)
        if values not in by_values:
            by_values[values] = len(firsts)
            firsts.append(dict(zip(dimensions, values, strict=False)))
    combo, dims, keys = PartialColumns.combos(firsts)  # lists that give one key share a combination
    return [combo[by_values[tuple(values)]] for values in rows], dims, keys


def _pylist(column: pa.ChunkedArray) -> list:
    """A column as a Python list through numpy (much faster than Arrow's to_pylist): numbers with
    nulls filled by 0 (the callers never read those), binaries as bytes or None."""
    column = column.combine_chunks()
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        return column.to_numpy(zero_copy_only=False).tolist()
    if column.null_count:
        column = column.fill_null(0)
    return column.to_numpy(zero_copy_only=False).tolist()


def _dims(column: pa.ChunkedArray) -> list:
    """Each row's dimension values as a list (empty for a null list), through numpy when every row
    has as many (one stream's rows do)."""
    column = column.combine_chunks()
    lengths = pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False)
    if len(lengths) and (lengths == lengths[0]).all() and not column.null_count:
        flat = pc.list_flatten(column).to_numpy(zero_copy_only=False)
        return flat.reshape(len(lengths), int(lengths[0])).tolist()
    return [d or [] for d in column.to_pylist()]


def table_reads(table: pa.Table, catalog: Catalog) -> dict[str, int]:
    """Per stream of `catalog`, the records the batch read (good and dead: the sum of the counts)."""
    if not table.num_rows:
        return {}
    sums = table.group_by("stream").aggregate([("count", "sum")]).to_pydict()
    return {s: n for s, n in zip(sums["stream"], sums["count_sum"]) if s in catalog.streams}


def table_partition_max_events(table: pa.Table, catalog: Catalog,
                               streams: Iterable[str]) -> dict[str, dict[int, int]]:
    """partition_max_events over the partial aggregates' Arrow table (every row's list as wide)."""
    out: dict[str, dict[int, int]] = {s: {} for s in streams if s in catalog.streams}
    good = table.filter(pc.is_null(table["dead_reason"]))
    lists = good["partition_max_event_time"].combine_chunks() if good.num_rows else None
    lengths = pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False) if lists is not None else None
    if lengths is not None and len(lengths) and (lengths != lengths[0]).any():  # not one width: row by row
        for stream, newest in partition_max_events(good.to_pylist(), catalog, out).items():
            out[stream] = newest
        return out
    width = int(lengths[0]) if lengths is not None and len(lengths) else 0
    if not width:
        for stream in set(good["stream"].to_pylist()) & set(catalog.streams):
            out.setdefault(stream, {})
        return out
    flat = pc.list_flatten(lists)
    times = flat.fill_null(np.iinfo(np.int64).min).to_numpy(zero_copy_only=False).reshape(-1, width)
    present = bools(flat.is_valid()).reshape(-1, width)
    streams_of = good["stream"].to_numpy(zero_copy_only=False)
    for stream in catalog.streams:
        mine = streams_of == stream
        if not mine.any():
            continue
        newest = out.setdefault(stream, {})
        best, seen = times[mine].max(axis=0), present[mine].any(axis=0)
        for partition in np.flatnonzero(seen).tolist():
            newest[partition] = int(best[partition])
    return out


def clock_corrected(rows: Iterable[Mapping[str, Any]] | pa.Table) -> int:
    """The records of a batch whose event time a device clock offset shifted."""
    if isinstance(rows, pa.Table):
        return int(pc.sum(rows["clock_corrected"]).as_py() or 0) if rows.num_rows else 0
    return sum(r.get("clock_corrected") or 0 for r in rows)


class UnreadableOffsets(ValueError):
    """A batch's entry in the query's offset log is missing or cannot be read (a crash while it
    was written, a disk that failed): where the batch starts or ends is unknown. Never read as "no
    offsets", which would start the next batch at the log's start and count everything again."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"cannot read the checkpoint's offset log entry {path}: {reason}")
        self.path = path
        self.reason = reason


def checkpointed_end_offsets(checkpoint_dir: str | Path, batch_id: int) -> dict[str, dict[int, int]]:
    """The end offsets Spark logged for a batch before running it (its offset log, format
    'v1' / metadata / one JSON line per source). Raises UnreadableOffsets when the entry is missing
    or unreadable (aggregates/checkpoint_checks.py repairs the last one from the store at start)."""
    path = Path(checkpoint_dir) / "offsets" / str(batch_id)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        offsets = json.loads(lines[2])
        return {stream: {int(p): int(o) for p, o in parts.items()} for stream, parts in offsets.items()}
    except OSError as exc:
        raise UnreadableOffsets(path, exc.strerror or str(exc)) from exc
    except IndexError as exc:
        raise UnreadableOffsets(path, "it has no offsets line (empty or cut short)") from exc
    except (ValueError, TypeError, AttributeError) as exc:  # not JSON, or not {source: {partition: offset}}
        raise UnreadableOffsets(path, f"its offsets are not readable ({exc})") from exc


# Where Spark's Kafka source logs the offsets its query started from, in the query's checkpoint.
KAFKA_SOURCE_START = Path("sources", "0", "0")


def checkpointed_kafka_start(checkpoint_dir: str | Path) -> dict[str, dict[int, int]]:
    """Where Spark's Kafka source started the query, per topic and partition: batch 0's start,
    which the offset log does not hold. The source keeps it in its own log, `sources/0/0`
    (KafkaSourceInitialOffsetWriter: a 0 byte, then 'v1', a newline and the offsets' JSON), resolved
    (earliest or latest as the broker answered when the query first started). Empty when unreadable."""
    path = Path(checkpoint_dir) / KAFKA_SOURCE_START
    try:
        version, _, body = path.read_bytes().lstrip(b"\x00").decode("utf-8").partition("\n")
        if version.strip() != "v1":
            return {}
        offsets = json.loads(body)
        return {topic: {int(p): int(o) for p, o in parts.items()} for topic, parts in offsets.items()}
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return {}


def _bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)

"""Driver side of a micro-batch: turn the collected partial rows into one store commit."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from catalog import Catalog
from store import BatchCommit, DeadLetter, PaneData, PanePartial, ValueStats
from store.event_ids import EventIdCommit


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
                error=rec.get("error"),
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


def build_commit(pipeline: str, batch_id: int, rows: Iterable[Mapping[str, Any]], catalog: Catalog,
                 end_offsets: Mapping[str, Mapping[int, int]], *, batch_now_ms: int | None = None,
                 log_end_offsets: Mapping[str, Mapping[int, int]] | None = None,
                 event_ids: EventIdCommit | None = None) -> BatchCommit:
    """The store commit of a batch; `log_end_offsets` are the log's end offsets as seen now,
    which tell the store which partitions still have unread records (store/watermarks.py).
    `event_ids`: the batch's duplicates were taken out before `rows` were aggregated
    (aggregates/duplicates.py); they count as read."""
    rows = list(rows)
    partials, max_event = rows_to_partials(rows, catalog)
    dead = rows_to_dead_letters(rows, catalog)
    # Counts come from the executors' aggregate (count per group), not from list lengths.
    read: dict[str, int] = defaultdict(int)
    dead_counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row in rows:
        if row["stream"] not in catalog.streams:
            continue
        read[row["stream"]] += row["count"]
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
        partition_max_event_ms=partition_max_events(rows, catalog, end_offsets),
        log_end_offsets=log_end_offsets or {},
        dead_letters=dead,
        read_by_stream=dict(read),
        dead_by_stream={s: dict(r) for s, r in dead_counts.items()},
        batch_now_ms=batch_now_ms,
        event_ids=event_ids,
    )


def checkpointed_end_offsets(checkpoint_dir: str | Path, batch_id: int) -> dict[str, dict[int, int]]:
    """The end offsets Spark logged for a batch before running it (its offset log, format
    'v1' / metadata / one JSON line per source). Empty when unreadable."""
    path = Path(checkpoint_dir) / "offsets" / str(batch_id)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        offsets = json.loads(lines[2])
    except (OSError, IndexError, ValueError):
        return {}
    return {stream: {int(p): int(o) for p, o in parts.items()} for stream, parts in offsets.items()}


def _bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)

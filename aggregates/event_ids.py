"""Which events of a batch are duplicates: the rule of a stream's `event_id_field`. Pure: the
batch's records, the ids the store remembers and the windows are passed in.

An event id is counted once per `dedup_window` of ingest time: a copy whose ingest time is
within the window of the copy counted before (in the store, or earlier in the batch) is a
duplicate and dropped; a copy after the window is counted again and starts a new window.
Ingest time, not event time: a producer's retry carries the event time of the first send, which
may be hours old (a device that was offline), while its ingest time says how long after the
first copy it came; and the pipeline's catch-up, replay or lagging partitions do not change a
record's ingest time (store/event_ids.py prunes by what was read, not by the clock).

Within a batch, copies are taken in (ingest time, partition, offset) order, so a replayed
batch makes the same choice. Most batches have no duplicate at all: the ids seen once in the
batch and not in the store are counted with vectorised work only; the few others go through
the rule one by one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

# The columns of the records find_duplicates judges.
COLUMNS = ("stream", "partition", "offset", "ingest_time", "event_id")


@dataclass(frozen=True)
class Dedup:
    dropped: list[tuple[str, int, int]] = field(default_factory=list)  # (stream, partition, offset)
    counted: list[tuple[str, str, int]] = field(default_factory=list)  # (stream, event id, ingest ms)
    duplicates: dict[str, int] = field(default_factory=dict)  # per stream: copies dropped
    read_ingest_ms: dict[str, dict[int, int]] = field(default_factory=dict)  # per stream, partition: newest


def is_duplicate(ingest_ms: int, counted_ms: int | None, window_ms: int) -> bool:
    """A copy is a duplicate when the copy counted before is within the window of it (either
    side: ingest times from several API replicas or Kafka producers are not strictly ordered)."""
    return counted_ms is not None and abs(ingest_ms - counted_ms) <= window_ms


def find_duplicates(records: pa.Table, stored: Mapping[str, Mapping[str, int]],
                    window_ms: Mapping[str, int]) -> Dedup:
    """Judge every record (COLUMNS; ids not null) of the streams in `window_ms` against the ids
    the store remembers (`stored`: per stream, id -> ingest ms of the copy counted)."""
    out = Dedup()
    if records.num_rows == 0:
        return out
    for stream, window in window_ms.items():
        rows = records.filter(pc.equal(records["stream"], stream))
        if rows.num_rows == 0:
            continue
        newest = rows.group_by("partition").aggregate([("ingest_time", "max")])
        out.read_ingest_ms[stream] = dict(zip(newest["partition"].to_pylist(), newest["ingest_time_max"].to_pylist(),
                                              strict=True))
        known = stored.get(stream, {})
        ids = rows["event_id"]
        counts = rows.group_by("event_id").aggregate([("event_id", "count")])
        repeated = counts.filter(pc.greater(counts["event_id_count"], 1))["event_id"]
        contested = pc.is_in(ids, value_set=repeated)
        if known:
            contested = pc.or_(contested, pc.is_in(ids, value_set=pa.array(list(known), pa.string())))
        clean = rows.filter(pc.invert(contested))
        out.counted.extend(zip([stream] * clean.num_rows, clean["event_id"].to_pylist(),
                               clean["ingest_time"].to_pylist(), strict=True))
        rest = rows.filter(contested).sort_by([("event_id", "ascending"), ("ingest_time", "ascending"),
                                               ("partition", "ascending"), ("offset", "ascending")])
        last: dict[str, int] = {}
        dropped = 0
        for p, o, t, event_id in zip(*(rest[c].to_pylist() for c in ("partition", "offset", "ingest_time", "event_id")),
                                     strict=True):
            before = last.get(event_id, known.get(event_id))
            if is_duplicate(t, before, window):
                out.dropped.append((stream, p, o))
                dropped += 1
            else:
                last[event_id] = t if before is None else max(before, t)
                out.counted.append((stream, event_id, last[event_id]))
        if dropped:
            out.duplicates[stream] = dropped
    return out


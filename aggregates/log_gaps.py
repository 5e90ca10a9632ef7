"""Records a batch's offset range held that it never read: on the embedded log, those its
retention dropped (by age or size, `log_retention*`) before the pipeline got to them.

An event stream's offsets on the embedded log have no holes, so a batch that read fewer records
than its range spans lost the difference to retention. The pipeline says so, as Spark's Kafka
source warns of records a topic's retention deleted (failOnDataLoss off). A table's log is
compacted (docs/tables.md): holes are its nature, and it is not counted. On Kafka, offsets also
number transaction markers, so the spans say nothing there: its readers warn themselves.
Pure: offsets and counts in, counts out."""

from __future__ import annotations

from collections.abc import Mapping

from catalog import Catalog


def unread_by_stream(start: Mapping[str, Mapping[int, int]], end: Mapping[str, Mapping[int, int]],
                     read_by_stream: Mapping[str, int], catalog: Catalog) -> dict[str, int]:
    """{stream: records of [start, end) not read}, for the event streams that lost some. A
    partition with no start (new in this batch) makes its stream's span unknown: not counted."""
    out: dict[str, int] = {}
    for stream, parts in end.items():
        definition = catalog.streams.get(stream)
        if definition is None or definition.kind == "table":
            continue
        began = start.get(stream, {})
        if any(p not in began for p in parts):
            continue
        span = sum(max(0, hi - began[p]) for p, hi in parts.items())
        missing = span - read_by_stream.get(stream, 0)
        if missing > 0:
            out[stream] = missing
    return out

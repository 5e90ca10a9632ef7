"""The Kafka source's conversion of records into source rows alone (`RecordConverter.convert`), no
Spark, no broker: thread CPU time, which the other processes of a shared machine disturb far less
than a pipeline run's wall time.

    python -m bench.kafka_convert [--events 100000] [--batch 10000] [--repeats 3] [--per-record]
    python -m bench.kafka_convert --shapes [--events 100000]

N demo events (as bench.throughput makes them) become Kafka records as `KafkaEventLog` writes them
(one JSON event a value, the key field as the key, round-robin partitions as a stand-in), in
batches of `--batch` records of one topic-partition each, as Spark's Kafka source hands them to
mapInArrow (one task per topic-partition, spark.sql.execution.arrow.maxRecordsPerBatch = 10 000).
`--per-record` times the per-record validation every record took before issue 28 (where the
converter has that switch). `--shapes` times both paths, alternated, on http_requests records of
a few shapes: all valid, one bad record in 10 000, 1 000 or 100, and valid events with RFC 3339
times (which the columnar path leaves to the validator). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import inspect
import json
import time

import pyarrow as pa

from catalog import load_catalog
from demo import DemoTraffic
from ingest.events import EventValidator
from ingest.kafka_source import RECORD_SCHEMA, RecordConverter
from ingest.log.kafka import topic_name
from ingest.log.records import event_to_json
from sketchboard.settings import DEFAULT_STREAMS

PREFIX = "sketchboard."
INGEST_MS = 1_795_000_000_000


def demo_records(catalog, events: int, batch: int) -> list[pa.RecordBatch]:
    traffic = DemoTraffic(catalog, seed=7)
    rows: dict[tuple[str, int], list[dict]] = {}
    done = 0
    while done < events:
        for name, raws in traffic.generate(min(50_000, events - done)).items():
            stream = catalog.streams[name]
            validator = EventValidator(stream)
            for i, raw in enumerate(raws):
                event = validator.validate(raw)
                part = rows.setdefault((topic_name(PREFIX, name), i % stream.partitions), [])
                part.append({"topic": topic_name(PREFIX, name), "partition": i % stream.partitions,
                             "offset": len(part), "ingest_time": INGEST_MS + done + i,
                             "value": event_to_json(stream, event),
                             "key": None if event.key is None else event.key.encode()})
            done += len(raws)
    return [pa.RecordBatch.from_pylist(part[i:i + batch], schema=RECORD_SCHEMA)
            for part in rows.values() for i in range(0, len(part), batch)]


def shaped_records(events: int, batch: int, bad_every: int | None = None,
                   rfc3339: bool = False) -> list[pa.RecordBatch]:
    rows = []
    for i in range(events):
        event = {"time": "2026-11-18T10:00:00Z" if rfc3339 else INGEST_MS + i, "user_id": f"u{i % 97}",
                 "endpoint": "/api/cart", "method": "GET", "status": "200", "region": "eu", "latency_ms": i / 7,
                 "response_bytes": i}
        if bad_every and i % bad_every == 7:
            event["latency_ms"] = "12"
        rows.append({"topic": topic_name(PREFIX, "http_requests"), "partition": 0, "offset": i,
                     "ingest_time": INGEST_MS, "value": json.dumps(event).encode(), "key": None})
    return [pa.RecordBatch.from_pylist(rows[i:i + batch], schema=RECORD_SCHEMA) for i in range(0, events, batch)]


def shapes(catalog, events: int, batch: int, repeats: int) -> None:
    for label, options in [("all valid", {}), ("1 bad in 10 000", {"bad_every": 10_000}),
                           ("1 bad in 1 000", {"bad_every": 1_000}), ("1 bad in 100", {"bad_every": 100}),
                           ("RFC 3339 times", {"rfc3339": True})]:
        batches = shaped_records(events, batch, **options)
        best: dict[bool, float] = {}
        for columnar in (False, True) * repeats:
            converter = RecordConverter(catalog, PREFIX, columnar=columnar)  # fresh: no memory of earlier runs
            list(converter.convert(batches[0][:100]))  # the validators built, outside the timing
            started = time.thread_time()
            for b in batches:
                list(converter.convert(b))
            best[columnar] = min(best.get(columnar, float("inf")), (time.thread_time() - started) / events * 1e6)
        print(f"  {label}: per-record {best[False]:.1f}, columnar {best[True]:.1f} us a record (best of {repeats})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--per-record", action="store_true", help="every record through the per-record validator")
    parser.add_argument("--shapes", action="store_true", help="both paths on http_requests records of a few shapes")
    parser.add_argument("--streams", default=str(DEFAULT_STREAMS))
    args = parser.parse_args(argv)
    catalog = load_catalog(args.streams)
    if args.shapes:
        shapes(catalog, args.events, args.batch, args.repeats)
        return 0
    batches = demo_records(catalog, args.events, args.batch)
    records = sum(b.num_rows for b in batches)
    options = {"columnar": False} if args.per_record else {}
    if options and "columnar" not in inspect.signature(RecordConverter).parameters:
        options = {}  # a checkout from before the columnar path: every record is per-record anyway
    converter = RecordConverter(catalog, PREFIX, **options)
    print(f"{records:,} records in {len(batches)} batches; {'per-record' if args.per_record else 'default'} path")
    for _ in range(args.repeats):
        started, cpu = time.perf_counter(), time.thread_time()
        rows = sum(out.num_rows for b in batches for out in converter.convert(b))
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - started
        assert rows == records, (rows, records)
        print(f"  convert: {cpu:.2f} s thread CPU ({records / cpu:,.0f} records/s), {wall:.2f} s wall")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark: what the enrichment step (aggregates/enrichment.py) costs per batch, side by side in
one Spark session and on one log: the demo config's pipeline with the versions rebuilt from the
store every batch (`rebuilt`, the old path), with them kept across batches (`kept`), and without
`enrich` at all (`none`, the floor).

    python -m bench.enrichment [--users 49500] [--small-batches 5] [--small-events 300]
                               [--large-events 1000000] [--variants rebuilt,kept,none]

1. A fresh embedded log gets the demo's users table (DemoTraffic's initial rows: 49 500 keys),
   and every variant's pipeline loads it (its own store and checkpoint; not timed).
2. Small batches, like the demo's: `--small-events` demo requests' worth of events and a few plan
   changes appended, then each variant drains them (one batch each, the variants' order
   alternating from batch to batch). Repeated `--small-batches` times.
3. One large batch: `--large-events` requests' worth appended, then each variant drains it in one
   batch.
Per batch and variant it prints the whole batch's time and the enrichment step's, split into its
parts (Enrichment.timings: the table changes collected, the versions read, the lookup frame made,
the lookup run with the misses counted), and at the end the median per phase. Printed, never
asserted; `uptime` is printed with them (the figures swing with the machine's load).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from catalog import Catalog, load_catalog
from demo import DemoTraffic
from ingest.events import EventValidator
from ingest.log import SqliteEventLog
from ingest.tables import TableRowValidator
from sketchboard.settings import DEFAULT_STREAMS
from store import SqlitePaneStore

VARIANTS = ("rebuilt", "kept", "none")


def without_enrich(catalog: Catalog) -> Catalog:
    return catalog.model_copy(update={"streams": {n: s.model_copy(update={"enrich": ()})
                                                  for n, s in catalog.streams.items()}})


class Appender:
    """Demo events and the users table's rows into one embedded log, validated as the API does."""

    def __init__(self, log: SqliteEventLog, catalog: Catalog, now_ms: int):
        self.log, self.catalog = log, catalog
        self.now_ms = now_ms
        self.traffic = DemoTraffic(catalog, seed=7, clock=lambda: self.now_ms / 1000)
        self.validators = {n: EventValidator(s) for n, s in catalog.streams.items() if s.kind != "table"}

    def tables(self) -> int:
        rows = self.traffic.table_changes()
        for name, found in rows.items():
            table = self.catalog.streams[name]
            validator = TableRowValidator(table)
            self.log.append(table, [validator.validate(r, self.now_ms) for r in found], self.now_ms)
        return sum(len(r) for r in rows.values())

    def events(self, requests: int, chunk: int = 50_000) -> int:
        done = 0
        while done < requests:
            n = min(chunk, requests - done)
            for name, raws in self.traffic.generate(n).items():
                self.log.append(self.catalog.streams[name], [self.validators[name].validate(r) for r in raws],
                                self.now_ms)
                done += len(raws) if name == "http_requests" else 0
        return sum(o.end for name in self.catalog.streams for o in self.log.offsets(name).values())


class Variant:
    def __init__(self, name: str, spark, catalog: Catalog, root: Path, log_path: Path, batch_records: int):
        from aggregates.enrichment import Enrichment
        from aggregates.pipeline import Pipeline, PipelineConfig

        self.name = name
        self.store = SqlitePaneStore(root / f"{name}.db")
        config = PipelineConfig(f"bench-{name}", log_path, root / f"{name}-checkpoints",
                                max_records_per_batch=batch_records)
        self.pipeline = Pipeline(spark, without_enrich(catalog) if name == "none" else catalog, self.store, config)
        if name == "rebuilt":
            self.pipeline.enrichment = Enrichment(spark, catalog, self.store, keep_versions=False)
        self.rows: list[dict] = []

    def drain(self, label: str) -> dict:
        """Drain what the log holds (one batch); its time and the enrichment step's parts."""
        enrichment = self.pipeline.enrichment
        before = self.store.progress(self.pipeline.config.name).events_read
        started = time.perf_counter()
        for attempt in range(3):  # a loaded machine: "Python worker failed to connect back" fails a query
            try:
                self.pipeline.run_until_drained()
                break
            except Exception as error:  # noqa: BLE001 - the query's failure, whatever its type
                if attempt == 2:
                    raise
                print(f"  [{self.name}] query failed, run again from its checkpoint: {str(error)[:160]}", flush=True)
        row = {"phase": label, "events": self.store.progress(self.pipeline.config.name).events_read - before,
               "query_s": time.perf_counter() - started, **getattr(enrichment, "timings", {})}
        self.rows.append(row)
        return row


def fmt(row: dict) -> str:
    parts = " ".join(f"{k} {row[k] * 1000:,.0f} ms" for k in ("changes", "versions", "frame", "lookup", "step")
                     if k in row)
    return f"{row['events']:>9,} events, query {row['query_s']:6.1f} s | enrichment: {parts or '-'}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=Path, default=DEFAULT_STREAMS)
    parser.add_argument("--small-batches", type=int, default=5)
    parser.add_argument("--small-events", type=int, default=300, help="demo requests per small batch")
    parser.add_argument("--large-events", type=int, default=1_000_000, help="demo requests in the large batch (0: none)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    catalog = load_catalog(args.streams)

    from aggregates.spark import build_spark

    spark = build_spark("local[2]")
    with tempfile.TemporaryDirectory(prefix="bench-enrich-") as tmp:
        root = Path(tmp)
        log = SqliteEventLog(root / "log.db")
        for stream in catalog.streams.values():
            log.ensure_topic(stream)
        appender = Appender(log, catalog, int(time.time() * 1000))
        users = appender.tables()
        print(f"users table: {users:,} rows appended", flush=True)
        runs = [Variant(v, spark, catalog, root, root / "log.db", 10 * max(args.large_events, 100_000))
                for v in variants]
        for v in runs:
            v.drain("load")
            print(f"  [{v.name}] table loaded: {fmt(v.rows[-1])}", flush=True)
        for i in range(args.small_batches):
            appender.now_ms += 5_000  # the demo's tick: a few plan changes are due
            changes = appender.tables()
            total = appender.events(args.small_events)
            print(f"small batch {i}: {changes} table changes, log at {total:,} records; {os.getloadavg()[0]:.1f} load",
                  flush=True)
            for v in runs if i % 2 == 0 else runs[::-1]:
                print(f"  [{v.name:7}] {fmt(v.drain('small'))}", flush=True)
        if args.large_events:
            appender.now_ms += 5_000
            changes = appender.tables()
            total = appender.events(args.large_events)
            print(f"large batch: {changes} table changes, log at {total:,} records", flush=True)
            for v in runs:
                print(f"  [{v.name:7}] {fmt(v.drain('large'))}  load {os.getloadavg()[0]:.1f}", flush=True)
        print("\nmedians per phase (seconds):")
        keys = ("query_s", "changes", "versions", "frame", "lookup", "step")
        print("| variant | phase | batches | events/batch | " + " | ".join(keys) + " |")
        print("| --- " * (4 + len(keys)) + "|")
        for v in runs:
            for phase in ("small", "large"):
                rows = [r for r in v.rows if r["phase"] == phase]
                if not rows:
                    continue
                cells = [f"{statistics.median(r[k] for r in rows):.2f}" if k in rows[0] else "-" for k in keys]
                print(f"| {v.name} | {phase} | {len(rows)} | {statistics.median(r['events'] for r in rows):,.0f} | "
                      + " | ".join(cells) + " |")
        for v in runs:
            v.store.close()
        log.close()
    spark.stop()
    print(f"uptime: {os.popen('uptime').read().strip()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

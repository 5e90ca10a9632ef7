"""Small micro-batches (the demo's rate) through the real pipeline: the whole batch's time and Spark
jobs, and each step's, per batch.

    python -m bench.small_batches [--batches 8] [--warmup 2] [--requests 300] [--streams FILE]

A fresh embedded log gets the demo's tables (DemoTraffic's initial rows: 49 500 users, the plans),
which the pipeline loads in a first batch (not reported); then `--batches` times: the demo's tick
(a few plan changes) and `--requests` demo requests' worth of events of every demo stream (~400
events for 300, a demo batch's worth) are appended and the pipeline drains them in one batch
(`Trigger.AvailableNow`). The first `--warmup` batches are not reported (Python workers, JIT).

Inside `process_batch` every step runs in its own Spark job group, so the status tracker counts
each step's jobs; "rest" is what no step wrapper covers (the batch's cache or local copy, the
partial aggregation). Medians per step are printed, with `uptime`. To compare with another
checkout, run the same file with that checkout first on the path, alternating:

    PYTHONPATH=/path/to/other python bench/small_batches.py

Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import aggregates
from bench.enrichment import Appender
from catalog import load_catalog
from ingest.log import SqliteEventLog
from sketchboard.settings import DEFAULT_STREAMS
from store import SqlitePaneStore

# (attribute of the pipeline, method): the steps timed and counted on their own
STEPS = (("duplicates", "process"), ("clocks", "plan"), ("enrichment", "process"), ("patterns", "process"),
         ("joins", "process"), ("sessions", "process"), ("tables", "process"), ("views", "process"),
         ("bloom", "process"), ("committer", "commit"))


class JobGroups:
    """Each step of a batch in its own Spark job group; seconds and job counts per step."""

    def __init__(self, spark):
        self.sc = spark.sparkContext
        self.tracker = self.sc.statusTracker()
        self.batch = 0
        self.current = "rest"
        self.seconds: dict[str, float] = defaultdict(float)
        self.groups: set[str] = set()

    def use(self, label: str) -> None:
        self.current = label
        group = f"batch {self.batch}: {label}"
        self.groups.add(label)
        self.sc.setJobGroup(group, label)

    def jobs(self, label: str) -> int:
        return len(self.tracker.getJobIdsForGroup(f"batch {self.batch}: {label}"))

    def wrap(self, obj, method: str, label: str) -> None:
        original = getattr(obj, method)

        def timed(*args, **kwargs):
            before = self.current
            self.use(label)
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - started
                self.use(before)

        setattr(obj, method, timed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=Path, default=DEFAULT_STREAMS)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--requests", type=int, default=300, help="demo requests' worth of events per batch")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="print the N functions with the most cumulative time in the last batch (cProfile)")
    parser.add_argument("--driver-rows", type=int, default=None,
                        help="PipelineConfig.driver_batch_rows (batches up to this many records are held on the driver)")
    args = parser.parse_args(argv)
    catalog = load_catalog(args.streams)

    from aggregates.pipeline import Pipeline, PipelineConfig
    from aggregates.spark import build_spark

    print(f"code: {Path(aggregates.__file__).parent.parent}", flush=True)
    spark = build_spark("local[2]")
    groups = JobGroups(spark)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-small-") as tmp:
        root = Path(tmp)
        log = SqliteEventLog(root / "log.db")
        for stream in catalog.streams.values():
            log.ensure_topic(stream)
        appender = Appender(log, catalog, int(time.time() * 1000))
        print(f"tables: {appender.tables():,} rows appended", flush=True)
        store = SqlitePaneStore(root / "store.db")
        pipeline = Pipeline(spark, catalog, store, PipelineConfig("small", root / "log.db", root / "checkpoints",
                                                                    **driver_rows(args.driver_rows)))
        for attr, method in STEPS:
            if getattr(getattr(pipeline, attr), "enabled", True):
                groups.wrap(getattr(pipeline, attr), method, attr)
        process = pipeline.process_batch

        def measured(batch, batch_id):
            groups.batch, groups.seconds = batch_id, defaultdict(float)
            groups.groups = set()
            groups.use("rest")
            profiler = cProfile.Profile() if args.profile and len(rows) == args.batches else None
            started = time.perf_counter()
            try:
                if profiler is not None:
                    profiler.enable()
                return process(batch, batch_id)
            finally:
                if profiler is not None:
                    profiler.disable()
                    pstats.Stats(profiler).sort_stats("cumulative").print_stats(args.profile)
                whole = time.perf_counter() - started
                spark.sparkContext.setJobGroup("", "")
                row = {"batch": batch_id, "events": pipeline.last_result and store.progress("small").events_read,
                       "whole": (whole, sum(groups.jobs(g) for g in groups.groups))}
                for label in groups.groups:
                    spent = groups.seconds.get(label, 0.0)
                    row[label] = (spent if label != "rest" else whole - sum(groups.seconds.values()),
                                  groups.jobs(label))
                rows.append(row)

        pipeline.process_batch = measured
        pipeline.run_until_drained()  # the tables' load
        read = store.progress("small").events_read
        for i in range(args.batches):
            appender.now_ms += 5_000
            appender.tables()
            appender.events(args.requests)
            pipeline.run_until_drained()
            now = store.progress("small").events_read
            r = rows[-1]
            print(f"batch {r['batch']}: {now - read} events, {r['whole'][0]:.2f} s, {r['whole'][1]} Spark jobs; "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
            r["events"], read = now - read, now
        store.close()
        log.close()
    spark.stop()
    measured_rows = rows[1 + args.warmup:]
    labels = ["whole"] + [a for a, _ in STEPS] + ["rest"]
    print(f"\nmedians over {len(measured_rows)} batches of ~{statistics.median(r['events'] for r in measured_rows):.0f}"
          " events (seconds, Spark jobs):")
    print("| step | seconds | Spark jobs |")
    print("| --- | --- | --- |")
    for label in labels:
        values = [r[label] for r in measured_rows if label in r]
        if values:
            print(f"| {label} | {statistics.median(v[0] for v in values):.2f} | "
                  f"{statistics.median(v[1] for v in values):g} |")
    print(f"uptime: {os.popen('uptime').read().strip()}")
    return 0


def driver_rows(rows: int | None) -> dict:
    return {} if rows is None else {"driver_batch_rows": rows}


if __name__ == "__main__":
    raise SystemExit(main())

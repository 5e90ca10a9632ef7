"""Where one micro-batch's time goes: each step of the pipeline timed on the same cached batch.

    python -m bench.batch_steps [--events 1000000] [--repeats 3] [--streams FILE]
                                [--bloom-before PATH/aggregates/firstseen.py]
                                [--sessions-before PATH/aggregates/session_batch.py] [--conf KEY=VALUE ...]

Fills a fresh embedded log with N demo events, starts the pipeline's query with one batch of all
of them, and inside that batch (after one real warm-up pass over the batch, so the JIT and the
Python workers are warm) times every step the pipeline runs, `--repeats` times in turn, on the
same data: the source read alone (into Spark's `noop` sink) and into the batch cache the later
steps read, the device clock step, enrichment, the partial aggregation (Spark job and collect),
the window joins' records, the tables' newest rows and the Bloom features (first-seen and
membership), the sessions' runs, and both of these in the one job the pipeline runs for them
(aggregates/key_rows.py; its results checked against the two alone). The store commit is timed once, with the real batch.
`--bloom-before FILE` also times another checkout's aggregates/firstseen.py on the same batch,
alternating with this one, and checks both give the same BloomCommit; `--sessions-before FILE`
does the same for another checkout's aggregates/session_batch.py (its runs). Spark jobs per step come
from the status tracker (each step runs in its own job group). The path of a batch of at most
`driver_batch_rows` records (an Arrow table on the driver, no Spark job) is bench.small_batches'.
`--conf` passes Spark settings to
try (e.g. spark.sql.inMemoryColumnarStorage.compressed=false). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import tempfile
from dataclasses import replace
import time
from collections import defaultdict
from pathlib import Path

from bench.throughput import fill_log
from catalog import load_catalog
from ingest.log import SqliteEventLog
from sketchboard.settings import DEFAULT_STREAMS
from store import SqlitePaneStore


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def same_bloom(a, b) -> bool:
    def norm(c):
        return ([(u.stream, u.kind, u.bucket_ms, u.m, u.k, u.seed, sorted(u.chunks.items())) for u in c.filters],
                sorted(c.first_seen, key=lambda p: (p.stream, p.start_ms)))
    return norm(a) == norm(b)


def same_runs(a, b) -> bool:
    """Two runs tables with the same rows, in any order."""
    def rows(t):
        return sorted(zip(*(t[c].to_pylist() for c in ("stream", "key", "first_ms", "last_ms", "events")), strict=True))
    return a.num_rows == b.num_rows and rows(a) == rows(b)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batch_steps", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--streams", type=Path, default=DEFAULT_STREAMS)
    parser.add_argument("--bloom-before", type=Path, help="another checkout's aggregates/firstseen.py to time beside")
    parser.add_argument("--sessions-before", type=Path,
                        help="another checkout's aggregates/session_batch.py: its runs() timed beside, results compared")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting to try")
    parser.add_argument("--hours", type=float,
                        help="issue 27's backfill: http_requests events only, their times spread over the last HOURS")
    args = parser.parse_args(argv)

    from aggregates.commit import build_commit
    from aggregates.partials import dead_letter_reason_column, partial_aggregates
    from aggregates.pipeline import Pipeline, PipelineConfig
    from aggregates.session_batch import bloom_and_runs
    from aggregates.spark import build_spark
    from store.gc_pause import paused_gc

    catalog = load_catalog(args.streams)
    root = Path(tempfile.mkdtemp(prefix="sketchboard-steps-"))
    log = SqliteEventLog(root / "log.db")
    for stream in catalog.streams.values():
        log.ensure_topic(stream)
    fill_log(log, catalog, args.events, spread_hours=args.hours)
    log.close()
    spark = build_spark("local[2]", extra_conf=dict(c.split("=", 1) for c in args.conf))
    tracker = spark.sparkContext.statusTracker()  # Spark jobs per step, by job group
    store = SqlitePaneStore(root / "store.db")
    pipeline = Pipeline(spark, catalog, store, PipelineConfig("steps", root / "log.db", root / "checkpoints",
                                                              max_records_per_batch=args.events + 100_000))
    before = None
    if args.bloom_before:
        before = load_module(args.bloom_before, "firstseen_before").BloomFeatures(spark, catalog, store.bloom_reader())
    sessions_before = None
    if args.sessions_before:
        sessions_before = load_module(args.sessions_before, "session_batch_before").SessionWindows(catalog, store)
    times: dict[str, list[float]] = defaultdict(list)
    jobs: dict[str, int] = {}

    def timed_one(label: str, fn):
        group = f"{label} {len(times[label])}"
        spark.sparkContext.setJobGroup(group, label)
        started = time.perf_counter()
        out = fn()
        times[label].append(time.perf_counter() - started)
        jobs[label] = len(tracker.getJobIdsForGroup(group))
        spark.sparkContext.setJobGroup("", "")
        return out

    def steps(batch, batch_now_ms: int) -> None:
        p = pipeline
        timed = timed_one
        timed("source read alone (no cache, noop sink)", lambda: batch.write.format("noop").mode("overwrite").save())
        kept = batch.persist()
        timed("source read into the batch cache", kept.count)
        b = kept
        if p.clocks.enabled:
            b = timed("device clocks", lambda: p.clocks.apply(kept, p.clocks.plan(kept, batch_now_ms=batch_now_ms)))
        enriched = None
        if p.enrichment.enabled:
            enriched = timed("enrichment (its cache built)", lambda: p.enrichment.process(b, batch_now_ms))
            b = enriched.batch
        # Both partials paths (PipelineConfig.partials), alternated: the executors' part (Spark job and
        # collect, or mapInArrow and toArrow),
        # then the driver's (the rows or the Arrow table made the store commit's partials).
        modes = ("spark", "arrow") if len(times["partials order"]) % 2 == 0 else ("arrow", "spark")
        times["partials order"].append(0.0)
        for mode in modes:
            rows = timed(f"partial aggregates, {mode} (job + collect)", lambda: partial_rows(b, batch_now_ms, mode))
            timed(f"partials -> commit ({mode}, driver)", lambda: build_commit("steps", 0, rows, catalog, {},
                                                                                batch_now_ms=batch_now_ms))
        if p.joins.enabled:
            timed("window joins' records", lambda: p.joins.records(b, batch_now_ms))
        if p.tables.enabled:
            timed("tables' newest rows", lambda: p.tables.process(b))
        merged = b.where(dead_letter_reason_column(catalog, batch_now_ms).isNull())
        if p.bloom.enabled:
            got = timed("Bloom features", lambda: p.bloom.process(merged))
            if before is not None:
                old = timed("Bloom features (--bloom-before)", lambda: before.process(merged))
                times["Bloom results identical"].append(float(same_bloom(got, old)))
        if p.sessions.enabled:
            got = timed("sessions' runs alone (Spark job + toArrow + numpy)", lambda: p.sessions.runs(b, batch_now_ms))
            if sessions_before is not None:
                old = timed("sessions' runs (--sessions-before)", lambda: sessions_before.runs(b, batch_now_ms))
                times["sessions' runs identical"].append(float(same_runs(got, old)))
        if p.bloom.enabled and p.sessions.enabled:  # what the pipeline runs: one job for both
            bloom, runs = timed("Bloom features and sessions' runs in one job", lambda: bloom_and_runs(
                merged, p.bloom, p.sessions))
            times["one job's results identical"].append(float(same_bloom(bloom, p.bloom.process(merged))
                                                              and same_runs(runs, p.sessions.runs(b, batch_now_ms))))
        if enriched is not None:
            enriched.cached.unpersist()
        kept.unpersist()

    def partial_rows(batch, batch_now_ms: int, mode: str):
        if mode == "spark":  # Spark's groupBy
            with paused_gc():
                return [r.asDict() for r in partial_aggregates(batch, catalog, batch_now_ms=batch_now_ms,
                                                               lg_k=pipeline.config.lg_k,
                                                               kll_k=pipeline.config.kll_k).collect()]
        saved = pipeline.config
        pipeline.config = replace(saved, partials=mode)
        try:
            return pipeline.partial_rows(batch, batch_now_ms, on_driver=False)
        finally:
            pipeline.config = saved

    process = pipeline.process_batch

    def measured(batch, batch_id):
        now = int(time.time() * 1000)
        steps(batch, now)  # warm-up pass, not reported
        times.clear()
        jobs.clear()
        for _ in range(args.repeats):
            steps(batch, now)
        started = time.perf_counter()
        result = process(batch, batch_id)
        times["whole batch, store commit included (once)"].append(time.perf_counter() - started)
        return result

    pipeline.process_batch = measured
    try:
        pipeline.run_until_drained()
    finally:
        spark.stop()
        store.close()
        shutil.rmtree(root, ignore_errors=True)
    print(f"\none batch of {args.events:,} demo events ({args.streams.name}), {args.repeats} passes; seconds per pass:")
    print("| step | Spark jobs | min | median | max |")
    print("| --- | --- | --- | --- | --- |")
    for label, values in times.items():
        if label == "partials order":
            continue
        if label in ("Bloom results identical", "sessions' runs identical", "one job's results identical"):
            print(f"| {label} | | {'yes' if all(values) else 'NO'} | | |")
            continue
        s = sorted(values)
        print(f"| {label} | {jobs.get(label, '')} | {s[0]:.2f} | {s[len(s) // 2]:.2f} | {s[-1]:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

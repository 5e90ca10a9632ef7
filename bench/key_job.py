"""Benchmark: the batch's per-key Spark job (aggregates/key_rows.py: Bloom features and sessions'
runs from one row per event and key slot) beside another checkout's per-key job (one row per
feature, the sessions' event times collected), on one cached batch, alternated, with the CPU
seconds of this process and its JVM per step.

    python -m bench.key_job --before /work/main [--events 1000000] [--repeats 3]

Fills a fresh embedded log with N demo events, takes them as one batch of the pipeline's query,
applies the device clock step (sessions and Bloom keys are in corrected time) and then, per repeat:
the other checkout's job (its aggregates/key_rows.py: `key_rows` + `runs_from_times` + the Bloom
commit) with and without the sessions' rows, this checkout's `bloom_and_runs` with and without them,
and this checkout's parts (the Spark job, the runs and the Bloom commit on the driver). The first
pass is a warm-up that also checks both give the same Bloom commit and runs. Figures are printed,
never asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from bench.batch_steps import load_module, same_bloom, same_runs
from bench.cpu import tree_cpu_seconds
from bench.throughput import fill_log
from catalog import load_catalog
from ingest.log import SqliteEventLog
from sketchboard.settings import DEFAULT_STREAMS
from store import SqlitePaneStore


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.key_job", description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True,
                        help="another checkout whose aggregates/key_rows.py has key_rows() returning the rows per"
                             " feature with the sessions' times, and runs_from_times()")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    from aggregates.key_rows import key_rows
    from aggregates.partials import dead_letter_reason_column
    from aggregates.pipeline import Pipeline, PipelineConfig
    from aggregates.session_batch import bloom_and_runs
    from aggregates.spark import build_spark

    catalog = load_catalog(DEFAULT_STREAMS)
    root = Path(tempfile.mkdtemp(prefix="sketchboard-key-job-"))
    log = SqliteEventLog(root / "log.db")
    for stream in catalog.streams.values():
        log.ensure_topic(stream)
    fill_log(log, catalog, args.events)
    log.close()
    spark = build_spark("local[2]")
    store = SqlitePaneStore(root / "store.db")
    p = Pipeline(spark, catalog, store, PipelineConfig("keys", root / "log.db", root / "checkpoints",
                                                       max_records_per_batch=args.events + 100_000))
    before = load_module(args.before / "aggregates" / "key_rows.py", "key_rows_before")
    gaps = {n: catalog.streams[n].sessions.gap for n in p.sessions.streams}
    wall: dict[str, list[float]] = defaultdict(list)
    cpu: dict[str, list[float]] = defaultdict(list)

    def timed(label: str, fn):
        c, started = tree_cpu_seconds(), time.perf_counter()
        out = fn()
        wall[label].append(time.perf_counter() - started)
        cpu[label].append(tree_cpu_seconds() - c)
        return out

    def before_both(merged):
        plan = p.bloom.plan()
        rows = before.key_rows(merged, [*plan.items, *p.sessions.items()])
        return p.bloom.commit_of(rows, plan.shapes, plan.filters), before.runs_from_times(rows, gaps)

    def before_bloom(merged):
        plan = p.bloom.plan()
        return p.bloom.commit_of(before.key_rows(merged, plan.items), plan.shapes, plan.filters)

    def measured(batch, batch_id):
        now = int(time.time() * 1000)
        kept = batch.persist()
        kept.count()
        b = p.clocks.apply(kept, p.clocks.plan(kept, batch_now_ms=now)) if p.clocks.enabled else kept
        merged = b.where(dead_letter_reason_column(catalog, now).isNull()).persist()
        merged.count()
        for i in range(args.repeats + 1):
            old_b, old_r = timed("before: Bloom + runs", lambda: before_both(merged))
            new_b, new_r = timed("now: Bloom + runs", lambda: bloom_and_runs(merged, p.bloom, p.sessions))
            timed("before: Bloom alone (no session rows)", lambda: before_bloom(merged))
            timed("now: Bloom alone (no session rows)", lambda: p.bloom.process(merged))
            plan = p.bloom.plan()
            rows = timed("  now: its Spark job (key_rows)", lambda: key_rows(merged, [*plan.items, *p.sessions.items()]))
            timed("  now: runs on the driver", lambda: p.sessions.runs_of_rows(rows))
            timed("  now: Bloom commit on the driver", lambda: p.bloom.commit(rows, plan))
            if i == 0:  # warm-up pass: checked, not reported
                print(f"same Bloom commit: {same_bloom(old_b, new_b)}, same runs: {same_runs(old_r, new_r)};"
                      f" slot rows {rows.slots.num_rows:,}, runs {new_r.num_rows:,}")
                wall.clear()
                cpu.clear()
        merged.unpersist()
        kept.unpersist()

    p.process_batch = measured
    try:
        p.run_until_drained()
    finally:
        spark.stop()
        store.close()
        shutil.rmtree(root, ignore_errors=True)
    print(f"\none batch of {args.events:,} demo events, {args.repeats} passes alternated; load {os.getloadavg()}")
    print("| step | wall s (median, min-max) | CPU s (median, min-max) |")
    print("| --- | --- | --- |")
    for label in wall:
        w, c = sorted(wall[label]), sorted(cpu[label])
        print(f"| {label} | {w[len(w) // 2]:.2f} ({w[0]:.2f}-{w[-1]:.2f}) | {c[len(c) // 2]:.2f} ({c[0]:.2f}-{c[-1]:.2f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

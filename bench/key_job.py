"""Benchmark: the batch's per-key Spark job (aggregates/key_rows.py: Bloom features and sessions'
runs in one job) beside another checkout's two jobs (its Bloom step and its sessions' runs), on one
cached batch, alternated, with the CPU seconds of this process and its JVM per step.

    python -m bench.key_job --before /work/main [--events 400000] [--repeats 4]

Fills a fresh embedded log with N demo events, takes them as one batch of the pipeline's query,
applies the device clock step (sessions and Bloom keys are in corrected time) and then, per repeat:
the other checkout's Bloom job and runs job, this checkout's one job, its Bloom job alone (the
same job without the sessions' rows: what the sessions add is the difference), and the driver's
parts (the runs cut from the times; the Bloom commit). The first pass is a warm-up that also checks
both give the same Bloom commit and runs. Figures are printed, never asserted.
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
    parser.add_argument("--before", type=Path, required=True, help="another checkout (its aggregates/firstseen.py"
                        " and aggregates/session_batch.py with a runs() job)")
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--repeats", type=int, default=4)
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
    old_bloom = load_module(args.before / "aggregates" / "firstseen.py", "firstseen_before").BloomFeatures(
        spark, catalog, store.bloom_reader())
    old_sessions = load_module(args.before / "aggregates" / "session_batch.py", "session_batch_before").SessionWindows(
        catalog, store)
    wall: dict[str, list[float]] = defaultdict(list)
    cpu: dict[str, list[float]] = defaultdict(list)

    def timed(label: str, fn):
        c, started = tree_cpu_seconds(), time.perf_counter()
        out = fn()
        wall[label].append(time.perf_counter() - started)
        cpu[label].append(tree_cpu_seconds() - c)
        return out

    def measured(batch, batch_id):
        now = int(time.time() * 1000)
        kept = batch.persist()
        kept.count()
        b = p.clocks.apply(kept, p.clocks.plan(kept, batch_now_ms=now)) if p.clocks.enabled else kept
        merged = b.where(dead_letter_reason_column(catalog, now).isNull())
        for i in range(args.repeats + 1):
            old_b = timed("before: Bloom job", lambda: old_bloom.process(merged))
            old_r = timed("before: sessions' runs job", lambda: old_sessions.runs(b, now))
            new_b, new_r = timed("one job (Bloom + runs), in all", lambda: bloom_and_runs(merged, p.bloom, p.sessions))
            timed("  Bloom alone in it (no session rows)", lambda: p.bloom.process(merged))
            plan = p.bloom.plan()
            rows = timed("  its Spark job (key_rows)", lambda: key_rows(merged, [*plan.items, *p.sessions.items()]))
            timed("  runs cut on the driver (numpy)", lambda: p.sessions.runs_of_rows(rows))
            timed("  Bloom commit on the driver", lambda: p.bloom.commit(rows, plan))
            if i == 0:  # warm-up pass: checked, not reported
                print(f"same Bloom commit: {same_bloom(old_b, new_b)}, same runs: {same_runs(old_r, new_r)}")
                wall.clear()
                cpu.clear()
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
    both = [a + b for a, b in zip(wall["before: Bloom job"], wall["before: sessions' runs job"], strict=True)]
    both_cpu = [a + b for a, b in zip(cpu["before: Bloom job"], cpu["before: sessions' runs job"], strict=True)]
    print(f"before, both jobs per pass: wall {[round(x, 2) for x in both]}, CPU {[round(x, 2) for x in both_cpu]}")
    print(f"one job per pass:           wall {[round(x, 2) for x in wall['one job (Bloom + runs), in all']]},"
          f" CPU {[round(x, 2) for x in cpu['one job (Bloom + runs), in all']]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

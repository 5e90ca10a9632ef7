"""Benchmark: session windows inside the pane batch against the session query they replaced,
side by side in one run on the same log.

    python -m bench.sessions [--events 400000] [--batch-records 1000000] [--rounds 1] [--skip-before]

One embedded log is filled with N demo events (config/streams.yaml: http_requests by user_id
and mobile_app by device_id, gap 5m). Then, per round, each on a fresh store and checkpoint:

- `panes only`: the pipeline over the demo streams with `sessions:` taken out (the reference);
- `before`: the same, then what `sketchboard pipeline` ran beside it until now: one streaming
  query per stream declaring sessions, reading the whole log again through the source,
  withWatermark + groupBy(key, session_window) in Spark's state store, the closed sessions
  aggregated into panes (its code is kept below, `session_query`, only to measure against);
- `in batch`: the pipeline with sessions in its own batches (aggregates/session_batch.py).

`--skip-before` leaves the old session queries out. Printed: the wall time of each and the events/s
over the log, the sessions each closed per stream, for the runs with sessions their parts summed
over the batches and the CPU seconds of this process and its JVM (bench/cpu.py: what the others'
load on a shared machine changes least) per run (the per-key Spark job they share with the Bloom
features, also timed in the run without sessions so that its extra time is theirs; the store
lookup, the rule, the closed sessions' partials, the rest of the driver's work, the open sessions'
writes in the commit; `part_timers`), and the load average (the machine is shared: compare within
one run). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.cpu import tree_cpu_seconds
from bench.step_timer import wrap_timed
from bench.drain import drain_timed
from bench.throughput import fill_log
from catalog import Catalog, load_catalog
from ingest.log import SqliteEventLog
from sketchboard.settings import DEFAULT_STREAMS
from store import SqlitePaneStore


def without_sessions(catalog: Catalog) -> Catalog:
    """The catalog with every `sessions:` removed (and the streams and metrics it generated)."""
    from catalog.features import sessions_stream_name

    derived = {sessions_stream_name(n) for n, s in catalog.streams.items() if s.sessions is not None}
    streams = {n: s.model_copy(update={"sessions": None}) for n, s in catalog.streams.items() if n not in derived}
    metrics = {n: m for n, m in catalog.metrics.items() if m.stream not in derived}
    return Catalog(streams=streams, metrics=metrics, joins=catalog.joins, patterns=catalog.patterns,
                   views=catalog.views)


def session_query(spark, catalog: Catalog, stream_name: str, config, checkpoint_dir: Path) -> tuple[float, int]:
    """The session query this project ran before sessions moved into the pane batch (until
    aggregates/sessions.py was removed), drained; its seconds and the sessions it closed. Its
    closed sessions are aggregated into pane partials as it did, not committed (a few rows)."""
    from pyspark.sql import functions as F

    from aggregates.partials import partial_aggregates
    from aggregates.pipeline import drain, read_log, start_query
    from aggregates.batch_gate import BatchGate
    from catalog.features import sessions_stream_name, source_field

    source = catalog.streams[stream_name]
    derived = catalog.streams[sessions_stream_name(stream_name)]
    source_catalog = Catalog(streams={stream_name: source.model_copy(update={"sessions": None, "enrich": ()})})
    derived_catalog = Catalog(streams={derived.name: derived})
    column, index = source_field(source, source.sessions.key)
    closed = [0]

    def process(batch, batch_id):
        rows = batch.select(
            F.lit(derived.name).alias("stream"), F.lit(0).cast("int").alias("partition"),
            F.xxhash64(F.col("key"), F.col("first_ms")).alias("offset"), F.col("first_ms").alias("event_time"),
            F.col("first_ms").alias("ingest_time"), F.array().cast("array<string>").alias("dims"),
            F.array((F.col("last_ms") - F.col("first_ms")).cast("double"), F.col("events").cast("double")).alias("vals"),
            F.array(F.col("key")).alias("ids"), F.lit(None).cast("string").alias("error"),
            F.lit(None).cast("string").alias("error_kind"))
        for row in partial_aggregates(rows, derived_catalog, batch_now_ms=int(time.time() * 1000)).collect():
            closed[0] += row["count"]

    events = read_log(spark, source_catalog, config, checkpoint_dir)
    sessions = (
        events.where(F.col("stream") == stream_name)
        .where(F.col("error").isNull() & F.col("ingest_time").isNotNull()
               & (F.col("event_time") <= F.col("ingest_time") + F.lit(source.max_future_skew)))
        .select(F.get(F.col(column), index).alias("key"), F.timestamp_millis("event_time").alias("ts"), "event_time")
        .where(F.col("key").isNotNull() & (F.col("key") != ""))
        .withWatermark("ts", f"{source.allowed_lateness} milliseconds")
        .groupBy("key", F.session_window("ts", f"{source.sessions.gap} milliseconds").alias("session"))
        .agg(F.min("event_time").alias("first_ms"), F.max("event_time").alias("last_ms"),
             F.count(F.lit(1)).alias("events"))
    )
    started = time.perf_counter()
    query = start_query(sessions.writeStream.outputMode("append"), f"bench-sessions-{stream_name}", checkpoint_dir,
                        process, "1 second", available_now=True, gate=BatchGate())
    drain(query, f"session query {stream_name}")
    return time.perf_counter() - started, closed[0]


PARTS = ("per-key job (Bloom + runs, shared)", "store lookup (session_state)", "rule (session_batch)",
         "partials of closed sessions", "sessions' driver work", "commit: open sessions written",
         "whole batches", "store commits")


@contextmanager
def part_timers(pipeline, store) -> Iterator[dict[str, float]]:
    """Seconds spent per part of the sessions' work over a run, summed over its batches: the per-key
    Spark job the sessions share with the Bloom features (aggregates/key_rows.py; in a run without
    sessions, the Bloom features' alone; an older checkout's own runs() job where it has one), the
    store lookup, the pure rule, the closed sessions' partials, the rest of the driver's work, and
    the open sessions' writes in the commit; with the whole batches and store commits to compare."""
    import aggregates.pipeline as pipeline_module
    import aggregates.session_batch as batch_module
    import store.sessions as session_store

    spent = dict.fromkeys(PARTS, 0.0)
    restore: list[tuple[object, str, object]] = []

    def wrap(owner, attr: str, label: str) -> None:
        restore.append((owner, attr, wrap_timed(owner, attr, label, spent)))

    sessions = pipeline.sessions
    if hasattr(pipeline_module, "bloom_and_runs"):
        wrap(pipeline_module, "bloom_and_runs", PARTS[0])
    else:  # an older checkout: the sessions' own job
        wrap(sessions, "runs", PARTS[0])
    wrap(store, "session_state", PARTS[1])
    for attr in ("session_batch", "session_batch_columns", "session_partials"):
        if hasattr(batch_module, attr):  # (this code's names, or an older checkout's)
            wrap(batch_module, attr, PARTS[3] if attr == "session_partials" else PARTS[2])
    wrap(sessions, "sessionize", PARTS[4])
    wrap(session_store, "apply", PARTS[5])
    wrap(pipeline, "process_batch", PARTS[6])
    wrap(store, "commit_batch", PARTS[7])
    try:
        yield spent
    finally:
        for owner, attr, fn in reversed(restore):
            if owner is store or owner is sessions or owner is pipeline:
                delattr(owner, attr)
            else:
                setattr(owner, attr, fn)
        # sessionize includes the lookup, the rule and the partials: its own remainder is the rest
        spent[PARTS[4]] -= spent[PARTS[1]] + spent[PARTS[2]] + spent[PARTS[3]]


def print_parts(spent: dict[str, float], batches: int, reference_job_s: float | None = None) -> None:
    """The parts; the sessions' own share counts the per-key job only by what it took over the same
    job in the run without sessions (`reference_job_s`: the Bloom features' alone), when given."""
    whole = spent["whole batches"] or 1.0
    print(f"  parts over {batches} batches (seconds, share of the batches' time):", flush=True)
    for label in PARTS:
        print(f"    {label:34s} {spent[label]:7.2f} s  {100 * spent[label] / whole:5.1f} %", flush=True)
    if reference_job_s is None:
        return
    own = spent[PARTS[0]] - reference_job_s + sum(spent[label] for label in PARTS[1:6])
    print(f"    {'sessions in all':34s} {own:7.2f} s  {100 * own / whole:5.1f} %  (the per-key job counted as"
          f" {spent[PARTS[0]]:.2f} - {reference_job_s:.2f} s without sessions)", flush=True)


def run_pipeline(spark, catalog: Catalog, root: Path, log_path: Path, name: str, batch_records: int,
                 reference_job_s: float | None = None):
    """One drained run on a fresh store; its parts printed. Returns (drained, store, config, the
    sessions' step in seconds (their share of the per-key job over `reference_job_s` and their
    driver work), the per-key job's seconds)."""
    from aggregates.pipeline import Pipeline, PipelineConfig

    store = SqlitePaneStore(root / f"{name}.db")
    config = PipelineConfig("bench", log_path, root / "checkpoints" / name, max_records_per_batch=batch_records)
    pipeline = Pipeline(spark, catalog, store, config)
    cpu = tree_cpu_seconds()
    with part_timers(pipeline, store) as parts:
        drained = drain_timed(pipeline, store, out=open(os.devnull, "w"))
    if cpu is not None:  # the driver, the JVM and its workers: what the others' load changes least
        cpu = tree_cpu_seconds() - cpu
        print(f"  {name}: CPU {cpu:.1f} s (this process and its JVM), wall {drained.wall_s:.1f} s,"
              f" {drained.batches} batches", flush=True)
    print_parts(parts, drained.batches, reference_job_s if pipeline.sessions.enabled else None)
    step = parts[PARTS[0]] - (reference_job_s or 0.0) + sum(parts[label] for label in PARTS[1:5])
    return drained, store, config, step, parts[PARTS[0]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sessions", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--batch-records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=1, help="repeat the three runs (alternated) this many times")
    parser.add_argument("--streams", type=Path, default=DEFAULT_STREAMS)
    parser.add_argument("--skip-before", action="store_true",
                        help="leave out the old session queries: panes only against sessions in the batch")
    args = parser.parse_args(argv)
    from aggregates.spark import build_spark

    catalog = load_catalog(args.streams)
    plain = without_sessions(catalog)
    with_sessions = [n for n, s in catalog.streams.items() if s.sessions is not None and not s.derived_from]
    root = Path(tempfile.mkdtemp(prefix="sketchboard-bench-sessions-"))
    spark = build_spark("local[2]")
    try:
        log = SqliteEventLog(root / "log.db")
        for stream in catalog.streams.values():
            log.ensure_topic(stream)
        fill_log(log, catalog, args.events)
        total = sum(o.end for name in catalog.streams for o in log.offsets(name).values())
        log.close()
        print(f"log: {total:,} events; sessions on {', '.join(with_sessions)}; load {os.getloadavg()}", flush=True)
        for round_ in range(args.rounds):
            reference, store, _, _, job_s = run_pipeline(spark, plain, root, root / "log.db", f"plain{round_}",
                                                          args.batch_records)
            store.close()
            print(f"[round {round_}] panes only: {reference.wall_s:.1f} s = {total / reference.wall_s:,.0f} events/s"
                  f" (load {os.getloadavg()[0]:.1f})", flush=True)
            spent, closed_before = 0.0, {}
            if not args.skip_before:
                before, store, config, _, _ = run_pipeline(spark, plain, root, root / "log.db", f"before{round_}",
                                                           args.batch_records)
                store.close()
                for name in with_sessions:
                    took, closed_before[name] = session_query(spark, catalog, name, config,
                                                              root / "checkpoints" / f"before{round_}-sessions-{name}")
                    spent += took
                    print(f"  session query {name}: {took:.1f} s, {closed_before[name]:,} sessions closed", flush=True)
                print(f"[round {round_}] before (pipeline + session queries): {before.wall_s:.1f} + {spent:.1f} s ="
                      f" {total / (before.wall_s + spent):,.0f} events/s (load {os.getloadavg()[0]:.1f})", flush=True)
            after, store, _, step_s, _ = run_pipeline(spark, catalog, root, root / "log.db", f"inbatch{round_}",
                                                      args.batch_records, reference_job_s=job_s)
            closed_after = {name: sum(p.data.count for p in store.read_panes(f"{name}_sessions", 0, 2**62))
                            for name in with_sessions}
            still_open = store.session_sizes()
            store.close()
            print(f"[round {round_}] in batch: {after.wall_s:.1f} s = {total / after.wall_s:,.0f} events/s"
                  f" (of which the sessions' step {step_s:.1f} s, against the session queries' {spent:.1f} s);"
                  f" sessions closed {closed_after}, open {still_open} (before: closed {closed_before})"
                  f" (load {os.getloadavg()[0]:.1f})", flush=True)
            old_cost = "" if args.skip_before else f"before +{before.wall_s + spent - reference.wall_s:.1f} s, "
            print(f"[round {round_}] sessions' cost over panes only: {old_cost}in batch +{after.wall_s - reference.wall_s:.1f} s;"
                  f" sustained {reference.sustained_per_s:,.0f} (panes only) vs {after.sustained_per_s:,.0f} events/s"
                  f" (in batch): {100 * (1 - after.sustained_per_s / reference.sustained_per_s):.0f} % less", flush=True)
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark: the scale-out stack next to the embedded defaults, in one run, on this machine.

    python -m bench.scale_out [--events 1000000] [--batch-records 250000] [--workers 2]
                              [--query-events 100000] [--repeat 20]

Stacks (each pipeline run is its own process, as a deployment runs it: one SparkContext each):

- embedded: the embedded log (a SQLite file), the SQLite store, Spark local[2] in the driver;
- scale-out: a Kafka broker (tests/kafka_broker.py), a Spark standalone master with `--workers`
  workers of `--worker-cores` cores (tests/spark_cluster.py; the pipeline's driver submits to
  it, executors run in the workers), PostgreSQL (tests/postgres_server.py), all on loopback.

For each: fill the log with `--events` demo events (bench.throughput.fill_log), then drain it
with the pipeline (Trigger.AvailableNow, batches of `--batch-records`) and report log -> store
events/s (sustained: from the end of the first batch to the end of the last, so Spark's start
and the first batch's warm-up do not count) and the store commit time per batch (the one
transaction that merges a batch's partials into the panes, tiers and watermarks).

Then query latency on each store: a day of `--query-events` demo events committed through the
store (bench.day_of_data), GET /api/v1/query for 24 h at 1-minute steps with p99, `--repeat`
times: p50 and p99 in ms.

Everything runs on one machine here, so the scale-out stack's broker, master, workers and
database share its cores with the driver: the figures compare the two stacks' overheads, not
what more machines would add. Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.drain import drain_timed
from bench.serve import nearest_rank

RESULT = "RESULT "  # a child's last line: its figures as JSON


def drain(args) -> dict:
    """In a child process: fill one stack's log, drain it with the pipeline, measure."""
    from aggregates.pipeline import Pipeline, PipelineConfig
    from aggregates.spark import build_spark, kafka_connector_conf
    from bench.throughput import fill_log
    from catalog import load_catalog
    from sketchboard.settings import DEFAULT_STREAMS, Settings

    catalog = load_catalog(DEFAULT_STREAMS)
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    extra: dict[str, str] = {}
    kafka = None
    if args.kafka_bootstrap:
        from ingest.kafka_source import KafkaSourceConfig
        from ingest.log.kafka import KafkaEventLog

        prefix = f"bench{int(time.time())}."
        log = KafkaEventLog(args.kafka_bootstrap, topic_prefix=prefix, replication_factor=1)
        kafka = KafkaSourceConfig(args.kafka_bootstrap, topic_prefix=prefix)
        extra = kafka_connector_conf(Settings.model_fields["spark_kafka_jars"].default)
    else:
        from ingest.log import SqliteEventLog

        log = SqliteEventLog(root / "log.db")
    for stream in catalog.streams.values():
        log.ensure_topic(stream)
    append_s = fill_log(log, catalog, args.events)
    if args.postgres_dsn:
        from store.postgres import PostgresPaneStore

        store = PostgresPaneStore(args.postgres_dsn)
    else:
        from store import SqlitePaneStore

        store = SqlitePaneStore(root / "store.db")
    extra.update(json.loads(args.spark_conf))
    started = time.perf_counter()
    spark = build_spark(args.master, driver_memory="1g", shuffle_partitions=args.shuffle_partitions,
                        extra_conf=extra)
    spark_start_s = time.perf_counter() - started
    config = PipelineConfig("bench", root / "log.db", root / "checkpoints", max_records_per_batch=args.batch_records,
                            kafka=kafka)
    pipeline = Pipeline(spark, catalog, store, config, log=log)

    commits: list[float] = []
    commit = store.commit_batch

    def timed_commit(*a, **kw):
        t = time.perf_counter()
        try:
            return commit(*a, **kw)
        finally:
            commits.append(time.perf_counter() - t)

    store.commit_batch = timed_commit  # this store object only: what the pipeline calls per batch
    drained = drain_timed(pipeline, store, out=sys.stderr)
    done, wall, sustained = drained.events, drained.wall_s, drained.sustained_per_s
    spark.stop()
    store.close()
    log.close()
    return {"events": done, "appended_per_s": args.events / append_s, "spark_start_s": spark_start_s,
            "batches": len(commits), "sustained_per_s": sustained, "wall_per_s": done / wall,
            "commit_ms_median": statistics.median(commits) * 1000, "commit_ms_max": max(commits) * 1000,
            "commit_events_per_s": done / sum(commits)}


def run_child(label: str, root: Path, args, *, master: str, kafka: str | None = None, dsn: str | None = None,
              spark_conf: dict | None = None, env: dict | None = None) -> dict:
    cmd = [sys.executable, "-m", "bench.scale_out", "--drain", "--root", str(root), "--master", master,
           "--events", str(args.events), "--batch-records", str(args.batch_records),
           "--shuffle-partitions", str(args.shuffle_partitions), "--spark-conf", json.dumps(spark_conf or {})]
    if kafka:
        cmd += ["--kafka-bootstrap", kafka]
    if dsn:
        cmd += ["--postgres-dsn", dsn]
    print(f"[{label}] pipeline on {master} ...", flush=True)
    out = subprocess.run(cmd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith(RESULT)]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"[{label}] the pipeline run failed ({out.returncode}):\n{out.stdout[-3000:]}")
    return json.loads(lines[-1][len(RESULT):])


def query_latency(label: str, kind: str, root: Path, args, dsn: str | None) -> dict:
    """bench.day_of_data's store fill and timed HTTP queries, 24 h at 1-minute steps with p99."""
    from bench.day_of_data import QUERIES, run
    from catalog import load_catalog
    from sketchboard.settings import DEFAULT_STREAMS

    catalog = load_catalog(DEFAULT_STREAMS)
    wanted = [q for q in QUERIES if q[0] == "24h 1m p99"]  # only the query the issue asks about
    options = argparse.Namespace(events=args.query_events, hours=24.0, batch=args.query_batch, repeat=args.repeat,
                                 long_queries=False, ws=0)
    root.mkdir(parents=True, exist_ok=True)
    end_ms = (int(time.time() * 1000) // 60_000) * 60_000
    times = run(label, catalog, root, options, end_ms, kind=kind, dsn=dsn, queries=wanted)["24h 1m p99"]
    return {"p50_ms": nearest_rank(times, 0.5), "p99_ms": nearest_rank(times, 0.99)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scale_out", description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000, help="demo events in each stack's log")
    ap.add_argument("--batch-records", type=int, default=250_000, help="max records per micro-batch")
    ap.add_argument("--workers", type=int, default=2, help="Spark workers of the scale-out stack")
    ap.add_argument("--worker-cores", type=int, default=1)
    ap.add_argument("--worker-memory", default="1g", help="per worker; executors get --executor-memory of it")
    ap.add_argument("--executor-memory", default="768m")
    ap.add_argument("--shuffle-partitions", type=int, default=2, help="spark.sql.shuffle.partitions (~ total cores)")
    ap.add_argument("--query-events", type=int, default=100_000, help="a day of this many events for the queries")
    ap.add_argument("--query-batch", type=int, default=50_000, help="events per store commit when filling it")
    ap.add_argument("--repeat", type=int, default=20, help="runs of the 24 h query")
    ap.add_argument("--skip-embedded", action="store_true")
    ap.add_argument("--skip-queries", action="store_true")
    # The child's options (one pipeline run: `--drain`).
    ap.add_argument("--drain", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--master", default="local[2]", help=argparse.SUPPRESS)
    ap.add_argument("--kafka-bootstrap", help=argparse.SUPPRESS)
    ap.add_argument("--postgres-dsn", help=argparse.SUPPRESS)
    ap.add_argument("--spark-conf", default="{}", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.drain:
        figures = drain(args)
        print(RESULT + json.dumps(figures), flush=True)
        return 0

    from tests.kafka_broker import KafkaBroker
    from tests.postgres_server import PostgresServer
    from tests.spark_cluster import SparkCluster

    root = Path(tempfile.mkdtemp(prefix="sketchboard-scale-out-"))
    results: dict[str, dict] = {}
    queries: dict[str, dict] = {}
    load = os.getloadavg()[0]
    if not args.skip_embedded:
        results["embedded"] = run_child("embedded", root / "embedded", args, master="local[2]")
    broker = KafkaBroker(root / "broker", heap="768m")
    postgres = PostgresServer()
    cluster = SparkCluster(root / "spark", workers=args.workers, cores=args.worker_cores, memory=args.worker_memory)
    try:
        started = time.perf_counter()
        broker.start()
        postgres.start()
        cluster.start()
        print(f"[scale-out] Kafka, PostgreSQL, Spark master + {args.workers} workers up in"
              f" {time.perf_counter() - started:.1f} s", flush=True)
        conf = {"spark.executor.memory": args.executor_memory, "spark.executor.cores": str(args.worker_cores)}
        results["scale-out"] = run_child(
            "scale-out", root / "scale-out", args, master=cluster.master_url, kafka=broker.bootstrap,
            dsn=postgres.fresh_dsn(), spark_conf=conf, env={"SPARK_LOCAL_IP": "127.0.0.1"})
        if not args.skip_queries:
            queries["sqlite"] = query_latency("query sqlite", "sqlite", root / "query-sqlite", args, None)
            queries["postgres"] = query_latency("query postgres", "postgres", root / "query-postgres", args,
                                                postgres.fresh_dsn())
    finally:
        cluster.stop()
        broker.stop()
        postgres.stop()
    load = max(load, os.getloadavg()[0])

    print()
    print(f"log -> store, {args.events:,} demo events, batches of <= {args.batch_records:,}"
          f" (load average up to {load:.1f} on {os.cpu_count()} cores)")
    print(f"{'stack':<11} {'events/s sustained':>19} {'events/s wall':>14} {'batches':>8} {'commit ms/batch':>16}"
          f" {'commit max ms':>14} {'Spark start s':>14}")
    for name, r in results.items():
        print(f"{name:<11} {r['sustained_per_s']:>19,.0f} {r['wall_per_s']:>14,.0f} {r['batches']:>8}"
              f" {r['commit_ms_median']:>16,.0f} {r['commit_ms_max']:>14,.0f} {r['spark_start_s']:>14.1f}")
    print("  embedded = embedded log + SQLite + Spark local[2]; scale-out = Kafka + PostgreSQL + Spark master"
          f" with {args.workers} x {args.worker_cores}-core workers, all on this machine")
    if queries:
        print(f"\nGET /api/v1/query 24 h at 1-minute steps, p99 of latency, a day of {args.query_events:,} events,"
              f" {args.repeat} runs")
        print(f"{'store':<11} {'p50 ms':>8} {'p99 ms':>8}")
        for name, q in queries.items():
            print(f"{name:<11} {q['p50_ms']:>8.1f} {q['p99_ms']:>8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

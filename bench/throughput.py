"""Benchmark: sustained log -> store throughput of the pipeline, and the ingest API's events/s.

    python -m bench.throughput [--events 2000000] [--batch-records 1000000] [--api-events 200000]
                               [--log embedded|kafka|both] [--kafka-bootstrap HOST:PORT]
                               [--kafka-jvm-validation] [--event-ids [--duplicates 0.01]] [--sessions]
                               [--hours 24] [--partials spark,arrow,driver,spark]

1. Fills a fresh log with N realistic demo events (timed: the log's append rate).
2. Runs the pipeline on it with Trigger.AvailableNow and reports events/s from the first
   batch to the last commit (Spark's start-up excluded: it is paid once per process).
   `--log both` does 1 and 2 for the embedded log and then for Kafka topics read by Spark's
   Kafka source, in one Spark session, so the two figures come from the same run; Kafka is the
   broker at `--kafka-bootstrap`, or else a local one started from jars/kafka-broker (`make jars`,
   the test suite's tests/kafka_broker.py).
3. Starts the API in this process (uvicorn on a free loopback port) and posts demo events
   with bench.ingest_api (concurrent clients, in a process of their own unless `--api-clients
   thread`; httpx, or requests written whole on the socket with `--api-client wire`), reporting
   accepted events/s, and the CPU a request took by part (the API process, its ingest workers,
   the clients' process) beside what issue 28's bar (250 000 events/s) leaves a request on these
   cores; `--ingest-processes N` sets the API's ingest_processes. With `--log both` (or kafka)
   the API runs once per log: appending to the embedded log, then producing into Kafka
   (idempotent producer, acks=all, answered once the broker acknowledged every event).
A table at the end puts each log's figures side by side. `--kafka-jvm-validation` turns the
Kafka source's JVM fast path on (ingest/kafka_fast_path.py; off by default, where every record
goes through the API's validator in Python). `--event-ids` declares `event_id_field: request_id`
on every stream and gives each event a unique one (`--duplicates`: that share of events is sent
twice), to measure exact duplicate drops (aggregates/duplicates.py) against a run without.
`--hours 24` fills the log with issue 27's backfill instead: `http_requests` events only, their
times spread in order over the last 24 h (a day of events read by a clean service), and prints
the store's size. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench.drain import drain_timed
from bench.ingest_api import CLIENTS
from bench.serve import free_port, serving
from catalog import load_catalog
from demo import DemoTraffic
from ingest.events import EventValidator
from ingest.log import SqliteEventLog
from sketchboard.settings import DEFAULT_STREAMS
from sketchboard.wiring import available_cores
from store import SqlitePaneStore


EVENT_ID_FIELD = "request_id"


def with_event_ids(catalog):
    """The catalog with `event_id_field: request_id` on every stream read from the log."""
    from catalog import Catalog

    streams = {name: s if s.derived_from else s.model_copy(update={"event_id_field": EVENT_ID_FIELD})
               for name, s in catalog.streams.items()}
    return Catalog(streams=streams, metrics=catalog.metrics)


def fill_log(log, catalog, events: int, chunk: int = 50_000, *, duplicates: float = 0.0,
             spread_hours: float | None = None) -> float:
    """Append N demo events (validated like the API does) in chunks; returns seconds spent appending.
    Streams with an event_id_field get a unique id per event, and `duplicates` of them a copy.
    `spread_hours`: issue 27's backfill instead, only `http_requests` events, their times evenly
    spread in order over the last that many hours (a day of events backfilled into a clean log)."""
    import random

    traffic = DemoTraffic(catalog, seed=7)
    validators = {name: EventValidator(s) for name, s in catalog.streams.items()}
    spent, done, serial = 0.0, 0, 0
    rng = random.Random(7)
    end_ms = int(time.time() * 1000)
    while done < events:
        if spread_hours is None:
            generated = traffic.generate(min(chunk, events - done))
        else:
            raws = traffic.generate_stream(BACKFILL_STREAM, min(chunk, events - done))
            generated = {BACKFILL_STREAM: spread_in_order(raws, catalog.streams[BACKFILL_STREAM].time_field, done,
                                                          events, end_ms, spread_hours)}
        for name, raws in generated.items():
            if catalog.streams[name].event_id_field:
                for raw in raws:
                    raw[EVENT_ID_FIELD] = f"r{serial}"
                    serial += 1
                raws = raws + [dict(r) for r in rng.sample(raws, int(len(raws) * duplicates))]
            valid = [validators[name].validate(r) for r in raws]
            started = time.perf_counter()
            log.append(catalog.streams[name], valid, int(time.time() * 1000))
            spent += time.perf_counter() - started
            done += len(valid)
        print(f"  log: {done:,} / {events:,} events appended", flush=True)
    return spent


BACKFILL_STREAM = "http_requests"  # the day-of-data shape: issue 27's run fed this stream only


def spread_in_order(raws: list[dict], time_field: str, done: int, events: int, end_ms: int, hours: float) -> list[dict]:
    """The i-th of `events` events at end - hours + i * (hours / events): in time order, as a
    backfill of a day's events reads them, so none is late."""
    span_ms = int(hours * 3_600_000)
    for i, raw in enumerate(raws, start=done):
        raw[time_field] = end_ms - span_ms + i * span_ms // events
    return raws


def bench_pipeline(spark, root: Path, catalog, events: int, batch_records: int, kafka_bootstrap: str | None = None,
                   *, fast_path: bool = False, figures: dict | None = None, duplicates: float = 0.0,
                   sessions: bool = False, spread_hours: float | None = None,
                   partials: list[str] | None = None) -> float:
    """Fill a log (embedded, or Kafka topics when kafka_bootstrap is set), drain it; sustained events/s
    (also put in `figures`: append, wall and sustained events/s)."""
    from aggregates.pipeline import Pipeline, PipelineConfig

    root.mkdir(parents=True, exist_ok=True)
    what = "embedded log" if kafka_bootstrap is None else "Kafka (Spark's Kafka source)"
    kafka = None
    if kafka_bootstrap is None:
        log = SqliteEventLog(root / "log.db")
    else:
        from ingest.kafka_source import KafkaSourceConfig
        from ingest.log.kafka import KafkaEventLog

        prefix = f"bench{int(time.time())}."
        log = KafkaEventLog(kafka_bootstrap, topic_prefix=prefix, replication_factor=1)
        kafka = KafkaSourceConfig(kafka_bootstrap, topic_prefix=prefix, fast_path=fast_path)
    for stream in catalog.streams.values():
        log.ensure_topic(stream)
    print(f"[{what}] filling the log with {events:,} demo events ...", flush=True)
    append_s = fill_log(log, catalog, events, duplicates=duplicates, spread_hours=spread_hours)
    total = sum(o.end for name in catalog.streams for o in log.offsets(name).values())
    print(f"[{what}] log append: {total:,} events in {append_s:.1f} s = {total / append_s:,.0f} events/s", flush=True)
    log.close()

    rates: dict[str, list[tuple[float, float]]] = {}
    for run, mode in enumerate(partials or [None]):
        # Each run drains the same log into a fresh store with its own checkpoint (`--partials
        # spark,arrow,spark,arrow`: side by side, alternated, so load swings hit both).
        sub = root if mode is None else root / f"run{run}-{mode}"
        sub.mkdir(parents=True, exist_ok=True)
        store = SqlitePaneStore(sub / "store.db")
        config = PipelineConfig("bench", root / "log.db", sub / "checkpoints", max_records_per_batch=batch_records,
                                kafka=kafka, **path_settings(mode, batch_records))
        pipeline = Pipeline(spark, catalog, store, config)
        drained = drain_timed(pipeline, store)
        done, wall, sustained = drained.events, drained.wall_s, drained.sustained_per_s
        label = mode or config.partials
        rates.setdefault(label, []).append((done / wall, sustained))
        print(f"[{what}] pipeline log -> store ({label}): {done:,} events, {drained.batches}"
              f" batches of <= {batch_records:,}")
        print(f"  wall (start to drained):       {wall:.1f} s = {done / wall:,.0f} events/s")
        print(f"  sustained (batch 2 .. last):   {sustained:,.0f} events/s", flush=True)
        if spread_hours is not None:
            print(f"  store on disk: {(sub / 'store.db').stat().st_size / 2**20:,.0f} MiB", flush=True)
        if mode is not None and (run < len(partials) - 1):
            store.close()
    if len(rates) > 1:
        print("partials side by side (mean of the runs): " + ", ".join(
            f"{m}: wall {sum(w for w, _ in r) / len(r):,.0f} events/s, sustained {sum(s for _, s in r) / len(r):,.0f}"
            for m, r in rates.items()), flush=True)
    dropped = {n: s.duplicates_dropped for n, s in store.progress("bench").streams.items() if s.duplicates_dropped}
    if any(s.event_id_field for s in catalog.streams.values()):
        print(f"  event ids: duplicates dropped {dropped or 0}", flush=True)
    if sessions:
        # Sessions run inside the pipeline's batches (aggregates/session_batch.py), so they are in the
        # figures above; their side-by-side with the session query they replaced: python -m bench.sessions.
        for name, s in catalog.streams.items():
            if s.sessions is not None and not s.derived_from:
                closed = sum(p.data.count for p in store.read_panes(f"{name}_sessions", 0, 2**62))
                print(f"  sessions of {name}: {closed:,} closed, {store.session_sizes().get(name, 0):,} open", flush=True)
    store.close()
    if figures is not None:
        figures.update({"append": total / append_s, "wall": done / wall, "sustained": sustained})
    return sustained


def path_settings(mode: str | None, batch_records: int) -> dict:
    """PipelineConfig settings of a `--partials` mode: spark or arrow partials on Spark's path for every
    batch (no batch held on the driver), or driver: every batch read onto the driver and computed in
    Arrow there (driver_batch_rows as large as a batch). None: the shipped settings."""
    if mode is None:
        return {}
    if mode == "driver":
        return {"driver_batch_rows": batch_records}
    return {"partials": mode, "driver_batch_rows": 0}


def bench_pipelines(root: Path, catalog, events: int, batch_records: int, logs: list[str],
                    kafka_bootstrap: str | None, figures: dict[str, dict], *, fast_path: bool = False,
                    duplicates: float = 0.0, sessions: bool = False, spread_hours: float | None = None,
                    partials: list[str] | None = None) -> None:
    from aggregates.spark import build_spark, kafka_connector_conf
    from sketchboard.settings import Settings

    extra = kafka_connector_conf(Settings.model_fields["spark_kafka_jars"].default) if "kafka" in logs else {}
    spark = build_spark("local[2]", extra_conf=extra)
    try:
        for name in logs:
            bench_pipeline(spark, root / name, catalog, events, batch_records,
                           kafka_bootstrap if name == "kafka" else None, fast_path=fast_path, figures=figures[name],
                           duplicates=duplicates, sessions=sessions, spread_hours=spread_hours, partials=partials)
    finally:
        spark.stop()
    if len(logs) == 2:
        e, k = figures["embedded"]["sustained"], figures["kafka"]["sustained"]
        print(f"log -> store, sustained: embedded {e:,.0f} events/s, Kafka {k:,.0f} events/s ({k / e:.2f} x)", flush=True)


INGEST_BAR = 250_000  # events/s: issue 28's ingest bar, whose CPU budget a run prints


_HELD: list[tuple[int, bytes]] = []  # in the clients' process: the bodies it was handed, to post


def hold_bodies(bodies: list[tuple[int, bytes]]) -> None:
    _HELD[:] = bodies


def clients_timed(url: str, concurrency: int, body_format: str, client: str = "httpx"):
    """bench.ingest_api's clients posting the bodies held, and the CPU seconds of the process they ran
    in (theirs alone)."""
    from bench.ingest_api import run_bench

    before = time.process_time()
    result = run_bench(url, "http_requests", _HELD, concurrency, body_format, client)
    return result, time.process_time() - before


def post_bodies(url: str, bodies: list[tuple[int, bytes]], concurrency: int, body_format: str, clients: str,
                started: Callable[[], None] = lambda: None, client: str = "httpx"):
    """bench.ingest_api's clients: in a process of their own (`clients="process"`), as any client of a
    service is, or in threads of this one, where they share the GIL with the API's event loop.
    `started` is called just before the first body is sent (the bodies already handed to the clients'
    process: their pickling is not the API's CPU). Returns the clients' result and their CPU seconds
    (None in threads: counted with the API process's)."""
    from bench.ingest_api import run_bench

    if clients == "thread":
        started()
        return run_bench(url, "http_requests", bodies, concurrency, body_format, client), None
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        pool.submit(hold_bodies, bodies).result()  # its imports done and the bodies there first
        started()
        return pool.submit(clients_timed, url, concurrency, body_format, client).result()


def request_budget_line(batch: int, cores: int, spent_ms: dict[str, float], rate: float = INGEST_BAR) -> str:
    """What `rate` events/s in requests of `batch` events asks in CPU a request, on `cores` that
    clients and server share, beside what each part spent (ms a request): the ingest bar's
    arithmetic (docs/benchmarks.md, sessions 81-83), printed by each run."""
    budget_ms = cores * 1000 * batch / rate
    total = sum(spent_ms.values())
    split = ", ".join(f"{name} {ms:.2f}" for name, ms in spent_ms.items())
    return (f"CPU a request: {total:.2f} ms ({split}). {rate:,.0f} events/s in requests of {batch:,} on {cores}"
            f" core{'s' if cores != 1 else ''} leaves {budget_ms:.2f} ms a request for all of them; this run spent"
            f" {total / budget_ms:.2f} x that")


def processes_cpu_s(pids: list[int]) -> dict[int, float]:
    """User + system CPU seconds of each live process of `pids` (the ingest workers)."""
    from bench.cpu import process_cpu_seconds

    return {pid: cpu for pid in pids if (cpu := process_cpu_seconds(pid)) is not None}


def group_sizes(workers) -> str:
    """How the ingest workers took the bodies, " (N bodies in M groups)" (their group commit), or
    nothing without them."""
    if workers is None or not workers.groups:
        return ""
    return f" ({workers.handled:,} bodies in {workers.groups:,} groups)"


def wait_for_ingest_workers(ctx, timeout_s: float = 60.0) -> None:
    """The ingest worker processes started (api/ingest_workers.py), so none of the timed bodies is
    handled in the API process while they import."""
    workers = ctx.ingest_workers
    deadline = time.monotonic() + timeout_s
    while workers is not None and workers.ready < workers.processes and time.monotonic() < deadline:
        time.sleep(0.05)


def bench_api(root: Path, catalog, events: int, concurrency: int, kafka_bootstrap: str | None = None,
              figures: dict | None = None, *, batch: int = 1000, columnar: bool = True,
              body_format: str = "json", clients: str = "process", ingest_processes: int | str | None = None,
              client: str = "httpx") -> None:
    """POST /api/v1/events into the embedded log, or into Kafka topics when kafka_bootstrap is set."""
    from bench.ingest_api import prepare_bodies
    from sketchboard.settings import Settings
    from sketchboard.wiring import build_api, ingest_process_count

    port = free_port()
    what = "embedded log" if kafka_bootstrap is None else "Kafka"
    log_settings = {} if kafka_bootstrap is None else {
        "log_backend": "kafka", "kafka_bootstrap_servers": kafka_bootstrap, "kafka_replication_factor": 1,
        "kafka_topic_prefix": f"benchapi{int(time.time())}."}
    settings = Settings(data_dir=root / f"api-{'kafka' if kafka_bootstrap else 'embedded'}-{columnar}-{body_format}", port=port,
                        streams_config=DEFAULT_STREAMS, columnar_ingest=columnar, **log_settings,
                        **({} if ingest_processes is None else {"ingest_processes": ingest_processes}))
    app, ctx = build_api(settings)
    bodies = prepare_bodies(DemoTraffic(catalog, seed=3), "http_requests", events, batch, body_format)
    with serving(app, port, join_s=10):
        wait_for_ingest_workers(ctx)
        workers = [p.pid for p in ctx.ingest_workers.running()] if ctx.ingest_workers is not None else []
        before: dict[str, object] = {}

        def started() -> None:
            before.update(api=time.process_time(), workers=processes_cpu_s(workers))

        result, clients_cpu_s = post_bodies(f"http://127.0.0.1:{port}", bodies, concurrency, body_format, clients,
                                            started, client)
        api_cpu_s = time.process_time() - before["api"]
        workers_before, workers_after = before["workers"], processes_cpu_s(workers)
    written = sum(o.end - o.start for o in ctx.log.offsets("http_requests").values())
    ctx.log.close()
    rate = result.accepted / result.seconds
    path = "columnar" if columnar else "per-event"
    print(f"ingest API -> {what} ({path} validation, {body_format}): {result.accepted:,} events accepted in"
          f" {result.seconds:.1f} s = {rate:,.0f} events/s ({result.requests} requests of {batch},"
          f" {concurrency} {client} clients"
          f" in {'their own process' if clients == 'process' else 'threads of the API process'},"
          f" {ingest_process_count(settings)} ingest processes{group_sizes(ctx.ingest_workers)},"
          f" p50 {result.percentile_ms(0.5):.0f} ms,"
          f" p99 {result.percentile_ms(0.99):.0f} ms; {written:,} in the log"
          + (f"; failed requests {result.failed_requests}: {result.first_problem}" if result.failed_requests else "")
          + ")", flush=True)
    if result.requests and Path("/proc/self/stat").exists():
        # Workers that ended meanwhile are left out (their CPU is gone with them); none does in a clean run.
        spent = {"API process" if clients_cpu_s is not None else "API process and its client threads":
                 api_cpu_s / result.requests * 1000}
        if workers:
            spent["ingest workers"] = sum(workers_after[p] - workers_before[p] for p in workers_after
                                          if p in workers_before) / result.requests * 1000
        if clients_cpu_s is not None:
            spent["clients"] = clients_cpu_s / result.requests * 1000
        print(f"  {request_budget_line(batch, available_cores(), spent)}", flush=True)
    if figures is not None:
        if columnar:  # the table shows the shipped path; --api-compare prints the other in its line above
            figures.update({"api": rate, "api_p50": result.percentile_ms(0.5), "api_p99": result.percentile_ms(0.99)})


def print_table(figures: dict[str, dict]) -> None:
    def cell(row: dict, key: str, unit: str = "") -> str:
        return f"{row[key]:,.0f}{unit}" if key in row else "-"

    print("\n| log | append, events/s | log -> store sustained, events/s | log -> store wall, events/s"
          " | POST /api/v1/events, events/s (p50 / p99 per request) |")
    print("| --- | --- | --- | --- | --- |")
    for name, row in figures.items():
        latency = f" ({row['api_p50']:.0f} / {row['api_p99']:.0f} ms)" if "api" in row else ""
        print(f"| {name} | {cell(row, 'append')} | {cell(row, 'sustained')} | {cell(row, 'wall')}"
              f" | {cell(row, 'api')}{latency} |", flush=True)


def ingest_processes_argument(text: str) -> int | str:
    """`--ingest-processes`: what the setting takes (a number or auto), refused here with its reason."""
    from sketchboard.settings import processes_or_auto

    try:
        return processes_or_auto(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=2_000_000, help="events in the log for the pipeline run")
    parser.add_argument("--batch-records", type=int, default=1_000_000, help="max records per micro-batch")
    parser.add_argument("--api-events", type=int, default=200_000, help="events posted to the ingest API")
    parser.add_argument("--concurrency", type=int, default=4, help="concurrent API clients")
    parser.add_argument("--streams", type=Path, default=DEFAULT_STREAMS,
                        help="streams configuration (default: the demo's, with first-seen and membership on)")
    parser.add_argument("--log", choices=("embedded", "kafka", "both"), default="embedded",
                        help="which log the pipeline reads (both: one after the other in one Spark session)")
    parser.add_argument("--kafka-bootstrap", help="a Kafka broker to use (default: start a local one)")
    parser.add_argument("--kafka-jvm-validation", action="store_true",
                        help="the Kafka source's JVM fast path on (from_json for clearly valid records)")
    parser.add_argument("--event-ids", action="store_true",
                        help=f"declare event_id_field: {EVENT_ID_FIELD} on every stream, a unique id per event")
    parser.add_argument("--duplicates", type=float, default=0.0,
                        help="with --event-ids: the share of events sent twice (dropped by the pipeline)")
    parser.add_argument("--sessions", action="store_true",
                        help="print the sessions closed and open per stream (they run in the pipeline's batches)")
    parser.add_argument("--hours", type=float,
                        help=f"issue 27's backfill: only {BACKFILL_STREAM} events, their times spread in order over"
                             " the last HOURS (e.g. --events 3000000 --hours 24 --batch-records 1000000)")
    parser.add_argument("--partials", help="comma-separated paths to drain the same log with, one after the other,"
                        " each into a fresh store: spark or arrow (partials computed by Spark's groupBy or by"
                        " mapInArrow, every batch through Spark), driver (every batch read onto the driver and"
                        " computed in Arrow there); e.g. spark,driver,spark,driver")
    parser.add_argument("--skip-pipeline", action="store_true")
    parser.add_argument("--skip-api", action="store_true")
    parser.add_argument("--api-batch", type=int, default=1000, help="events per API request")
    parser.add_argument("--api-format", choices=("json", "ndjson", "both"), default="json",
                        help="request bodies: JSON arrays, NDJSON, or both one after the other")
    parser.add_argument("--api-clients", choices=("process", "thread"), default="process",
                        help="the API's clients in a process of their own (as any client of a service), or in threads"
                             " of the process serving the API (sharing its GIL: the figures before session 82)")
    parser.add_argument("--api-client", choices=CLIENTS, default="httpx",
                        help="the clients' HTTP: httpx (as an application posts), or each request written whole on"
                             " its socket (wire: bench/http_wire.py, as a load generator such as wrk does)")
    parser.add_argument("--ingest-processes", type=ingest_processes_argument,
                        help="the API's ingest_processes setting, a number or auto (default: the setting's, auto; 0:"
                             " threads of the API process)")
    parser.add_argument("--api-compare", action="store_true",
                        help="post the same events with columnar_ingest off, then on (side by side in one run)")
    args = parser.parse_args(argv)
    catalog = load_catalog(args.streams)
    if args.event_ids:
        catalog = with_event_ids(catalog)
    root = Path(tempfile.mkdtemp(prefix="sketchboard-bench-"))
    logs = ["embedded", "kafka"] if args.log == "both" else [args.log]
    figures: dict[str, dict] = {name: {} for name in logs}
    broker = None
    kafka_bootstrap = args.kafka_bootstrap
    try:
        if "kafka" in logs and kafka_bootstrap is None:
            from tests.kafka_broker import KafkaBroker

            broker = KafkaBroker(root / "broker", heap="1g")
            broker.start()
            kafka_bootstrap = broker.bootstrap
        if not args.skip_pipeline:
            bench_pipelines(root, catalog, args.events, args.batch_records, logs, kafka_bootstrap, figures,
                            fast_path=args.kafka_jvm_validation, duplicates=args.duplicates, sessions=args.sessions,
                            spread_hours=args.hours, partials=args.partials.split(",") if args.partials else None)
        if not args.skip_api:
            for name in logs:
                formats = ("json", "ndjson") if args.api_format == "both" else (args.api_format,)
                for body_format in formats:
                    for columnar in ((False, True) if args.api_compare else (True,)):
                        bench_api(root, catalog, args.api_events, args.concurrency,
                                  kafka_bootstrap if name == "kafka" else None, figures[name],
                                  batch=args.api_batch, columnar=columnar, body_format=body_format,
                                  clients=args.api_clients, ingest_processes=args.ingest_processes,
                                  client=args.api_client)
        print_table(figures)
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

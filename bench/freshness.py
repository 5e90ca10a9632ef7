"""Freshness and websocket fan-out of a running Sketchboard (API + real Spark pipeline).

Starts `sketchboard up --no-demo` on a free loopback port with a fresh data directory, then:

1. Freshness: posts demo http_requests traffic at --rate events/s through POST /api/v1/events
   (--producers threads, bodies of --batch events) while one websocket client subscribes to
   the request count over an absolute range covering the run. For each POST, the time from
   its response ("event accepted") to the first websocket message after which the pushed
   counts add up to at least every event accepted so far (so this POST's events are in a
   pushed point). Prints p50/p95/p99/max.
2. Fan-out: with background traffic at --ramp-rate, ramps up websocket clients (each one
   subscription, the dashboard's "request rate by endpoint, last 15 m, 10 s step") and
   measures per-update delivery (client receive time - the hub's at_ms on the message). A
   level passes while p99 delivery <= 1 s, every client got updates about every second,
   and no connection failed. Prints one line per level and the largest level that passed.

    python -m bench.freshness --rate 20000 --duration 60 --levels 50,100,200,400,800
    python -m bench.freshness --skip-ramp --duration 30 --log kafka   # the log on Kafka topics
    python -m bench.freshness --skip-ramp --duration 600 --aged-days 8 --aged-events 2400000
    python -m bench.freshness --skip-ramp --duration 300 --mix      # the demo's other streams and tables too
    python -m bench.freshness --skip-ramp --duration 150 --tables --store postgres   # the store on PostgreSQL

`--aged-days D` first gives the service a store D days old, as a long-running one has: a service on
the same data folder is sent `--aged-events` demo http_requests events spread in order over the D
days before now (bench/day_backfill.py: POST /api/v1/events, then its pipeline drains the log), so
the run's commits write into, and retention drops from, D days of panes and tier rows. The
default 8 days is the stream's retention: every batch of the run then finds the oldest minute of
panes and minute rows due.

After the freshness phase the service log's micro-batches of the phase are summed up: events, the
whole batch and its store commit (median / p90 / max), as aggregates/pipeline.py logs each batch.

`--tables` first loads the demo's tables, every user and plan, as `make run` does, and posts their
changes every few seconds during the run: the requests are then enriched with the user's plan,
country and tier (without it every request's are "", and a batch touches far fewer panes).
`--mix` posts the demo's whole traffic: the tables, and beside each body of requests the other
streams drawn for as many requests (about 0.25 mobile_app screen views, 0.05 searches, 0.035
clicks and 0.02 orders a request), logins and checkouts by the clock. The freshness is still the
requests'.

`--log kafka` runs the service on Kafka: the broker at `--kafka-bootstrap`, or else a local one
started from jars/kafka-broker (`make jars`, the test suite's tests/kafka_broker.py).

Run by hand: it prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx

from catalog import load_catalog
from demo import DEFAULT_CONFIG, DemoTraffic

STREAM = "http_requests"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


# aggregates/pipeline.py's line for each micro-batch
BATCH_LINE = re.compile(r"batch (\d+): (\d+) events -> .* in (\d+) ms \(read .*, store commit (\d+) ms\)")


@dataclass(frozen=True)
class Batch:
    batch_id: int
    events: int
    ms: float
    commit_ms: float


def parse_batches(text: str) -> list[Batch]:
    return [Batch(int(m[1]), int(m[2]), float(m[3]), float(m[4])) for m in BATCH_LINE.finditer(text)]


def report_batches(batches: list[Batch]) -> None:
    if not batches:
        print("micro-batches: none logged in the phase (see the service log)")
        return
    print(f"micro-batches: {len(batches)} in the phase, events median {pct([b.events for b in batches], .5):,.0f};"
          f" whole batch median / p90 / max {pct([b.ms for b in batches], .5):.0f} /"
          f" {pct([b.ms for b in batches], .9):.0f} / {max(b.ms for b in batches):.0f} ms;"
          f" its store commit {pct([b.commit_ms for b in batches], .5):.0f} /"
          f" {pct([b.commit_ms for b in batches], .9):.0f} / {max(b.commit_ms for b in batches):.0f} ms")


class Service:
    def __init__(self, data_dir: Path, env: dict[str, str]):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = open(data_dir / "service.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sketchboard.cli", "up", "--no-demo", "--port", str(self.port),
             "--data-dir", str(data_dir / "data")],
            env={**os.environ, **env, "PYTHONUNBUFFERED": "1"}, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the service did not start; see {self.log.name}")
            try:
                if httpx.get(f"{self.base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)

    def wait_pipeline(self, timeout_s: float = 180) -> None:
        """Until the pipeline is up with nothing to read: it has committed a batch (Spark's query
        runs an empty batch 0 at its start) or says it runs (its own batches of the embedded log
        run none until records come: aggregates/driver_serving.py)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            r = httpx.get(f"{self.base}/api/v1/pipeline", timeout=10).json()
            running = ((r.get("health") or {}).get("query") or {}).get("running")
            if (r["last_batch_id"] is not None or running) and r["lag_events"] == 0:
                return
            time.sleep(0.5)
        raise SystemExit("the pipeline committed nothing in time")

    def logged_bytes(self) -> int:
        self.log.flush()
        return Path(self.log.name).stat().st_size

    def batches_since(self, offset: int) -> list[Batch]:
        """The micro-batches the pipeline logged after `offset` bytes of the service log."""
        with open(self.log.name, "rb") as f:
            f.seek(offset)
            return parse_batches(f.read().decode(errors="replace"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


class Producer:
    """Posts demo http_requests events at `rate`/s from `threads` threads; records, per POST,
    (response time, events accepted in total so far).

    With `mix`, the first thread also posts, beside each body of its requests, the demo's other
    streams drawn for every thread's requests (DemoTraffic.generate: orders, mobile_app, searches,
    clicks, and logins and checkouts by the clock), all from its one DemoTraffic; with `tables` (a
    DemoTraffic that has made the initial load), the table changes due. Only the requests are
    counted: the freshness measured is theirs."""

    def __init__(self, base: str, rate: float, batch: int, threads: int, mix: bool = False,
                 tables: DemoTraffic | None = None):
        self.base, self.rate, self.batch, self.threads = base, rate, batch, threads
        self.mix, self.tables = mix, tables
        self.others: dict[str, int] = {}  # with mix: events of the other streams and tables accepted
        self.catalog = load_catalog(DEFAULT_CONFIG)
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.accepted = 0
        self.posts: list[tuple[float, int]] = []
        self.errors = 0
        self.request_s: list[float] = []

    def start(self) -> None:
        self.started = time.monotonic()
        self.workers = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(self.threads)]
        for w in self.workers:
            w.start()

    def _run(self, index: int) -> None:
        traffic = DemoTraffic(self.catalog, seed=index)
        per_thread = self.rate / self.threads
        interval = self.batch / per_thread
        next_at = time.monotonic() + index * interval / self.threads
        with httpx.Client(timeout=30) as client:
            while not self.stop_event.is_set():
                delay = next_at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                next_at = max(next_at + interval, time.monotonic() - 1.0)  # no unbounded catch-up
                body = json.dumps(traffic.generate_stream(STREAM, self.batch))
                if index == 0 and (self.mix or self.tables is not None):
                    # What every thread's requests bring, from this one thread's traffic: one device fleet
                    # (a device id in several fleets would have several clocks), one search model.
                    self._post_others(client, traffic.generate(self.batch * self.threads, skip={STREAM})
                                      if self.mix else {})
                t0 = time.monotonic()
                try:
                    r = client.post(f"{self.base}/api/v1/events", params={"stream": STREAM}, content=body,
                                    headers={"content-type": "application/json"})
                except httpx.HTTPError:
                    self.errors += 1
                    continue
                t1 = time.monotonic()
                if r.status_code != 200:
                    self.errors += 1
                    continue
                with self.lock:
                    self.accepted += r.json()["accepted"]
                    self.posts.append((time.time(), self.accepted))
                    self.request_s.append(t1 - t0)

    def _post_others(self, client: httpx.Client, drawn: dict[str, list[dict]]) -> None:
        posts = [(f"{self.base}/api/v1/events", {"stream": name}, name, events) for name, events in drawn.items()
                 if events]
        if self.tables is not None:
            posts += [(f"{self.base}/api/v1/tables/{name}", {}, name, rows)
                      for name, rows in self.tables.table_changes().items()]
        for url, params, name, events in posts:
            try:
                r = client.post(url, params=params, content=json.dumps(events),
                                headers={"content-type": "application/json"})
            except httpx.HTTPError:
                self.errors += 1
                continue
            if r.status_code != 200:
                self.errors += 1
                continue
            with self.lock:
                self.others[name] = self.others.get(name, 0) + len(events)

    def stop(self) -> float:
        self.stop_event.set()
        for w in self.workers:
            w.join(30)
        return self.accepted / (time.monotonic() - self.started)


def freshness(service: Service, args, tables: DemoTraffic | None = None) -> None:
    from websockets.sync.client import connect

    start_ms = int(time.time() * 1000)
    query = {"metric": "requests", "stat": "count", "step": "10s",
             "from": str(start_ms - 120_000), "to": str(start_ms + int(args.duration * 1000) + 180_000)}
    counts: dict[int, float] = {}
    seen: list[tuple[float, float]] = []  # (receive time, total pushed so far, less the snapshot's)
    baseline = [0.0]  # the snapshot's total: the warm-up's events, aggregated before the run
    stop = threading.Event()
    ready = threading.Event()

    def reader():
        with connect(service.base.replace("http", "ws") + "/api/v1/ws", max_size=None) as ws:
            ws.send(json.dumps({"type": "topics", "topics": []}))
            ws.send(json.dumps({"type": "subscribe", "id": "f", "query": query}))
            while not stop.is_set():
                try:
                    msg = json.loads(ws.recv(timeout=0.5))
                except TimeoutError:
                    continue
                now = time.time()
                if msg["type"] == "snapshot":
                    for p in msg["result"]["series"][0]["points"]:
                        counts[p["t"]] = p["value"]
                    baseline[0] = sum(counts.values())
                    ready.set()
                elif msg["type"] == "points":
                    for s in msg["series"]:
                        for p in s["points"]:
                            counts[p["t"]] = p["value"]
                    seen.append((now, sum(counts.values()) - baseline[0]))

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    ready.wait(30)
    logged_from = service.logged_bytes()
    producer = Producer(service.base, args.rate, args.batch, args.producers, mix=args.mix, tables=tables)
    producer.start()
    time.sleep(args.duration)
    achieved = producer.stop()
    time.sleep(args.drain)
    stop.set()
    thread.join(5)

    report_batches(service.batches_since(logged_from))
    latencies, missing = [], 0
    j = 0
    for accepted_at, cumulative in producer.posts:  # in response order; cumulative grows
        while j < len(seen) and (seen[j][1] < cumulative or seen[j][0] < accepted_at):
            if seen[j][1] >= cumulative:  # pushed before this POST was answered: counts as ~0
                break
            j += 1
        if j == len(seen):
            missing += 1
            continue
        latencies.append(max(0.0, seen[j][0] - accepted_at))
    print(f"freshness: {len(producer.posts)} POSTs of {args.batch} events, target {args.rate:.0f} ev/s,"
          f" achieved {achieved:.0f} ev/s, {producer.errors} failed requests,"
          f" POST p50 {pct(producer.request_s, .5) * 1000:.0f} ms p99 {pct(producer.request_s, .99) * 1000:.0f} ms")
    print(f"freshness: accepted -> pushed on the websocket: p50 {pct(latencies, .5):.2f} s,"
          f" p95 {pct(latencies, .95):.2f} s, p99 {pct(latencies, .99):.2f} s, max {max(latencies or [0]):.2f} s"
          f" ({missing} POSTs never seen pushed within {args.drain:.0f} s after the run)")
    if producer.others:
        seconds = time.monotonic() - producer.started
        print("freshness: beside the requests, accepted " + ", ".join(
            f"{name} {n:,} ({n / seconds:,.0f}/s)" for name, n in sorted(producer.others.items())))


async def _client(url: str, query: dict, box: dict, updates: list, errors: list, stop: asyncio.Event, idx: int):
    from websockets.asyncio.client import connect

    try:
        async with connect(url, max_size=None, open_timeout=30) as ws:
            await ws.send(json.dumps({"type": "topics", "topics": []}))
            await ws.send(json.dumps({"type": "subscribe", "id": "c", "query": query}))
            while not stop.is_set():
                try:
                    text = await asyncio.wait_for(ws.recv(), 0.5)
                except TimeoutError:
                    continue
                if '"type":"points"' in text[:40]:
                    at = json.loads(text)["at_ms"]
                    box["delays"].append(time.time() - at / 1000)
                    updates[idx] += 1
    except Exception as exc:  # a failed or dropped connection fails the level
        errors.append(repr(exc))


async def ramp(service: Service, args) -> None:
    url = service.base.replace("http", "ws") + "/api/v1/ws"
    query = {"metric": "requests", "stat": "rate", "group_by": "endpoint", "from": "now-15m", "to": "now", "step": "10s"}
    tasks, best = [], 0
    stop = asyncio.Event()
    box: dict[str, list[float]] = {"delays": []}  # every client appends here; reset per level
    updates: list[int] = []
    errors: list[str] = []
    for level in [int(x) for x in args.levels.split(",")]:
        first_new = len(updates)
        updates.extend([0] * (level - len(updates)))
        for i in range(first_new, level):
            tasks.append(asyncio.create_task(_client(url, query, box, updates, errors, stop, i)))
        await asyncio.sleep(args.settle)  # connect and snapshot
        for i in range(level):
            updates[i] = 0
        box["delays"] = delays = []
        await asyncio.sleep(args.hold)
        per_client = [updates[i] / args.hold for i in range(level)]
        p50, p99 = pct(delays, .5), pct(delays, .99)
        slow = sum(1 for u in per_client if u < 0.5)
        ok = not errors and p99 <= 1.0 and slow == 0
        print(f"fan-out: {level:5d} clients: {len(delays)} updates delivered, delivery p50 {p50 * 1000:.0f} ms"
              f" p99 {p99 * 1000:.0f} ms, updates/client/s min {min(per_client):.2f} mean"
              f" {statistics.mean(per_client):.2f}, errors {len(errors)} -> {'ok' if ok else 'over the line'}", flush=True)
        if not ok:
            break
        best = level
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    print(f"fan-out: one API process served {best} websocket clients with updates every second"
          f" (p99 delivery <= 1 s, no errors)")


def load_tables(service: Service) -> DemoTraffic:
    """The demo's initial table rows (every user, every plan), posted and aggregated; returns the
    DemoTraffic that drew them, whose table_changes() then gives the changes due (demo/users.py)."""
    tables = DemoTraffic(load_catalog(DEFAULT_CONFIG), seed=1_000)
    for name, rows in tables.table_changes().items():
        for i in range(0, len(rows), 10_000):
            r = httpx.post(f"{service.base}/api/v1/tables/{name}", json=rows[i:i + 10_000], timeout=60)
            r.raise_for_status()
        print(f"table {name}: {len(rows):,} rows loaded", flush=True)
    service.wait_pipeline()
    return tables


def age_store(data_dir: Path, days: float, events: int) -> None:
    """`events` demo events over the `days` before now, through a service on `data_dir` and its pipeline."""
    from bench.day_backfill import backfill_through_service

    # A minute short of the days: the oldest events then still fall inside the stream's retention
    # when they are aggregated a few minutes later (older ones would be dead-lettered as expired).
    hours = days * 24 - 1 / 60
    print(f"ageing the store: {events:,} events over the {hours:.2f} h before now", flush=True)
    started = time.perf_counter()
    backfill_through_service(data_dir, DEFAULT_CONFIG, events, hours, int(time.time() * 1000))
    size = sum(f.stat().st_size for f in data_dir.rglob("*") if f.is_file()) / 2**30
    print(f"aged in {time.perf_counter() - started:.0f} s; the data folder holds {size:.2f} GiB", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=20_000, help="events/s posted in the freshness phase")
    p.add_argument("--duration", type=float, default=60, help="seconds of traffic in the freshness phase")
    p.add_argument("--drain", type=float, default=10, help="seconds to wait for the last points after it")
    p.add_argument("--batch", type=int, default=1000, help="events per POST")
    p.add_argument("--producers", type=int, default=4, help="posting threads")
    p.add_argument("--ramp-rate", type=float, default=2000, help="events/s of background traffic while ramping")
    p.add_argument("--levels", default="25,50,100,200,400,800,1600", help="websocket clients per ramp level")
    p.add_argument("--hold", type=float, default=10, help="seconds measured per level")
    p.add_argument("--settle", type=float, default=5, help="seconds for a level's clients to connect")
    p.add_argument("--skip-ramp", action="store_true")
    p.add_argument("--warmup", type=int, default=1, help="batches of 100 events aggregated before the run (each "
                   "waited for); 2 also warms the small batches' driver path up")
    p.add_argument("--trigger", default=None, help="pipeline trigger interval (SKETCHBOARD_TRIGGER_INTERVAL)")
    p.add_argument("--driver-rows", type=int, default=None,
                   help="batches of at most this many records run on the driver (SKETCHBOARD_DRIVER_BATCH_ROWS)")
    p.add_argument("--keep", type=Path, default=None,
                   help="run in this directory and keep it (the service's log and data) instead of a temporary one")
    p.add_argument("--log", choices=("embedded", "kafka"), default="embedded", help="the service's log backend")
    p.add_argument("--mix", action="store_true",
                   help="also post the demo's other streams, in its proportions per request, and its tables (--tables)")
    p.add_argument("--tables", action="store_true",
                   help="load the demo's users and plans before the run and post their changes during it")
    p.add_argument("--aged-days", type=float, default=0,
                   help="first backfill this many days before now into the service's store (embedded log only)")
    p.add_argument("--aged-events", type=int, default=2_400_000, help="events of that backfill, spread over the days")
    p.add_argument("--kafka-bootstrap", help="with --log kafka: a broker to use (default: start a local one)")
    p.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite",
                   help="the service's store; postgres: a throwaway local server started as the tests start theirs"
                        " (tests/postgres_server.py, without fsync)")
    args = p.parse_args(argv)
    if args.aged_days and (args.log != "embedded" or args.store != "sqlite"):
        p.error("--aged-days ages the embedded log's and store's service (bench/day_backfill.py); run it without"
                " --log kafka and --store postgres")

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # many sockets, here and in the service
    env = {"SKETCHBOARD_TRIGGER_INTERVAL": args.trigger} if args.trigger else {}
    if args.driver_rows is not None:
        env["SKETCHBOARD_DRIVER_BATCH_ROWS"] = str(args.driver_rows)
    with ExitStack() as stack:  # what it started, stopped in reverse order: the service, the database, the broker
        tmp = (str(args.keep) if args.keep
               else stack.enter_context(tempfile.TemporaryDirectory(prefix="sketchboard-freshness-")))
        Path(tmp).mkdir(parents=True, exist_ok=True)
        if args.log == "kafka":
            bootstrap = args.kafka_bootstrap
            if bootstrap is None:
                from tests.kafka_broker import KafkaBroker

                broker = KafkaBroker(Path(tmp) / "broker", heap="1g")
                broker.start()
                stack.callback(broker.stop)
                bootstrap = broker.bootstrap
            env.update({"SKETCHBOARD_LOG_BACKEND": "kafka", "SKETCHBOARD_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
                        "SKETCHBOARD_KAFKA_REPLICATION_FACTOR": "1",
                        "SKETCHBOARD_KAFKA_TOPIC_PREFIX": f"fresh{int(time.time())}."})
        if args.store == "postgres":
            from tests.postgres_server import PostgresServer

            server = PostgresServer()
            server.start()
            stack.callback(server.stop)
            env.update({"SKETCHBOARD_STORE_BACKEND": "postgres", "SKETCHBOARD_POSTGRES_DSN": server.dsn()})
        if args.aged_days:
            age_store(Path(tmp) / "data", args.aged_days, args.aged_events)
        service = Service(Path(tmp), env)
        stack.callback(service.stop)
        print(f"service on {service.base}; warming the pipeline up", flush=True)
        traffic = DemoTraffic(load_catalog(DEFAULT_CONFIG))
        tables = load_tables(service) if args.mix or args.tables else None
        # --warmup batches before the run: the first is the JVM's; a small batch's first on the
        # driver path builds the catalog's expressions once (~1-2 s on a loaded machine).
        for _ in range(args.warmup):
            httpx.post(f"{service.base}/api/v1/events", params={"stream": STREAM},
                       json=traffic.generate_stream(STREAM, 100), timeout=10)
            service.wait_pipeline()
        freshness(service, args, tables)
        if not args.skip_ramp:
            producer = Producer(service.base, args.ramp_rate, min(args.batch, 500), 1)
            producer.start()
            try:
                asyncio.run(ramp(service, args))
            finally:
                producer.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

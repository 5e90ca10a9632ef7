"""A day of data: query latency over a day of demo-shaped events, with the roll-up tiers as
shipped and with panes only (the baseline), side by side in one run. Prints figures;
asserts nothing.

    python -m bench.day_of_data                      # short form: 300 000 events over 24 h
    python -m bench.day_of_data --events 3000000     # the long form (a day of 3 M events)
    python -m bench.day_of_data --hours 168 --events 3000000 --long-queries   # a week
    python -m bench.day_of_data --only tiers --stores sqlite,postgres          # both store backends
    python -m bench.day_of_data --only tiers --declared   # and with the queries declared (point warmer)
    python -m bench.day_of_data --only tiers --sliding    # and the table's queries over a 1 h sliding window
    python -m bench.day_of_data --only tiers --through-api   # the day POSTed to a clean service, its pipeline drains it

With `--stores ...,postgres` the PostgreSQL store runs on a throwaway local server started as
the tests start theirs (tests/postgres_server.py: Debian's postgresql, fsync off), or on
`--postgres-dsn` (an empty database of its own for each configuration run: use with --only).

The demo generator (demo/) makes the events, with its endpoints, regions, users and
latency shapes, event times spread over the last `--hours`; they are aggregated into 10 s
panes as the executors would (real KLL and HLL sketches) and committed through the store in
batches of `--batch` events, as a pipeline backfilling the log would. Spark is not part of
this run: the commit figure is the store's share of log -> store. Queries go through the
real HTTP API (uvicorn on loopback, in this process), each `--repeat` times: first
with nothing computed ahead (the "nothing kept" columns: each query's first run merges its
sketches), then as the service answers once its point warmer has run (the main columns: the
standard views' points kept, query/standard_views.py; asked by a new API process).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import tempfile
import time
from collections import defaultdict
from functools import partial
from pathlib import Path

import numpy as np

from api.app import create_app
from api.context import ApiContext
from bench.serve import nearest_rank, serving
from catalog import Catalog, load_catalog
from demo import DemoTraffic
from ingest.log.sqlite import SqliteEventLog
from sketches import HllSketch, KllSketch
from sketchboard.settings import DEFAULT_STREAMS
from store import BatchCommit, PaneData, PanePartial, SqlitePaneStore, ValueStats
from store.tiers import catalog_layouts

STREAM = "http_requests"
HOUR = 3_600_000

QUERIES = [  # (label, query string); `to=now` is the end of the generated data
    ("24h 1m p99", "metric=latency&stat=p99&from=now-24h&step=1m"),
    ("24h 1m distinct", "metric=requests&stat=distinct&from=now-24h&step=1m"),
    ("24h 1m count", "metric=requests&stat=count&from=now-24h&step=1m"),
    ("24h 1h p99", "metric=latency&stat=p99&from=now-24h&step=1h"),
    ("1h 1m p99", "metric=latency&stat=p99&from=now-1h&step=1m"),
    ("15m 1m p99 by endpoint", "metric=latency&stat=p99&from=now-15m&step=1m&group_by=endpoint"),
    ("24h 1m p99 1h sliding", "metric=latency&stat=p99&from=now-24h&step=1m&window=1h"),
    ("24h 1m count by endpoint", "metric=requests&stat=count&from=now-24h&step=1m&group_by=endpoint"),
]
SLIDING_QUERIES = [  # --sliding: the table again "with a 1 h sliding window"
    ("24h 1m distinct 1h sliding", "metric=requests&stat=distinct&from=now-24h&step=1m&window=1h"),
    ("24h 1m count 1h sliding", "metric=requests&stat=count&from=now-24h&step=1m&window=1h"),
    ("1h 1m p99 1h sliding", "metric=latency&stat=p99&from=now-1h&step=1m&window=1h"),
    ("15m 1m p99 by endpoint 1h sliding", "metric=latency&stat=p99&from=now-15m&step=1m&group_by=endpoint&window=1h"),
]
LONG_QUERIES = [("7d 1h p99", "metric=latency&stat=p99&from=now-7d&step=1h"),
                ("7d 1h distinct", "metric=requests&stat=distinct&from=now-7d&step=1h")]


def demo_partials(catalog: Catalog, events: int, hours: float, end_ms: int, batch: int, seed: int = 1):
    """Batches of pane partials for `events` demo requests spread evenly over [end - hours, end)."""
    stream = catalog.stream(STREAM)
    clock_s = [0.0]
    traffic = DemoTraffic(catalog, seed=seed, clock=lambda: clock_s[0])
    span_ms = int(hours * HOUR)
    chunk = 20_000
    rng = np.random.default_rng(seed)
    pending: dict[tuple[int, str], list[dict]] = defaultdict(list)
    made = 0
    while made < events:
        n = min(chunk, events - made)
        lo = end_ms - span_ms + span_ms * made // events
        hi = end_ms - span_ms + span_ms * (made + n) // events
        clock_s[0] = hi / 1000.0  # the generator's daily shape and error bursts follow its clock
        times = np.sort(rng.integers(lo, max(hi, lo + 1), n))  # spread evenly over this slice of the span
        for e, t in zip(traffic.generate_stream(STREAM, n), times.tolist()):
            dims = tuple(str(e.get(d, "")) for d in stream.dimensions)
            pending[(t - t % stream.pane, dims)].append(e)
        made += n
        if sum(len(v) for v in pending.values()) >= batch or made >= events:
            yield [pane_partial(stream, start, dims, group) for (start, dims), group in pending.items()]
            pending.clear()


def pane_partial(stream, start: int, dims: tuple, group: list[dict]) -> PanePartial:
    values = {}
    for name in stream.values:
        xs = np.array([float(e[name]) for e in group if e.get(name) is not None])
        if len(xs):
            kll = KllSketch()
            kll._sketch.update(xs)  # vector update: the executors' kll_sketch_agg_double, in bulk
            values[name] = ValueStats(len(xs), math.fsum(xs), float(xs.min()), float(xs.max()), kll.to_bytes())
    distincts = {}
    for name in stream.distinct_fields:
        hll = HllSketch()
        for e in group:
            if e.get(name):
                hll.update(str(e[name]))
        distincts[name] = hll.to_bytes()
    return PanePartial(stream.name, start, start + stream.pane, dict(zip(stream.dimensions, dims)),
                       PaneData(len(group), values, distincts))


def open_store(kind: str, root: Path, dsn: str | None):
    if kind == "postgres":
        from store.postgres import PostgresPaneStore

        return PostgresPaneStore(dsn)
    return SqlitePaneStore(root / "store.db", synchronous="OFF")


def reopen(store):
    """Another store over the same data, as another process opens it."""
    if hasattr(store, "dsn"):
        from store.postgres import PostgresPaneStore

        return PostgresPaneStore(store.dsn)
    return SqlitePaneStore(store.path, synchronous="OFF")


def store_size_mib(store, root: Path) -> float:
    if hasattr(store, "dsn"):
        import psycopg

        with psycopg.connect(store.dsn) as conn:
            return conn.execute("SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
                                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                                " WHERE n.nspname = current_schema() AND c.relkind = 'r'").fetchone()[0] / 2**20
    return sum(f.stat().st_size for f in root.glob("store.db*")) / 2**20


def run(label: str, catalog: Catalog, root: Path, args, end_ms: int, kind: str = "sqlite",
        dsn: str | None = None, queries: list[tuple[str, str]] | None = None) -> dict[str, list[float]]:
    """Fill a store with a day of demo partials, then time `queries` (default: QUERIES, and
    LONG_QUERIES with --long-queries) through the API."""
    if queries is None:
        queries = QUERIES + (SLIDING_QUERIES if args.sliding else []) + (LONG_QUERIES if args.long_queries else [])
    if args.through_api:  # a clean service fed through its API and drained by its pipeline, then the same queries
        from bench.day_backfill import backfill_through_service

        backfill_through_service(root, DEFAULT_STREAMS, args.events, args.hours, end_ms)
    store = open_store(kind, root, dsn)
    store.configure_tiers(catalog_layouts(catalog), now_ms=end_ms)
    log = SqliteEventLog(root / "log.db", synchronous="OFF")
    if not args.through_api:
        commit_day(label, catalog, store, root, args, end_ms)
    ctx = ApiContext(catalog=catalog, log=log, store=store, clock=lambda: end_ms / 1000.0)
    # First with nothing computed ahead: each query's first run merges its sketches.
    out = {name + " [nothing kept]": times for name, times in over_http(ctx, queries, args.repeat).items()}
    out.update(as_served(catalog, store, log, queries, args.repeat, end_ms))
    if args.declared:
        out.update(declared_views(catalog, store, log, queries, args.repeat, end_ms))
    if label.startswith("panes"):
        out.update(before_tiers(catalog, store, end_ms, args, queries))
    if args.ws:
        out.update(under_websocket_load(catalog, store, log, args, end_ms))
    store.close()
    log.close()
    return out


def commit_day(label: str, catalog: Catalog, store, root: Path, args, end_ms: int) -> None:
    """The day's demo partials committed to the store in batches of `--batch` events, as a pipeline
    backfilling the log would; prints the commit's rate and the store's size."""
    commit_s, commit_cpu_s, events, rows, batches = 0.0, 0.0, 0, 0, 0
    for batch_id, partials in enumerate(demo_partials(catalog, args.events, args.hours, end_ms, args.batch)):
        n = sum(p.data.count for p in partials)
        commit = BatchCommit("main", batch_id, partials, n, {STREAM: max(p.end_ms for p in partials) - 1}, {},
                             read_by_stream={STREAM: n})
        t, cpu = time.perf_counter(), time.process_time()
        store.commit_batch(commit, lateness_ms={STREAM: 30_000}, now_ms=end_ms)
        commit_s += time.perf_counter() - t
        commit_cpu_s += time.process_time() - cpu  # this process's CPU: what a loaded machine leaves comparable
        events, rows, batches = events + n, rows + len(partials), batches + 1
    print(f"[{label}] {events} events -> {rows} pane partials; store commit {commit_s:.1f} s"
          f" = {events / commit_s:,.0f} events/s, {commit_s / batches * 1000:.0f} ms per batch of {args.batch};"
          f" CPU {commit_cpu_s:.1f} s = {events / commit_cpu_s:,.0f} events per CPU-second;"
          f" store size {store_size_mib(store, root):.0f} MiB")


def warm_standard_views(catalog: Catalog, store, kept, clock) -> None:
    """What the service's point warmer does in its first seconds (api/point_warmer.py, in a snapshot
    worker there): the standard views (query/standard_views.py) computed, their final points kept."""
    from api.point_warmer import PointWarmer
    from query.standard_views import StandardViews
    from store.point_cache import PointCache

    warmer = PointWarmer(store, lambda now_ms: [], interval_s=10, max_points=11_000, cache=PointCache(backing=kept),
                         clock=clock, standard=StandardViews(lambda: catalog, max_points=11_000))
    t, cpu = time.perf_counter(), time.process_time()
    warmed = warmer.run_once()
    kept.flush()  # written by then: the service's warmer ran seconds or hours before a new process asks
    print(f"  the point warmer computed {warmed} standard views in {time.perf_counter() - t:.2f} s"
          f" ({time.process_time() - cpu:.2f} s CPU)")


def as_served(catalog: Catalog, store, log, queries: list[tuple[str, str]], repeat: int,
              end_ms: int) -> dict[str, list[float]]:
    """The queries as the service answers them once its point warmer has run (it runs every 10 s):
    the standard views' points kept in the store, asked by a new API process (an empty point cache
    over them), `repeat` times. A query that is not a standard view computes its first run."""
    from store.final_points import FinalPoints
    from store.point_cache import PointCache

    kept = FinalPoints(store.side_db(), writer=store.side_db())  # as the service wires it (sketchboard/wiring.py)
    kept.clear()
    warm_standard_views(catalog, store, kept, lambda: end_ms / 1000.0)
    ctx = ApiContext(catalog=catalog, log=log, store=store, clock=lambda: end_ms / 1000.0,
                     point_cache=PointCache(backing=kept))
    out = over_http(ctx, queries, repeat)
    kept.close()
    return out


def over_http(ctx: ApiContext, queries: list[tuple[str, str]], repeat: int) -> dict[str, list[float]]:
    """timed_queries() against a new API process's app (ctx's) served by uvicorn on loopback, as a
    browser or Grafana asks it (FastAPI's test client started an event loop thread per request)."""
    import httpx

    app = create_app(ctx)
    new_process_start()
    with serving(app) as port, httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
        http.get("/healthz").raise_for_status()  # as a load balancer's probe does before any traffic
        return timed_queries(http, queries, repeat)


def new_process_start() -> None:
    """What the service does once its app is built, before it serves (sketchboard/cli.py): one
    collection, then what is alive moved out of the collector's reach. Here it also frees what an
    earlier run of this process left in reference cycles (the app of the run before: ~5 200
    objects, a 30-40 ms collection that a query of the next run met), which a new API process
    would not carry."""
    gc.collect()
    gc.freeze()


def declared_views(catalog: Catalog, store, log, queries: list[tuple[str, str]], repeat: int,
                   end_ms: int) -> dict[str, list[float]]:
    """`--declared`: the same queries as a dashboard's panels (one dashboard per range), computed
    ahead by the service's point warmer (api/point_warmer.py, in-process here), then asked by a
    new API process (an empty point cache over the points kept in the store), `repeat` times."""
    from urllib.parse import parse_qs

    from api.point_warmer import PointWarmer
    from dashboard.views import declared_queries
    from store.final_points import FinalPoints
    from store.point_cache import PointCache

    boards: dict[str, list[dict]] = defaultdict(list)
    for _, query in queries:
        q = {k: v[0] for k, v in parse_qs(query).items()}
        boards[q["from"].removeprefix("now-")].append(
            {"metric": q["metric"], "stat": q["stat"], "step": q["step"], "window": q.get("window"),
             "group_by": [g for g in q.get("group_by", "").split(",") if g]})
    definitions = [{"name": f"last-{r}", "range": r, "panels": panels} for r, panels in boards.items()]
    kept = FinalPoints(store.side_db(), writer=store.side_db())  # as the service wires it (sketchboard/wiring.py)
    kept.clear()  # what the plain runs kept: only the warmer's points now
    warmer = PointWarmer(store, lambda now_ms: declared_queries(definitions, catalog, now_ms=now_ms, max_points=11_000),
                         interval_s=10, max_points=11_000, cache=PointCache(backing=kept), clock=lambda: end_ms / 1000.0)
    t, cpu = time.perf_counter(), time.process_time()
    warmed = warmer.run_once()
    print(f"[declared] the warmer computed {warmed} declared views in {time.perf_counter() - t:.2f} s"
          f" ({time.process_time() - cpu:.2f} s CPU)")
    ctx = ApiContext(catalog=catalog, log=log, store=store, clock=lambda: end_ms / 1000.0,
                     point_cache=PointCache(backing=kept))
    out = {name + " [declared]": times for name, times in over_http(ctx, queries, repeat).items()}
    kept.close()
    return out


def before_tiers(catalog: Catalog, store, end_ms: int, args, queries: list[tuple[str, str]]) -> dict[str, list[float]]:
    """The same queries the way they were answered before tiers: every pane of the range read
    with its sketches and rolled up in Python (store.rollup), nothing cached. In-process, no HTTP."""
    from urllib.parse import parse_qs

    from catalog import parse_duration_ms
    from store.rollup import align_range, rollup

    out = {}
    for name, query in queries:
        q = {k: v[0] for k, v in parse_qs(query).items()}
        metric = catalog.metric(q["metric"])
        quantile = metric.check_stat(q["stat"])
        step = parse_duration_ms(q["step"])
        window = parse_duration_ms(q.get("window", q["step"]))
        lo, hi = align_range(end_ms - parse_duration_ms(q["from"].removeprefix("now-")), end_ms, step)
        times = []
        for _ in range(max(1, args.repeat // 4)):  # slow: fewer runs
            t = time.perf_counter()
            panes = store.read_panes(STREAM, lo, hi + window - step, value_field=metric.value,
                                     distinct_field=metric.distinct, with_sketches=quantile is not None
                                     or q["stat"] == "distinct")
            rollup(panes, stat=q["stat"], quantile=quantile, value_field=metric.value, distinct_field=metric.distinct,
                   start_ms=lo, end_ms=hi, step_ms=step, window_ms=window, pane_ms=10_000,
                   group_by=[g for g in q.get("group_by", "").split(",") if g])
            times.append((time.perf_counter() - t) * 1000)
        out[name + " [before]"] = times
    return out


def timed_queries(client, queries, repeat: int) -> dict[str, list[float]]:
    """Milliseconds per GET /api/v1/query, `repeat` times each."""
    out = {}
    for name, query in queries:
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            resp = client.get(f"/api/v1/query?{query}&to=now")
            times.append((time.perf_counter() - t) * 1000)
            assert resp.status_code == 200, resp.text
        out[name] = times
    return out


WS_SHAPES = [  # 24 h views a dashboard keeps open (each held by several clients)
    {"metric": "latency", "stats": ["p50", "p90", "p99"], "from": "now-24h", "step": "1m"},
    {"metric": "latency", "stat": "p99", "from": "now-24h", "step": "1m", "group_by": "endpoint"},
    {"metric": "requests", "stat": "distinct", "from": "now-24h", "step": "1m"},
    {"metric": "requests", "stat": "rate", "from": "now-24h", "step": "1m", "group_by": "region"},
    {"metric": "latency", "stat": "avg", "from": "now-24h", "step": "1h"},
]


def under_websocket_load(catalog: Catalog, store, log, args, end_ms: int) -> dict[str, list[float]]:
    """`--ws` websocket clients hold 24 h subscriptions (spread over WS_SHAPES) while a writer
    commits a batch of current demo events every second (so every view updates every second)
    and the REST queries are measured again, over real HTTP on loopback. The clients and the
    writer run in a process of their own (spawned), as browsers and the pipeline do: in the
    API's process their JSON parsing and sketch building would hold the GIL the API needs.
    Once per `--ws-workers` value (0: snapshots computed in the API process), the same load."""
    import multiprocessing

    import httpx

    from api.ws_workers import SnapshotWorkers
    from store.final_points import FinalPoints
    from store.point_cache import PointCache

    where = store.dsn if hasattr(store, "dsn") else str(store.path)
    kind = "postgres" if hasattr(store, "dsn") else "sqlite"
    out = {}
    for run_no, workers in enumerate(int(w) for w in str(args.ws_workers).split(",")):
        started = time.time()
        clock = lambda: end_ms / 1000.0 + (time.time() - started)  # noqa: E731 - the data's "now" moves on
        kept = FinalPoints(store.side_db(), writer=store.side_db())
        kept.clear()  # nothing computed by a previous configuration
        warm_standard_views(catalog, store, kept, clock)  # as the service's warmer has in its first seconds
        ctx = ApiContext(catalog=catalog, log=log, store=store, clock=clock, point_cache=PointCache(backing=kept))
        if workers:
            ctx.snapshot_workers = SnapshotWorkers(partial(_worker_state, kind, where), workers)
        spawn = multiprocessing.get_context("spawn")
        stop, received, committed, snapshots = (spawn.Event(), spawn.Value("i", 0), spawn.Value("i", 0),
                                                spawn.Value("i", 0))
        label = f"(+{args.ws} ws, {workers} workers)"
        app = create_app(ctx)
        new_process_start()
        with serving(app) as port:  # stopped before the caller closes the store
            if ctx.snapshot_workers is not None:
                ctx.snapshot_workers.start()
                ctx.snapshot_workers.wait_ready(120)
            # The clients and the writer each in a process of their own: beside 50 clients parsing
            # their snapshots, a writer in their process committed a batch every 2-3 s, not every second.
            loads = [spawn.Process(target=_websocket_load, args=(role, port, args.ws, args.ws_rate, kind, where,
                                                                 end_ms, started, stop, received, committed,
                                                                 snapshots,
                                                                 10**6 * (run_no + 1)),
                                   daemon=True)  # new batch ids each run: a batch id seen before is skipped
                     for role in ("clients", "writer")]
            for load in loads:
                load.start()
            load_started = time.time()
            # Measured while the views are held and updated: once every client has its snapshot (the
            # subscriptions' first computation and sending, ~0.3-1 MB of JSON each, a burst of its
            # own) and a few updates after it. A fixed 5 s wait measured that burst in some runs only.
            deadline = time.time() + 120
            while snapshots.value < args.ws and time.time() < deadline:
                time.sleep(0.05)
            snapshot_s, snapshotted = time.time() - load_started, snapshots.value
            time.sleep(3)
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
                out.update({f"{name} {label}": times for name, times in timed_queries(http, QUERIES, args.repeat).items()})
            seconds = time.time() - load_started  # the load processes' start (their imports) included
            print(f"  {label}: " + (f"every client had its snapshot {snapshot_s:.1f} s after the load started"
                                    if snapshotted >= args.ws else
                                    f"only {snapshotted} of {args.ws} clients had a snapshot after {snapshot_s:.0f} s")
                  + "; REST queries timed from 3 s later")
            stop.set()
            for load in loads:
                load.join(30)
        kept.close()
        print(f"  {label}: {args.ws} websocket clients got {received.value} snapshots/updates in {seconds:.0f} s"
              f" ({received.value / seconds / args.ws:.2f} per client per second), with {args.ws_rate} events"
              f" committed a second ({committed.value} batches, {committed.value / seconds:.2f} a second); load"
              f" average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return out


def _worker_state(kind: str, where: str):
    """A snapshot worker's own store connection and point cache (as sketchboard.wiring's)."""
    from store.final_points import FinalPoints
    from store.point_cache import PointCache

    store = _open(kind, where)
    return store, PointCache(backing=FinalPoints(store.side_db(), writer=store.side_db()))


def _open(kind: str, where: str):
    if kind == "postgres":
        from store.postgres import PostgresPaneStore

        return PostgresPaneStore(where)
    return SqlitePaneStore(Path(where), synchronous="OFF")


def _websocket_load(role: str, port: int, clients: int, rate: int, kind: str, where: str, end_ms: int,
                    started: float, stop, received, committed, snapshots, first_batch: int) -> None:
    """In a load process, until `stop` is set: `clients` websocket clients on WS_SHAPES (role
    "clients"), or a writer committing `rate` current demo events every second ("writer")."""
    import threading

    from websockets.sync.client import connect

    catalog = load_catalog(DEFAULT_STREAMS)
    clock = lambda: end_ms / 1000.0 + (time.time() - started)  # noqa: E731

    def subscriber(i: int) -> None:
        with connect(f"ws://127.0.0.1:{port}/api/v1/ws", max_size=None) as ws:
            ws.send(json.dumps({"type": "subscribe", "id": "v", "query": WS_SHAPES[i % len(WS_SHAPES)]}))
            while not stop.is_set():
                try:
                    got = json.loads(ws.recv(timeout=0.5)).get("type")
                    if got in ("snapshot", "points"):
                        with received.get_lock():
                            received.value += 1
                        if got == "snapshot":
                            with snapshots.get_lock():
                                snapshots.value += 1
                except TimeoutError:
                    pass

    def writer() -> None:
        own = _open(kind, where)  # its own connection, as the pipeline process has
        batch_id = first_batch
        traffic = DemoTraffic(catalog, seed=9, clock=clock)
        stream = catalog.stream(STREAM)
        tick = time.monotonic()
        while not stop.is_set():
            now_ms = int(clock() * 1000)
            groups: dict[tuple[int, tuple], list[dict]] = defaultdict(list)
            for e in traffic.generate_stream(STREAM, rate):
                t = now_ms - int(np.random.default_rng(batch_id).integers(0, 2_000))
                groups[(t - t % stream.pane, tuple(str(e.get(d, "")) for d in stream.dimensions))].append(e)
            partials = [pane_partial(stream, start, dims, g) for (start, dims), g in groups.items()]
            own.commit_batch(BatchCommit("live", batch_id, partials, rate, {STREAM: now_ms}, {},
                                         read_by_stream={STREAM: rate}), lateness_ms={STREAM: 30_000}, now_ms=now_ms)
            batch_id += 1
            with committed.get_lock():
                committed.value += 1
            # A batch every second, on the second (not a second after the last one's commit); after
            # a commit that overran its second, the next at once and then on the second again
            tick = max(tick + 1.0, time.monotonic())
            stop.wait(max(0.0, tick - time.monotonic()))
        own.close()

    if role == "writer":
        writer()
        return
    threads = [threading.Thread(target=subscriber, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--batch", type=int, default=100_000, help="events per committed batch (not with --through-api:"
                    " the service's pipeline cuts its own)")
    ap.add_argument("--repeat", type=int, default=20, help="runs of each query")
    ap.add_argument("--long-queries", action="store_true", help="also 7 d at 1 h steps (use with --hours 168)")
    ap.add_argument("--sliding", action="store_true", help="also the table's other queries over a 1 h sliding window")
    ap.add_argument("--only", choices=["tiers", "panes"], help="run one configuration only")
    ap.add_argument("--ws", type=int, default=0, help="then again over HTTP with this many websocket clients"
                    " holding 24 h views updated every second (e.g. 50)")
    ap.add_argument("--ws-rate", type=int, default=2_000, help="events committed per second meanwhile")
    ap.add_argument("--ws-workers", default="1", help="snapshot worker processes with --ws, comma-separated to"
                    " run the load once per value (e.g. 0,1: in the API process, then in one worker)")
    ap.add_argument("--declared", action="store_true", help="then again with the queries declared as dashboard"
                    " panels, computed ahead by the point warmer and asked by a new API process")
    ap.add_argument("--through-api", action="store_true", help="backfill as a new user does: a clean service on the"
                    " shipped configuration fed the events through POST /api/v1/events, drained by its pipeline"
                    " (bench/day_backfill.py; SQLite, tiers as shipped)")
    ap.add_argument("--stores", default="sqlite", help="store backends to run, comma-separated: sqlite,postgres")
    ap.add_argument("--postgres-dsn", help="run the postgres store here instead of on a throwaway local server")
    args = ap.parse_args(argv)
    kinds = args.stores.split(",")
    if args.through_api and (args.only != "tiers" or kinds != ["sqlite"]):
        ap.error("--through-api runs the shipped configuration on its embedded store: use it with --only tiers"
                 " (and the default --stores sqlite)")
    server = None
    if "postgres" in kinds and not args.postgres_dsn:
        from tests.postgres_server import PostgresServer

        server = PostgresServer()
        server.start()
    shipped = load_catalog(DEFAULT_STREAMS)
    def panes_only() -> Catalog:  # built only when that configuration runs
        streams = {n: {**s.model_dump(mode="json"), "tiers": []} for n, s in shipped.streams.items()
                   if not s.derived_from}
        return Catalog.model_validate({  # derived streams (sessions, joins) are left out, and their metrics
            "streams": streams,
            "metrics": {n: m.model_dump(mode="json") for n, m in shipped.metrics.items() if m.stream in streams},
            "views": {n: v.model_dump(mode="json") for n, v in shipped.views.items()},  # what enrichment reads
        })
    end_ms = int(time.time() * 1000) // 10_000 * 10_000
    results = {}
    try:
        for label, catalog in (("tiers", shipped), ("panes", panes_only)):
            if args.only and args.only != label:
                continue
            catalog = catalog() if callable(catalog) else catalog
            for kind in kinds:
                name = label if kinds == ["sqlite"] else f"{label}/{kind[:2]}"
                dsn = (server.fresh_dsn() if server else args.postgres_dsn) if kind == "postgres" else None
                with tempfile.TemporaryDirectory() as tmp:
                    results[name] = run(name, catalog, Path(tmp), args, end_ms, kind, dsn)
    finally:
        if server is not None:
            server.stop()
    print(f"\nGET /api/v1/query over {args.events:,} events in {args.hours:g} h, {args.repeat} runs each (ms);"
          " 'before': the same query as answered before tiers (every pane rolled up in Python, in-process):")
    names = list(dict.fromkeys(n for label in results for n in results[label] if not n.endswith("]")))
    for suffix in ("declared", "nothing kept"):  # columns of their own
        split = {f"{label} {suffix}": {n.removesuffix(f" [{suffix}]"): t for n, t in r.items()
                                      if n.endswith(f" [{suffix}]")} for label, r in results.items()}
        results.update({label: r for label, r in split.items() if r})
    before = next((r for label, r in results.items() if label.startswith("panes")), {})
    width = {label: max(14, len(label) + 6) for label in results}
    print(f"{'query':<34}" + "".join(f"{label + ' p50':>{width[label]}}{label + ' p99':>{width[label]}}"
                                     for label in results)
          + (f"{'before p50':>14}" if before else ""))
    for name in names:
        cells = ""
        for label in results:
            times = sorted(results[label].get(name) or [math.nan])
            p99 = nearest_rank(times, 0.99)
            cells += f"{statistics.median(times):{width[label]}.1f}{p99:{width[label]}.1f}"
        if name + " [before]" in before:
            cells += f"{statistics.median(before[name + ' [before]']):14.1f}"
        print(f"{name:<34}{cells}")


if __name__ == "__main__":
    main()

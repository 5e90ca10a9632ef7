"""Cold sketch queries, in-process, in thread CPU time (what a loaded machine's wall clock hides):
the query path (`query.compute`: planner, store reads, roll-up, point cache) over the day-of-data
store, each query three ways, alternated:

- computed: an empty point cache (a new process before this change: every KLL read and sorted);
- kept: an empty in-memory cache over the store's kept final points (store/final_points.py),
  as a restarted process, another replica or a new client's first query sees them;
- warm: the same cache again;
- warmed ahead: an empty in-memory cache over the points a declared view's warm run kept
  (query/warm.py, what the service's point warmer does before anyone asks), and that warm run's
  own CPU, first (nothing kept) and again (the steady state: its worker's cache holds them).

    python -m bench.cold_points [--events 300000] [--repeat 5] [--store-dir DIR] [--stores sqlite,postgres]

`--store-dir` keeps the SQLite store between runs (built once: the day-of-data short form's
partials, bench/day_of_data.py). Prints medians in ms; asserts nothing but that the three
ways answer the same final points (KLL merges compact at random, so where sketches are
merged a point computed twice may differ within its bounds; a kept one is the same each time).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qs

from bench.day_of_data import QUERIES, STREAM, demo_partials, open_store
from catalog import load_catalog
from query.compute import compute
from query.model import resolve
from query.warm import warm as warm_views
from sketchboard.settings import DEFAULT_STREAMS
from store import BatchCommit
from store.final_points import FinalPoints
from store.point_cache import PointCache
from store.tiers import catalog_layouts

SKETCH_QUERIES = [(name, q) for name, q in QUERIES if "count" not in name]


def build(store, catalog, events: int, end_ms: int) -> None:
    store.configure_tiers(catalog_layouts(catalog), now_ms=end_ms)
    for batch_id, partials in enumerate(demo_partials(catalog, events, 24.0, end_ms, 100_000)):
        n = sum(p.data.count for p in partials)
        store.commit_batch(BatchCommit("main", batch_id, partials, n, {STREAM: max(p.end_ms for p in partials) - 1},
                                       {}, read_by_stream={STREAM: n}), lateness_ms={STREAM: 30_000}, now_ms=end_ms)


def timed(fn) -> tuple[float, object]:
    t = time.thread_time()
    out = fn()
    return (time.thread_time() - t) * 1000, out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--store-dir", help="keep (or reuse) the SQLite store here")
    ap.add_argument("--stores", default="sqlite")
    args = ap.parse_args(argv)
    catalog = load_catalog(DEFAULT_STREAMS)
    for kind in args.stores.split(","):
        server = None
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(args.store_dir) if args.store_dir and kind == "sqlite" else Path(tmp)
            root.mkdir(parents=True, exist_ok=True)
            dsn = None
            if kind == "postgres":
                from tests.postgres_server import PostgresServer

                server = PostgresServer()
                server.start()
                dsn = server.fresh_dsn()
            marker = root / "end_ms"
            store = open_store(kind, root, dsn)
            if marker.exists() and kind == "sqlite":
                end_ms = int(marker.read_text())
            else:
                end_ms = int(time.time() * 1000) // 10_000 * 10_000
                t = time.perf_counter()
                build(store, catalog, args.events, end_ms)
                marker.write_text(str(end_ms))
                print(f"[{kind}] built {args.events} events in {time.perf_counter() - t:.0f} s")
            try:
                run(kind, store, catalog, end_ms, args.repeat)
                snapshots(kind, store, catalog, end_ms, args.repeat)
            finally:
                store.close()
                if server is not None:
                    server.stop()


def run(kind: str, store, catalog, end_ms: int, repeat: int) -> None:
    kept = FinalPoints(store.side_db())
    watermark = store.watermarks().get(STREAM)
    print(f"[{kind}] thread CPU ms, median of {repeat}: computed (empty cache) / kept (new process,"
          " points kept in the store) / warm  |  warmed ahead (new process, points kept by the view's"
          " warm run) / that warm run / the next one")
    try:
        for name, query in SKETCH_QUERIES:
            p = {k: v[0] for k, v in parse_qs(query).items()}
            q = resolve(catalog, metric=p["metric"], stats=[p["stat"]], start=p["from"], end="now", step=p["step"],
                        window=p.get("window"), group_by=p.get("group_by", ""), now_ms=end_ms, max_points=11_000)
            lo, hi = q.range_at(end_ms)

            def ask(cache):
                return compute(store, q, lo, hi, watermark_ms=watermark, max_points=11_000, cache=cache)

            computed, from_store, warm, warmed, warming, rewarming = [], [], [], [], [], []
            for _ in range(repeat):
                # Kept ahead by the view's warm run (query/warm.py, as the service's point warmer
                # runs it for a declared view), then asked by a new process; the warm run's own CPU,
                # first (nothing kept) and again (its worker's cache holds them: the steady state).
                kept.clear()
                worker = PointCache(backing=kept)
                ms, _ = timed(lambda: warm_views(store, [q], now_ms=end_ms, watermarks={STREAM: watermark},
                                                 max_points=11_000, cache=worker))
                warming.append(ms)
                ms, _ = timed(lambda: warm_views(store, [q], now_ms=end_ms, watermarks={STREAM: watermark},
                                                 max_points=11_000, cache=worker))
                rewarming.append(ms)
                cache = PointCache(backing=kept)
                ms, d = timed(lambda: ask(cache))
                warmed.append(ms)
                assert cache.hits == sum(p.final for s in d for p in s.points)  # no final point computed
            kept.clear()
            for _ in range(repeat):
                ms, a = timed(lambda: ask(PointCache()))
                computed.append(ms)
                cache = PointCache(backing=kept)
                ask(cache)  # saves them (first run) or reads them
                kept.flush()
                cache = PointCache(backing=kept)
                ms, b = timed(lambda: ask(cache))
                from_store.append(ms)
                ms, c = timed(lambda: ask(cache))
                warm.append(ms)
                finals = [[p for p in s.points if p.final] for s in b]
                assert finals == [[p for p in s.points if p.final] for s in c]
                assert [[p[:5] for p in s.points] for s in a] == [[p[:5] for p in s.points] for s in b] or "sliding" in name
            print(f"  {name:<30}{statistics.median(computed):8.1f} /{statistics.median(from_store):6.1f}"
                  f" /{statistics.median(warm):6.1f}  |{statistics.median(warmed):6.1f}"
                  f" /{statistics.median(warming):6.1f} /{statistics.median(rewarming):6.1f}")
    finally:
        kept.close()


def snapshots(kind: str, store, catalog, end_ms: int, repeat: int) -> None:
    """The websocket hub's cold snapshots of bench.day_of_data's 24 h views: the API process's
    thread CPU per snapshot computed in it (ws_snapshot_workers 0) and with one worker process
    (what it then does: send the query, wait on the pipe, take the text)."""
    from functools import partial

    from api.ws_hub import Hub, HubConfig
    from api.ws_protocol import QueryIn, resolve_query
    from api.ws_workers import SnapshotWorkers
    from bench.day_of_data import WS_SHAPES, _worker_state

    where = store.dsn if hasattr(store, "dsn") else str(store.path)
    kept = FinalPoints(store.side_db(), writer=store.side_db())
    workers = SnapshotWorkers(partial(_worker_state, kind, where))
    workers.start()
    workers.wait_ready(300)
    cache = PointCache(backing=kept)
    hubs = {"in the API process": Hub(store, lambda: end_ms / 1000, HubConfig(), [], point_cache=cache),
            "one worker": Hub(store, lambda: end_ms / 1000, HubConfig(), [], point_cache=cache, workers=workers)}
    queries = [resolve_query(QueryIn.model_validate(shape), catalog, end_ms, 11_000) for shape in WS_SHAPES]
    print(f"[{kind}] cold websocket snapshots of {len(queries)} 24 h views, API-process thread CPU ms"
          f" (wall ms), median of {repeat}:")
    try:
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in hubs}
        for _ in range(repeat):
            for name, hub in hubs.items():  # alternated
                cache.clear()  # cold: nothing in memory, in the store or in the worker
                cpu, wall = time.thread_time(), time.perf_counter()
                texts = [hub.snapshot_message("v", q).text() for q in queries]
                times[name].append(((time.thread_time() - cpu) * 1000, (time.perf_counter() - wall) * 1000))
                assert all(texts)
        for name, runs in times.items():
            print(f"  {name:<22}{statistics.median(c for c, _ in runs):8.1f} ({statistics.median(w for _, w in runs):.0f})")
    finally:
        workers.stop()
        kept.close()


if __name__ == "__main__":
    main()

"""Issue 27's day of data backfilled as a new user feeds it: a clean service on the shipped
configuration (a fresh data folder, embedded log and SQLite store), the day's demo-shaped
`http_requests` events POSTed to /api/v1/events (NDJSON, concurrent clients), then the service's
pipeline (`sketchboard pipeline --once`'s, built by sketchboard.wiring) draining the log into the
store. Prints the API's events/s, log -> store events/s (wall and sustained) and the store's size;
bench.day_of_data then times the queries over that store (`--through-api`).

The events' times are spread evenly and in order over the span (as bench.throughput `--hours`
spreads them), so none is late: a backfill of a day read in order.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from bench.drain import drain_timed
from bench.ingest_api import run_bench
from bench.serve import free_port, serving
from catalog import Catalog
from demo import DemoTraffic

STREAM = "http_requests"


def day_bodies(catalog: Catalog, events: int, hours: float, end_ms: int, batch: int) -> list[tuple[int, bytes]]:
    """NDJSON bodies of `batch` events each, the i-th event at end - hours + i * hours / events."""
    traffic = DemoTraffic(catalog, seed=5)
    time_field = catalog.streams[STREAM].time_field
    span_ms = int(hours * 3_600_000)
    bodies, made = [], 0
    while made < events:
        chunk = traffic.generate_stream(STREAM, min(batch, events - made))
        for i, event in enumerate(chunk, start=made):
            event[time_field] = end_ms - span_ms + i * span_ms // events
        bodies.append((len(chunk), "\n".join(json.dumps(e, separators=(",", ":")) for e in chunk).encode()))
        made += len(chunk)
    return bodies


def backfill_through_service(root: Path, streams_config: Path, events: int, hours: float, end_ms: int, *,
                             batch: int = 10_000, clients: int = 4) -> None:
    """A service on `root` (its data folder) fed the day through its API, then drained by its pipeline."""
    from sketchboard.settings import Settings
    from sketchboard.wiring import build_api, build_pipeline

    port = free_port()
    settings = Settings(data_dir=root, port=port, streams_config=streams_config)
    app, ctx = build_api(settings)
    t = time.perf_counter()
    bodies = day_bodies(ctx.catalog, events, hours, end_ms, batch)
    print(f"[service] {events:,} events over {hours:g} h as {len(bodies)} NDJSON bodies"
          f" ({time.perf_counter() - t:.0f} s to generate)", flush=True)
    with serving(app, port, join_s=10):
        posted = run_bench(f"http://127.0.0.1:{port}", STREAM, bodies, clients, "ndjson")
    del bodies
    print(f"[service] POST /api/v1/events: {posted.accepted:,} accepted in {posted.seconds:.1f} s ="
          f" {posted.accepted / posted.seconds:,.0f} events/s ({clients} clients, {batch:,} a request, p50"
          f" {posted.percentile_ms(0.5):.0f} ms, p99 {posted.percentile_ms(0.99):.0f} ms"
          + (f"; rejected {posted.rejected:,}, failed requests {posted.failed_requests}: {posted.first_problem}"
             if posted.rejected or posted.failed_requests else "") + ")", flush=True)
    for closing in (ctx.log, ctx.store):
        closing.close()
    pipeline = build_pipeline(settings)
    try:
        drained = drain_timed(pipeline, pipeline.store)
    finally:
        from aggregates.spark import LazySpark

        spark = pipeline.spark
        pipeline.store.close()
        if not isinstance(spark, LazySpark) or spark.started:  # (asking a LazySpark for stop would start it)
            spark.stop()
    size = sum(f.stat().st_size for f in root.glob("store.db*")) / 2**20
    print(f"[service] pipeline log -> store: {drained.events:,} events in {drained.batches} batches, wall"
          f" {drained.wall_s:.1f} s = {drained.events / drained.wall_s:,.0f} events/s, sustained (batch 2 .."
          f" last) {drained.sustained_per_s:,.0f} events/s; store on disk {size:,.0f} MiB", flush=True)

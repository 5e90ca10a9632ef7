"""Issue 27's day of data backfilled as a new user feeds it: a clean service on the shipped
configuration (a fresh data folder, embedded log and SQLite store), the day's demo-shaped
`http_requests` events POSTed to /api/v1/events (NDJSON, concurrent clients), then the service's
pipeline (`sketchboard pipeline --once`'s, built by sketchboard.wiring) draining the log into the
store. Prints the API's events/s, log -> store events/s (wall and sustained) and the store's size;
bench.day_of_data then times the queries over that store (`--through-api`).

The events' times are spread evenly and in order over the span (as bench.throughput `--hours`
spreads them): a backfill of a day, read in order, but for the order the concurrent clients'
bodies reach the log in (a body spans ~5 minutes of the day): where a pipeline batch ends between
two bodies that came out of order, the later batch's events behind the watermark are late (past
the stream's 30 s allowed lateness) and dead-lettered as such. How many were aggregated and
dead-lettered, by reason, is printed.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.drain import drain_timed
from bench.ingest_api import ndjson_body, run_bench
from bench.serve import free_port, serving
from bench.throughput import BACKFILL_STREAM as STREAM
from bench.throughput import spread_in_order
from catalog import Catalog
from demo import DemoTraffic


def day_bodies(catalog: Catalog, events: int, hours: float, end_ms: int, batch: int) -> list[tuple[int, bytes]]:
    """NDJSON bodies of `batch` events each, the i-th event at end - hours + i * hours / events."""
    traffic = DemoTraffic(catalog, seed=5)
    time_field = catalog.streams[STREAM].time_field
    bodies, made = [], 0
    while made < events:
        chunk = spread_in_order(traffic.generate_stream(STREAM, min(batch, events - made)), time_field, made, events,
                                end_ms, hours)
        bodies.append((len(chunk), ndjson_body(chunk)))
        made += len(chunk)
    return bodies


def backfill_through_service(root: Path, streams_config: Path, events: int, hours: float, end_ms: int, *,
                             batch: int = 10_000, clients: int = 4) -> None:
    """A service on `root` (its data folder) fed the day through its API, then drained by its pipeline."""
    from sketchboard.settings import Settings
    from sketchboard.wiring import build_api, build_pipeline

    port = free_port()
    # The embedded log and store in `root` whatever SKETCHBOARD_* variables say (the caller reads root's)
    settings = Settings(data_dir=root, port=port, streams_config=streams_config, log_backend="embedded",
                        store_backend="sqlite")
    app, ctx = build_api(settings)
    t = time.perf_counter()
    bodies = day_bodies(ctx.catalog, events, hours, end_ms, batch)
    print(f"[service] {events:,} events over {hours:g} h as {len(bodies)} NDJSON bodies"
          f" ({time.perf_counter() - t:.0f} s to generate)", flush=True)
    try:
        with serving(app, port, join_s=10):
            posted = run_bench(f"http://127.0.0.1:{port}", STREAM, bodies, clients, "ndjson")
    finally:
        _close_api(ctx)
    del bodies
    print(f"[service] POST /api/v1/events: {posted.accepted:,} accepted in {posted.seconds:.1f} s ="
          f" {posted.accepted / posted.seconds:,.0f} events/s ({clients} clients, {batch:,} a request, p50"
          f" {posted.percentile_ms(0.5):.0f} ms, p99 {posted.percentile_ms(0.99):.0f} ms"
          + (f"; rejected {posted.rejected:,}, failed requests {posted.failed_requests}: {posted.first_problem}"
             if posted.rejected or posted.failed_requests else "") + ")", flush=True)
    pipeline = build_pipeline(settings)
    try:
        drained = drain_timed(pipeline, pipeline.store)
        progress = pipeline.store.progress(settings.pipeline_name).streams[STREAM]
    finally:
        from aggregates.spark import LazySpark

        spark = pipeline.spark
        pipeline.store.close()
        pipeline.log.close()
        if not isinstance(spark, LazySpark) or spark.started:  # (asking a LazySpark for stop would start it)
            spark.stop()
    size = sum(f.stat().st_size for f in root.glob("store.db*")) / 2**20
    print(f"[service] pipeline log -> store: {drained.events:,} events in {drained.batches} batches, wall"
          f" {drained.wall_s:.1f} s = {drained.events / drained.wall_s:,.0f} events/s, sustained (batch 2 .."
          f" last) {drained.sustained_per_s:,.0f} events/s; {progress.events_aggregated:,} aggregated,"
          f" {progress.events_dead_lettered:,} dead-lettered"
          + (f" {dict(progress.dead_lettered_by_reason)}" if progress.dead_lettered_by_reason else "")
          + f"; store on disk {size:,.0f} MiB (store.db and its WAL)", flush=True)


def _close_api(ctx) -> None:
    """What build_api opened and this process no longer needs (the pipeline and the queries open
    the store and the log again)."""
    for part in (getattr(ctx.point_cache, "backing", None), ctx.health, ctx.audit, ctx.idempotency, ctx.log,
                 ctx.store):
        close = getattr(part, "close", None)
        if close is not None:
            close()

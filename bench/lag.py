"""Lag monitoring costs: one sampling round over a real log and store, and evaluating the
status (GET /api/v1/lag, /metrics, the lag feed) with a full retention of samples stored.
Prints figures; asserts nothing.

    python -m bench.lag [--hours 24] [--interval 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from catalog import load_catalog
from ingest.events import EventValidator
from ingest.log import SqliteEventLog
from store.lag import LagSample, SqliteLagStore
from lag.report import LagMonitor
from lag.sampler import LagSampler
from lag.sources import EventLogLagSource, StoreCommitted
from sketchboard.settings import DEFAULT_STREAMS
from store import SqlitePaneStore


def timed(fn, repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times), max(times)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hours", type=float, default=24.0, help="samples stored (the default retention)")
    ap.add_argument("--interval", type=float, default=2.0, help="sample interval, seconds")
    ap.add_argument("--appends", type=int, default=20_000, help="appends (segments) in the log")
    args = ap.parse_args(argv)
    catalog = load_catalog(DEFAULT_STREAMS)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        log = SqliteEventLog(root / "log.db", synchronous="OFF")
        for s in catalog.streams.values():
            log.ensure_topic(s)
        stream = catalog.streams["orders"]
        v = EventValidator(stream)
        for i in range(args.appends):
            log.append(stream, [v.validate({"time": 1, "customer_id": f"c{i % 7}"})], 1_000 + i)
        store = SqlitePaneStore(root / "store.db", synchronous="OFF")
        lag_store = SqliteLagStore(root / "store.db", synchronous="OFF", retention_ms=10 ** 12)
        now = time.time()
        rounds = int(args.hours * 3600 / args.interval)
        parts = [(n, p) for n in catalog.streams for p in log.offsets(n)]
        t = time.perf_counter()
        batch = []
        for r in range(rounds):
            at = int((now - (rounds - r) * args.interval) * 1000)
            batch += [LagSample("main", n, p, at, 0, r, r, at, 0) for n, p in parts]
            if len(batch) >= 60_000:
                lag_store.write(batch)
                batch = []
        lag_store.write(batch)
        print(f"stored {rounds * len(parts)} samples ({args.hours:g} h x {len(parts)} partitions)"
              f" in {time.perf_counter() - t:.1f} s")
        sampler = LagSampler(EventLogLagSource(log), StoreCommitted(store, "main"), lag_store, pipeline="main",
                             streams=list(catalog.streams), interval_s=args.interval)
        monitor = LagMonitor(lag_store, "main", lambda: parts, window=10, interval_s=args.interval)
        med, worst = timed(sampler.sample_and_store, 50)
        print(f"one sampling round (read + write + prune), {len(parts)} partitions,"
              f" {args.appends} segments: median {med:.2f} ms, max {worst:.2f} ms")
        med, worst = timed(monitor.report, 50)
        print(f"status report over stored samples: median {med:.2f} ms, max {worst:.2f} ms")
        med, worst = timed(lambda: lag_store.series("main", int((now - 900) * 1000), int(now * 1000)), 20)
        print(f"15-minute series: median {med:.2f} ms, max {worst:.2f} ms")


if __name__ == "__main__":
    main()

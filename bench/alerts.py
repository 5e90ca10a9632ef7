"""Alert evaluation cost: one evaluation round of N rules over a real SQLite store holding a
day of 10 s panes for 8 endpoints x 4 regions (with KLL and HLL sketches), plus the baseline
a day earlier for trend rules. Prints figures; asserts nothing.

    python -m bench.alerts [--rules 60] [--hours 2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from alerts.service import AlertService
from alerts.source import StoreAlertData
from catalog import load_catalog
from sketches import HllSketch, KllSketch
from sketchboard.settings import DEFAULT_STREAMS
from store import BatchCommit, PaneData, PanePartial, SqlitePaneStore, ValueStats
from store.alerts import SqliteAlertStore

ENDPOINTS = ["/", "/api/products", "/api/product", "/static/app.js", "/api/search", "/api/cart", "/api/login",
             "/api/checkout"]
REGIONS = ["eu-west", "us-east", "us-west", "ap-southeast"]
PANE = 10_000
DAY = 86_400_000


def fill(store: SqlitePaneStore, now_ms: int, hours: float, rng: np.random.Generator) -> int:
    """Panes for the last `hours` and the same hours a day earlier (trend baselines)."""
    spans = [(now_ms - int(hours * 3_600_000), now_ms), (now_ms - DAY - int(hours * 3_600_000), now_ms - DAY)]
    batch, panes = 0, 0
    for lo, hi in spans:
        partials = []
        for start in range(lo // PANE * PANE, hi, PANE):
            for endpoint in ENDPOINTS:
                for region in REGIONS:
                    latencies = rng.lognormal(3.5, 0.6, 20)
                    kll, hll = KllSketch(), HllSketch()
                    for x in latencies:
                        kll.update(float(x))
                    for u in rng.integers(0, 5000, 20):
                        hll.update(f"u{u}")
                    dims = {"endpoint": endpoint, "method": "GET", "status": "200", "region": region}
                    values = {"latency_ms": ValueStats(20, float(latencies.sum()), float(latencies.min()),
                                                       float(latencies.max()), kll.to_bytes())}
                    partials.append(PanePartial("http_requests", start, start + PANE, dims,
                                                PaneData(20, values, {"user_id": hll.to_bytes()})))
            if len(partials) >= 20_000:
                store.commit_batch(BatchCommit("main", batch, partials, 20 * len(partials),
                                               max_event_ms={"http_requests": start + PANE},
                                               read_by_stream={"http_requests": 20 * len(partials)}),
                                   lateness_ms={"http_requests": 30_000}, now_ms=now_ms)
                batch, panes, partials = batch + 1, panes + len(partials), []
        if partials:
            store.commit_batch(BatchCommit("main", batch, partials, 20 * len(partials),
                                           max_event_ms={"http_requests": hi},
                                           read_by_stream={"http_requests": 20 * len(partials)}),
                               lateness_ms={"http_requests": 30_000}, now_ms=now_ms)
            batch, panes = batch + 1, panes + len(partials)
    return panes


def rules(n: int) -> list[dict]:
    """A mix like a real rules file: per-endpoint p99 thresholds over 5 m, rate trends against
    the previous window and a day earlier, averages per region, absence per endpoint."""
    shapes = [
        {"kind": "threshold", "metric": "latency", "stat": "p99", "window": "5m", "group_by": ["endpoint"],
         "threshold": 250},
        {"kind": "threshold", "metric": "latency", "stat": "avg", "window": "1m", "group_by": ["region"],
         "threshold": 100},
        {"kind": "trend", "metric": "requests", "stat": "count", "window": "5m", "against": "previous",
         "threshold": 2},
        {"kind": "trend", "metric": "requests", "stat": "count", "window": "5m", "against": "1d", "mode": "diff",
         "group_by": ["endpoint"], "threshold": 1000},
        {"kind": "threshold", "metric": "requests", "stat": "distinct", "window": "5m", "threshold": 10_000},
        {"kind": "absence", "stream": "http_requests", "duration": "2m", "group_by": ["endpoint"]},
    ]
    return [{"name": f"r{i}", **shapes[i % len(shapes)]} for i in range(n)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rules", type=int, default=60)
    ap.add_argument("--hours", type=float, default=2.0, help="hours of panes now and a day earlier")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    catalog = load_catalog(DEFAULT_STREAMS)
    now_ms = int(time.time() * 1000) // PANE * PANE
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = SqlitePaneStore(root / "store.db", synchronous="OFF")
        t = time.perf_counter()
        panes = fill(store, now_ms, args.hours, np.random.default_rng(1))
        print(f"store: {panes} panes written in {time.perf_counter() - t:.1f} s")
        alert_store = SqliteAlertStore(root / "store.db", synchronous="OFF")
        service = AlertService(catalog, alert_store, StoreAlertData(catalog, store), clock=lambda: now_ms / 1000)
        for definition in rules(args.rules):
            service.create(definition)
        per_kind: dict[str, list[float]] = {}
        rounds = []
        for r in range(args.rounds):
            t0 = time.perf_counter()
            for loaded in service.rules():
                t = time.perf_counter()
                service.evaluate_rule(loaded, now_ms + r * 10_000)
                shape = loaded.stored.definition["kind"] + "/" + loaded.stored.definition.get("stat", "")
                per_kind.setdefault(shape, []).append((time.perf_counter() - t) * 1000)
            rounds.append((time.perf_counter() - t0) * 1000)
        print(f"one round of {args.rules} rules: median {statistics.median(rounds):.0f} ms, max {max(rounds):.0f} ms")
        for shape, times in sorted(per_kind.items()):
            print(f"  {shape:<22} median {statistics.median(times):6.1f} ms per rule")
        states: dict[str, int] = {}
        for inst in alert_store.instances():
            states[inst["state"]] = states.get(inst["state"], 0) + 1
        print(f"instances after the last round: {states}")


if __name__ == "__main__":
    main()

"""A known, reproducible event set with out-of-order times, and exact answers computed with pandas."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

HOUR_MS = 3_600_000
# An epoch ms aligned to an hour (so to every step the tests use), six hours before the suite
# started: recent enough for a pipeline on the real clock to keep the tests' events (the demo's
# shortest retention is a day), far enough back that hours of events after it are not in the
# future. It was a fixed instant until the day that instant fell out of the demo's 8-day
# retention: every pipeline test on the real clock then dead-lettered all its events.
T0 = (int(time.time() * 1000) // HOUR_MS - 6) * HOUR_MS
ENDPOINTS = ["/", "/api/cart", "/api/search"]
REGIONS = ["eu", "us", "ap"]


def http_events(n: int, seed: int, span_ms: int = 300_000, users: int = 20_000) -> list[dict]:
    rng = np.random.default_rng(seed)
    times = T0 + rng.integers(0, span_ms, n)  # uniformly spread: arrive out of order
    endpoints = rng.choice(ENDPOINTS, n, p=[0.5, 0.3, 0.2])
    regions = rng.choice(REGIONS, n)
    latency = np.round(rng.lognormal(3.5, 0.8, n), 3)
    user = rng.integers(0, users, n)
    return [
        {"time": int(t), "endpoint": str(e), "method": "GET", "status": 200, "region": str(r),
         "latency_ms": float(v), "response_bytes": 512, "user_id": f"u{u}"}
        for t, e, r, v, u in zip(times, endpoints, regions, latency, user, strict=True)
    ]


def frame(events: list[dict], pane_ms: int = 10_000) -> pd.DataFrame:
    df = pd.DataFrame(events)
    df["pane"] = df["time"] - df["time"] % pane_ms
    return df


def exact_panes(df: pd.DataFrame) -> pd.DataFrame:
    """count, sum, min, max of latency per (pane, endpoint, region)."""
    return (
        df.groupby(["pane", "endpoint", "region"])["latency_ms"]
        .agg(["count", "sum", "min", "max"])
        .reset_index()
    )


def rank_interval(sorted_values: np.ndarray, value: float) -> tuple[float, float]:
    """The normalized ranks a value occupies in the data (ties make it an interval)."""
    n = len(sorted_values)
    below = np.searchsorted(sorted_values, value, side="left")
    through = np.searchsorted(sorted_values, value, side="right")
    return below / n, through / n


def expected_panes(events: list[dict]) -> dict[tuple[int, str], tuple[int, float, float, float]]:
    """(pane start, dimensions key) -> (count, sum, min, max) of http_requests' latency_ms, exactly."""
    from store import dims_key

    out = {}
    for row in exact_panes(frame(events)).itertuples():
        # plan, country and tier: enriched through the view user_plans, whose tables these tests leave
        # empty (misses: "")
        key = dims_key({"endpoint": row.endpoint, "method": "GET", "region": row.region, "status": "200",
                        "plan": "", "country": "", "tier": ""})
        out[(int(row.pane), key)] = (int(row.count), row.sum, row.min, row.max)
    return out


def stored_panes(store) -> dict[tuple[int, str], tuple[int, float, float, float]]:
    """The same, as a store holds them."""
    out = {}
    for p in store.read_panes("http_requests", 0, 2**62):
        v = p.data.values["latency_ms"]
        out[(p.key.start_ms, p.key.dims)] = (p.data.count, v.sum, v.min, v.max)
    return out


def assert_panes_exact(store, events: list[dict]) -> None:
    """The exact-count oracle: every pane of `events` in `store`, counts/min/max equal, sums to 1e-9."""
    import pytest

    stored, expected = stored_panes(store), expected_panes(events)
    assert stored.keys() == expected.keys()
    for key, (count, total, lo, hi) in expected.items():
        got = stored[key]
        assert got[0] == count, key
        assert got[1] == pytest.approx(total, rel=1e-9), key
        assert (got[2], got[3]) == (lo, hi), key


def amounts_by_pane_and_country(rows, pane_ms: int):
    """(pane start, country) -> event count and sum of amount, from (event time ms, country,
    amount) triples: the orders stream's exact answer."""
    from collections import Counter

    counts: Counter = Counter()
    sums: Counter = Counter()
    for time_ms, country, amount in rows:
        key = (time_ms - time_ms % pane_ms, country)
        counts[key] += 1
        sums[key] += amount
    return counts, sums


def stored_amounts_by_pane_and_country(store, stream: str):
    """The same, as a store holds a stream of orders (panes per country)."""
    import json
    from collections import Counter

    counts: Counter = Counter()
    sums: Counter = Counter()
    for p in store.read_panes(stream, 0, 2**62):
        key = (p.key.start_ms, json.loads(p.key.dims)["country"])
        counts[key] += p.data.count
        sums[key] += p.data.values["amount"].sum
    return counts, sums

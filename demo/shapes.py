"""The shape of the demo shop's traffic: endpoints, regions, countries, payment methods, the
daily rate curve's and the bursts' constants, and seeded draws that depend only on their inputs."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

# rate_at(t) = daily shape (DAILY_MIN..DAILY_MAX, peak at PEAK_HOUR_UTC) x burst factor.
DAILY_MIN, DAILY_MAX = 0.4, 1.3
PEAK_HOUR_UTC = 15.0
BURST_SLOT_S = 10.0       # a rate burst fills one slot of clock time
BURST_PROBABILITY = 0.02  # per slot: a burst every ~8 minutes on average
BURST_MIN, BURST_MAX = 2.0, 3.0
RATE_MIN, RATE_MAX = DAILY_MIN, DAILY_MAX * BURST_MAX

# Error bursts: within a slot, one endpoint answers mostly 500/503 for a few seconds.
ERROR_SLOT_S = 60.0
ERROR_PROBABILITY = 0.12  # per slot: an error burst every ~8 minutes on average
ERROR_MIN_S, ERROR_MAX_S = 4.0, 8.0
ERROR_SHARE = 0.7         # share of the failing endpoint's requests that fail

MAX_JITTER_MS = 2_000     # events arrive up to ~2 s after they happened, in random order
USER_POPULATION = 50_000
CUSTOMER_POPULATION = 20_000
ORDER_RATIO = 0.02        # orders per HTTP request
MOBILE_RATIO = 0.25       # mobile app screen views per HTTP request (demo/devices.py)
SEARCH_RATIO = 0.05       # searches per HTTP request; ~0.7 clicks follow each (demo/searches.py)


@dataclass(frozen=True)
class Endpoint:
    path: str
    weight: float                              # share of requests
    methods: tuple[tuple[str, float], ...]    # (method, share)
    latency_ms: float                          # median latency
    sigma: float                               # lognormal shape: larger = longer tail
    bytes_median: float
    p302: float = 0.01
    p404: float = 0.02


ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("/", 0.20, (("GET", 1.0),), 22.0, 0.45, 14_000, p302=0.03),
    Endpoint("/api/products", 0.19, (("GET", 1.0),), 38.0, 0.50, 9_000),
    Endpoint("/api/product", 0.17, (("GET", 1.0),), 30.0, 0.45, 4_500, p404=0.07),
    Endpoint("/static/app.js", 0.12, (("GET", 1.0),), 6.0, 0.60, 180_000, p404=0.005),
    Endpoint("/api/search", 0.11, (("GET", 1.0),), 300.0, 0.85, 12_000, p404=0.0),
    Endpoint("/api/cart", 0.10, (("GET", 0.6), ("POST", 0.3), ("DELETE", 0.1)), 34.0, 0.50, 2_000),
    Endpoint("/api/login", 0.07, (("POST", 0.85), ("GET", 0.15)), 55.0, 0.40, 800, p302=0.25, p404=0.0),
    Endpoint("/api/checkout", 0.04, (("POST", 1.0),), 75.0, 0.55, 1_500, p404=0.0),
)
SLOW_ENDPOINT = "/api/search"
PATHS = [e.path for e in ENDPOINTS]
SLOW = PATHS.index(SLOW_ENDPOINT)
EP_SHARES = np.array([e.weight for e in ENDPOINTS]) / sum(e.weight for e in ENDPOINTS)
# Endpoints an error burst can hit (a CDN-served file does not fail with the app).
FAILABLE = tuple(i for i, e in enumerate(ENDPOINTS) if not e.path.startswith("/static"))

# (name, share of traffic, latency multiplier: farther from the servers is slower)
REGIONS: tuple[tuple[str, float, float], ...] = (
    ("eu-west", 0.38, 1.0),
    ("us-east", 0.30, 1.15),
    ("us-west", 0.17, 1.25),
    ("ap-southeast", 0.15, 1.6),
)
COUNTRIES: tuple[tuple[str, float], ...] = (
    ("DE", 0.26), ("FR", 0.17), ("GB", 0.15), ("ES", 0.09), ("IT", 0.09),
    ("NL", 0.08), ("PL", 0.06), ("SE", 0.05), ("US", 0.05),
)
PAYMENT_METHODS: tuple[tuple[str, float], ...] = (
    ("card", 0.55), ("paypal", 0.25), ("klarna", 0.12), ("apple_pay", 0.08),
)


def unit(seed: int, *parts: object) -> float:
    """A uniform number in [0, 1) that depends only on its inputs (stable across processes)."""
    digest = hashlib.blake2b(repr((seed, *parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def shares(pairs: tuple[tuple[Any, ...], ...]) -> np.ndarray:
    weights = np.array([p[1] for p in pairs], dtype=float)
    return weights / weights.sum()

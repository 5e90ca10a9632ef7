"""Demo traffic: realistic events for the demo streams, and a producer that posts them.

`DemoTraffic` is a pure generator (seeded RNG, injected clock, no I/O) so its shape can be
tested; `DemoProducer` sends what it generates to the ingest API at a target rate. The
traffic is meant to make the dashboard worth looking at: skewed endpoint popularity, one
slow endpoint with a heavy tail, lognormal latencies, now-and-then error bursts on one
endpoint, a daily rate shape with short spikes, Zipf-skewed users and slightly
out-of-order event times.

Stragglers (`Stragglers`, on by default in the producer's command line, off in a bare
`DemoTraffic`): a fraction of events is sent late by an exponential delay; a smaller
fraction later than the stream's allowed lateness (the pane is final by then: the pipeline
publishes a correction); a few older than the stream's retention and a few from a clock far
in the future (both dead-lettered).

Latency spikes (`LatencySpike`, `--spike /api/cart:40:20s:30s`, none by default): one
endpoint's latencies multiplied by a factor for a window of event time that starts some
seconds after the generator does, so an alert on p99 latency has something to fire on and
then resolve.

Run it against a running service with `python -m ingest.demo --url http://127.0.0.1:8000`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx
import numpy as np

from catalog import Catalog, ConfigError, StreamDef, load_catalog, parse_duration_ms

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "config" / "streams.yaml"
INGEST_PATH = "/api/v1/events"

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


@dataclass(frozen=True)
class _Endpoint:
    path: str
    weight: float                              # share of requests
    methods: tuple[tuple[str, float], ...]    # (method, share)
    latency_ms: float                          # median latency
    sigma: float                               # lognormal shape: larger = longer tail
    bytes_median: float
    p302: float = 0.01
    p404: float = 0.02


ENDPOINTS: tuple[_Endpoint, ...] = (
    _Endpoint("/", 0.20, (("GET", 1.0),), 22.0, 0.45, 14_000, p302=0.03),
    _Endpoint("/api/products", 0.19, (("GET", 1.0),), 38.0, 0.50, 9_000),
    _Endpoint("/api/product", 0.17, (("GET", 1.0),), 30.0, 0.45, 4_500, p404=0.07),
    _Endpoint("/static/app.js", 0.12, (("GET", 1.0),), 6.0, 0.60, 180_000, p404=0.005),
    _Endpoint("/api/search", 0.11, (("GET", 1.0),), 300.0, 0.85, 12_000, p404=0.0),
    _Endpoint("/api/cart", 0.10, (("GET", 0.6), ("POST", 0.3), ("DELETE", 0.1)), 34.0, 0.50, 2_000),
    _Endpoint("/api/login", 0.07, (("POST", 0.85), ("GET", 0.15)), 55.0, 0.40, 800, p302=0.25, p404=0.0),
    _Endpoint("/api/checkout", 0.04, (("POST", 1.0),), 75.0, 0.55, 1_500, p404=0.0),
)
SLOW_ENDPOINT = "/api/search"
_PATHS = [e.path for e in ENDPOINTS]
_SLOW = _PATHS.index(SLOW_ENDPOINT)
_EP_SHARES = np.array([e.weight for e in ENDPOINTS]) / sum(e.weight for e in ENDPOINTS)
# Endpoints an error burst can hit (a CDN-served file does not fail with the app).
_FAILABLE = tuple(i for i, e in enumerate(ENDPOINTS) if not e.path.startswith("/static"))

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


def _unit(seed: int, *parts: object) -> float:
    """A uniform number in [0, 1) that depends only on its inputs (stable across processes)."""
    digest = hashlib.blake2b(repr((seed, *parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def _shares(pairs: tuple[tuple[Any, ...], ...]) -> np.ndarray:
    weights = np.array([p[1] for p in pairs], dtype=float)
    return weights / weights.sum()


@dataclass(frozen=True)
class Stragglers:
    """The late and broken part of the demo traffic (fractions of all events, per stream).

    delayed_fraction      sent late by an exponential delay with mean delay_mean_s (most
                          land inside the allowed lateness: the pane is still provisional)
    late_fraction         sent after the pane became final: delay = allowed_lateness + pane
                          + 1 s + an exponential with mean allowed_lateness -> a correction
    horizon_fraction      event time older than the stream's retention (by 1 min..1 day)
                          -> dead letter `beyond_retention`
    future_fraction       event time ahead of the clock by more than max_future_skew (by
                          1 min..1 day more) -> dead letter `future_skew`
    """

    delayed_fraction: float = 0.05
    delay_mean_s: float = 5.0
    late_fraction: float = 0.005
    horizon_fraction: float = 0.0005
    future_fraction: float = 0.0002

    def __post_init__(self) -> None:
        fractions = (self.delayed_fraction, self.late_fraction, self.horizon_fraction, self.future_fraction)
        if any(not 0.0 <= f <= 1.0 for f in fractions) or sum(fractions) > 1.0:
            raise ValueError(f"straggler fractions must lie in [0, 1] and add up to at most 1, got {fractions}")
        if not self.delay_mean_s >= 0:
            raise ValueError(f"delay_mean_s must not be negative, got {self.delay_mean_s}")

    @classmethod
    def none(cls) -> Stragglers:
        return cls(0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class LatencySpike:
    """Latencies of one endpoint multiplied by `factor` for a while (an incident to alert on).

    start_s is measured from the generator's start: the value of its injected clock when the
    DemoTraffic was constructed (`DemoTraffic.started_s`), so `--spike /api/cart:40:20s:30s`
    means "20 s after the producer starts, for 30 s" without the caller knowing the epoch.
    The window is in *event time*: an event is spiked when its event time lies in
    [start, start + duration), whenever it is sent (a delayed straggler from inside the window
    is still slow), so the metric the alert reads sees exactly the window. Bytes and status
    are unchanged; overlapping spikes on one endpoint multiply.
    """

    endpoint: str
    factor: float
    start_s: float
    duration_s: float

    def __post_init__(self) -> None:
        if self.endpoint not in _PATHS:
            raise ValueError(f"unknown demo endpoint {self.endpoint!r}; the endpoints are: {', '.join(_PATHS)}")
        if not (math.isfinite(self.factor) and self.factor > 0):
            raise ValueError(f"spike factor must be a finite number > 0, got {self.factor!r}")
        if not (math.isfinite(self.start_s) and self.start_s >= 0):
            raise ValueError(f"spike start must be a finite number of seconds >= 0, got {self.start_s!r}")
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ValueError(f"spike duration must be a finite number of seconds > 0, got {self.duration_s!r}")

    def window_ms(self, started_s: float) -> tuple[int, int]:
        """[start, end) in epoch ms for a generator that started at epoch second started_s."""
        start_ms = round((started_s + self.start_s) * 1000)
        return start_ms, start_ms + round(self.duration_s * 1000)


SPIKE_SYNTAX = "ENDPOINT:FACTOR:START:DURATION"


def parse_spike(text: str) -> LatencySpike:
    """`/api/cart:40:20s:30s` -> LatencySpike("/api/cart", 40.0, 20.0, 30.0) (argparse type).

    Split from the right: the durations and the factor never hold a colon, a path might.
    """
    parts = text.rsplit(":", 3)
    if len(parts) != 4:
        raise argparse.ArgumentTypeError(f"{text!r} is not {SPIKE_SYNTAX}, e.g. /api/cart:40:20s:30s")
    endpoint, factor, start, duration = parts
    try:
        number = float(factor)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: factor {factor!r} is not a number") from None
    try:
        return LatencySpike(endpoint, number, parse_duration_ms(start) / 1000, parse_duration_ms(duration) / 1000)
    except ValueError as exc:  # parse_duration_ms() and the checks above say what is wrong
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


# What _times() made of each event (for tests and for the curious).
ON_TIME, DELAYED, LATE, BEYOND_HORIZON, FUTURE = "on_time", "delayed", "late", "beyond_horizon", "future"


class DemoTraffic:
    """Seeded generator of demo events; event times come from the injected clock (epoch s)."""

    def __init__(self, catalog: Catalog, *, seed: int = 0, clock: Callable[[], float] = time.time,
                 stragglers: Stragglers | None = None, spikes: Sequence[LatencySpike] = ()):
        self.catalog = catalog
        self.seed = seed
        self.clock = clock
        self.stragglers = stragglers or Stragglers.none()
        self.spikes = tuple(spikes)
        self.started_s = clock()  # what LatencySpike.start_s counts from
        self.last_kinds: list[str] = []  # per event of the last generate_stream(): ON_TIME, DELAYED, ...
        self._rng = np.random.default_rng(seed)
        # Zipf ranks map to ids through a fixed permutation, so the heavy users are not
        # simply u00001, u00002, ... (ids look arbitrary, as real ones do).
        ids = np.random.default_rng([seed, 1]).permutation(max(USER_POPULATION, CUSTOMER_POPULATION))
        self._user_ids = [f"u{i:05d}" for i in ids[:USER_POPULATION]]
        self._customer_ids = [f"c{i:05d}" for i in ids[:CUSTOMER_POPULATION]]

    # -- rate shape ---------------------------------------------------------------------

    def rate_at(self, t: float) -> float:
        """Traffic multiplier at epoch second t, in [RATE_MIN, RATE_MAX]; deterministic per seed.

        A daily sinusoid over the UTC hour (DAILY_MIN at night, DAILY_MAX mid-afternoon)
        times an occasional short burst (x2..x3 for one BURST_SLOT_S slot).
        """
        hour = (t % 86_400.0) / 3_600.0
        mid, amp = (DAILY_MAX + DAILY_MIN) / 2, (DAILY_MAX - DAILY_MIN) / 2
        daily = mid + amp * math.cos(2 * math.pi * (hour - PEAK_HOUR_UTC) / 24.0)
        slot = math.floor(t / BURST_SLOT_S)
        if _unit(self.seed, "burst", slot) < BURST_PROBABILITY:
            daily *= BURST_MIN + (BURST_MAX - BURST_MIN) * _unit(self.seed, "burst-size", slot)
        return daily

    def error_burst_at(self, t: float) -> str | None:
        """The endpoint failing at epoch second t, or None when there is no error burst."""
        slot = math.floor(t / ERROR_SLOT_S)
        if _unit(self.seed, "errors", slot) >= ERROR_PROBABILITY:
            return None
        length = ERROR_MIN_S + (ERROR_MAX_S - ERROR_MIN_S) * _unit(self.seed, "errors-len", slot)
        start = slot * ERROR_SLOT_S + (ERROR_SLOT_S - length) * _unit(self.seed, "errors-start", slot)
        if not start <= t < start + length:
            return None
        pick = int(_unit(self.seed, "errors-endpoint", slot) * len(_FAILABLE))
        return ENDPOINTS[_FAILABLE[pick]].path

    # -- events -------------------------------------------------------------------------

    def generate(self, n: int) -> dict[str, list[dict]]:
        """Events per stream for n HTTP requests' worth of traffic.

        http_requests gets n events, orders ~ORDER_RATIO * n, and any other stream in the
        catalog n generic events.
        """
        out: dict[str, list[dict]] = {}
        for name in self.catalog.streams:
            if self.catalog.streams[name].derived_from:  # e.g. <stream>_sessions: made by the pipeline
                continue
            count = int(self._rng.binomial(n, ORDER_RATIO)) if name == "orders" else n
            out[name] = self.generate_stream(name, count)
        return out

    def generate_stream(self, name: str, n: int) -> list[dict]:
        """n events for one stream, with exactly its declared fields."""
        stream = self.catalog.stream(name)
        if n <= 0:
            return []
        now_ms = int(self.clock() * 1000)
        strings: dict[str, list[str]] = {}
        numbers: dict[str, list[float] | list[int]] = {}
        if name == "http_requests":
            self._http_requests(n, now_ms / 1000.0, strings, numbers)
        elif name == "orders":
            self._orders(n, strings, numbers)
        events = self._assemble(stream, n, now_ms, strings, numbers)
        if name == "http_requests" and self.spikes:
            self._apply_spikes(stream, events)
        return events

    def _apply_spikes(self, stream: StreamDef, events: list[dict]) -> None:
        # Applied to the assembled events, once their event times are known (stragglers
        # included), and without drawing from the RNG: every other field, and every event
        # outside a window, is exactly what the same seed gives without spikes.
        if not {"endpoint", "latency_ms"} <= {*stream.string_fields, *stream.values}:
            return  # a config whose http_requests lacks these fields has nothing to slow down
        for spike in self.spikes:
            start_ms, end_ms = spike.window_ms(self.started_s)
            for event in events:
                if event["endpoint"] == spike.endpoint and start_ms <= event[stream.time_field] < end_ms:
                    # The generator's floor of 0.1 ms still holds for a factor below 1.
                    event["latency_ms"] = max(round(event["latency_ms"] * spike.factor, 2), 0.1)

    def _times(self, n: int, now_ms: int, stream: StreamDef | None = None) -> list[int]:
        # Mostly a few hundred ms behind the clock, never more than MAX_JITTER_MS; the
        # random jitter is what puts events out of order.
        rng = self._rng
        jitter = np.minimum(rng.exponential(400.0, n), MAX_JITTER_MS)
        times = now_ms - jitter.astype(np.int64)
        s = self.stragglers
        kinds = np.full(n, ON_TIME, dtype=object)
        if stream is not None and (s.delayed_fraction or s.late_fraction or s.horizon_fraction or s.future_fraction):
            u = rng.random(n)
            edges = np.cumsum([s.future_fraction, s.horizon_fraction, s.late_fraction, s.delayed_fraction])
            spread = rng.integers(60_000, 86_400_000, n)  # 1 min .. 1 day past a boundary
            late = stream.allowed_lateness + stream.pane + 1_000 + rng.exponential(max(stream.allowed_lateness, 1), n)
            delayed = rng.exponential(s.delay_mean_s * 1000.0, n)
            for kind, lo, hi, t in (
                (FUTURE, 0.0, edges[0], now_ms + stream.max_future_skew + spread),
                (BEYOND_HORIZON, edges[0], edges[1], now_ms - stream.retention - spread),
                (LATE, edges[1], edges[2], now_ms - late.astype(np.int64)),
                (DELAYED, edges[2], edges[3], now_ms - delayed.astype(np.int64)),
            ):
                pick = (u >= lo) & (u < hi)
                times = np.where(pick, t, times)
                kinds[pick] = kind
        self.last_kinds = kinds.tolist()
        return times.tolist()

    def _zipf_ids(self, n: int, ids: list[str], a: float) -> list[str]:
        # numpy's zipf is unbounded; ranks past the population wrap around, which adds a
        # broad base of occasional users under the heavy head.
        ranks = (self._rng.zipf(a, n) - 1) % len(ids)
        return [ids[r] for r in ranks.tolist()]

    def _http_requests(self, n: int, now_s: float, strings: dict, numbers: dict) -> None:
        rng = self._rng
        ep = rng.choice(len(ENDPOINTS), size=n, p=_EP_SHARES)
        region = rng.choice(len(REGIONS), size=n, p=_shares(REGIONS))

        median = np.array([e.latency_ms for e in ENDPOINTS])[ep] * np.array([r[2] for r in REGIONS])[region]
        sigma = np.array([e.sigma for e in ENDPOINTS])[ep]
        latency = median * np.exp(sigma * rng.standard_normal(n))
        # Heavy tail: some searches hit a cold index, and anything can stall now and then.
        latency = np.where((ep == _SLOW) & (rng.random(n) < 0.04), latency * rng.lognormal(math.log(6.0), 0.5, n), latency)
        latency = np.where(rng.random(n) < 0.005, latency * 4.0, latency)

        size = np.array([e.bytes_median for e in ENDPOINTS])[ep] * rng.lognormal(0.0, 0.35, n)

        u = rng.random(n)
        p302 = np.array([e.p302 for e in ENDPOINTS])[ep]
        p404 = np.array([e.p404 for e in ENDPOINTS])[ep]
        status = np.full(n, 200)
        status = np.where(u < 0.002, 500, np.where(u < 0.002 + p302, 302, np.where(u < 0.002 + p302 + p404, 404, status)))
        failing = self.error_burst_at(now_s)
        if failing is not None:
            hit = (ep == _PATHS.index(failing)) & (rng.random(n) < ERROR_SHARE)
            status = np.where(hit, np.where(rng.random(n) < 0.6, 500, 503), status)
        # Errors and redirects are small; 503s are shed fast, 500s often after a timeout.
        size = np.where(status == 200, size, np.where(status == 404, 350.0, np.where(status == 302, 0.0, 220.0)))
        latency = np.where(status == 503, 3.0 * rng.lognormal(0.0, 0.3, n), latency)
        latency = np.where((status == 500) & (rng.random(n) < 0.5), latency * 8.0, latency)
        latency = np.where((status == 404) | (status == 302), latency * 0.4, latency)

        method = [""] * n
        for i, e in enumerate(ENDPOINTS):
            idx = np.flatnonzero(ep == i)
            if len(e.methods) == 1:
                for j in idx.tolist():
                    method[j] = e.methods[0][0]
            else:
                picks = rng.choice(len(e.methods), size=len(idx), p=_shares(e.methods))
                for j, m in zip(idx.tolist(), picks.tolist()):
                    method[j] = e.methods[m][0]

        strings["endpoint"] = [ENDPOINTS[i].path for i in ep.tolist()]
        strings["method"] = method
        strings["status"] = [str(s) for s in status.tolist()]
        strings["region"] = [REGIONS[i][0] for i in region.tolist()]
        strings["user_id"] = self._zipf_ids(n, self._user_ids, 1.1)
        numbers["latency_ms"] = np.round(np.maximum(latency, 0.1), 2).tolist()
        numbers["response_bytes"] = np.round(size).astype(np.int64).tolist()

    def _orders(self, n: int, strings: dict, numbers: dict) -> None:
        rng = self._rng
        # Most baskets hold one or two items; at most 8.
        items = np.minimum(rng.geometric(0.45, n), 8)
        unit_price = rng.lognormal(math.log(22.0), 0.6, n)
        amount = items * unit_price
        amount = np.where(amount < 50.0, amount + 4.99, amount)  # shipping on small orders
        strings["country"] = [COUNTRIES[i][0] for i in rng.choice(len(COUNTRIES), size=n, p=_shares(COUNTRIES)).tolist()]
        strings["payment_method"] = [
            PAYMENT_METHODS[i][0] for i in rng.choice(len(PAYMENT_METHODS), size=n, p=_shares(PAYMENT_METHODS)).tolist()
        ]
        strings["customer_id"] = self._zipf_ids(n, self._customer_ids, 1.1)
        numbers["amount"] = np.round(amount, 2).tolist()
        numbers["items"] = items.astype(np.int64).tolist()

    def _generic_strings(self, field: str, n: int, keyed: bool) -> list[str]:
        if keyed:  # keys and distinct fields: a large skewed population
            ranks = (self._rng.zipf(1.2, n) - 1) % 10_000
            return [f"{field}_{r}" for r in ranks.tolist()]
        vocab = [f"{field}_{i}" for i in range(1, 7)]  # dimensions: a small vocabulary
        picks = self._rng.choice(len(vocab), size=n, p=_shares(tuple((v, 1.0 / (i + 1)) for i, v in enumerate(vocab))))
        return [vocab[i] for i in picks.tolist()]

    def _assemble(self, stream: StreamDef, n: int, now_ms: int, strings: dict, numbers: dict) -> list[dict]:
        # Take the domain columns the stream declares (with the right kind), fill anything
        # else it declares generically, and drop what it does not declare: the events
        # carry exactly the stream's fields even if the config changes.
        columns: dict[str, list] = {stream.time_field: self._times(n, now_ms, stream)}
        if stream.event_id_field:
            # Unique per event, across runs and producers too (a random prefix per call, outside the
            # seeded RNG, so every other field is still what the seed gives): a retry sends the same.
            prefix = uuid.uuid4().hex[:16]
            columns[stream.event_id_field] = [f"{prefix}-{i}" for i in range(n)]
        keyed = set(stream.distinct_fields) | ({stream.key_field} if stream.key_field else set())
        for field in stream.string_fields:
            if field not in columns:
                columns[field] = strings.get(field) or self._generic_strings(field, n, field in keyed)
        for field in stream.values:
            if field not in columns:
                columns[field] = numbers.get(field) or np.round(self._rng.lognormal(math.log(50.0), 1.0, n), 3).tolist()
        names = list(columns)
        return [dict(zip(names, row)) for row in zip(*columns.values())]


_BEFORE, _DURING, _AFTER = range(3)  # where a producer's clock stands against a spike's window


class DemoProducer:
    """Posts DemoTraffic to the ingest API at `rate` requests/s (times the daily shape)."""

    TICK_S = 0.25
    MAX_CATCHUP_S = 2.0        # after a stall, send at most this much backlog, not all of it
    BACKOFF_START_S = 0.2
    BACKOFF_MAX_S = 5.0
    # The service is busy or still starting; 409: our own earlier try of this body is still
    # being processed (same Idempotency-Key).
    RETRY_STATUSES = frozenset({409, 429, 502, 503, 504})

    def __init__(
        self,
        base_url: str,
        traffic: DemoTraffic,
        *,
        rate: float = 200.0,
        batch_max: int = 500,
        progress_every_s: float = 10.0,
        out: TextIO = sys.stderr,
        token: str | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        # Sent as a bearer token when the service requires one (SKETCHBOARD_TOKEN, ingest scope).
        self.headers = {"authorization": f"Bearer {token}"} if token else {}
        self.traffic = traffic
        self.rate = rate
        self.batch_max = max(1, batch_max)
        self.progress_every_s = progress_every_s
        self.out = out
        self.sent = 0          # events in requests the service answered 200
        self.accepted = 0
        self.rejected = 0
        self.dropped = 0       # events given up on (stopped while retrying, or a 4xx)
        self.requests = 0      # requests answered 200
        self.errors = 0        # failed requests: connection errors and non-200 answers
        self.by_stream: dict[str, int] = {}
        self._started = 0.0
        self._down = False
        self._reported: set[str] = set()
        self._spike_phase = [_BEFORE] * len(traffic.spikes)

    def summary(self) -> dict[str, Any]:
        seconds = time.monotonic() - self._started if self._started else 0.0
        return {
            "sent": self.sent,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "dropped": self.dropped,
            "requests": self.requests,
            "errors": self.errors,
            "seconds": round(seconds, 3),
            "events_per_s": round(self.sent / seconds, 1) if seconds > 0 else 0.0,
            "by_stream": dict(self.by_stream),
        }

    def run(self, duration_s: float | None = None, stop: threading.Event | None = None) -> dict[str, Any]:
        """Send until duration_s has passed or stop is set; return summary()."""
        stop = stop or threading.Event()
        self._started = last = time.monotonic()
        deadline = None if duration_s is None else self._started + duration_s
        progress_at, progress_sent = self._started + self.progress_every_s, 0
        owed = 0.0  # fractional events carried between ticks, so low rates still send
        with httpx.Client(base_url=self.base_url, timeout=10.0, headers=self.headers) as client:
            while not stop.is_set():
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    break
                owed += self.rate * self.traffic.rate_at(self.traffic.clock()) * min(now - last, self.MAX_CATCHUP_S)
                last = now
                n, owed = int(owed), owed - int(owed)
                self.report_spikes(self.traffic.clock())  # before sending: the line precedes the slow events
                if n:
                    for stream, events in self.traffic.generate(n).items():
                        for i in range(0, len(events), self.batch_max):
                            self._post(client, stream, events[i : i + self.batch_max], stop, deadline)
                now = time.monotonic()
                if now >= progress_at:
                    period = now - progress_at + self.progress_every_s
                    print(
                        f"demo: sent {self.sent} events ({(self.sent - progress_sent) / period:.0f}/s over last period),"
                        f" rejected {self.rejected}, errors {self.errors}",
                        file=self.out, flush=True,
                    )
                    progress_at, progress_sent = now + self.progress_every_s, self.sent
                stop.wait(max(0.0, last + self.TICK_S - time.monotonic()))
        return self.summary()

    def report_spikes(self, now_s: float) -> None:
        """Say when a latency spike starts and ends (run() calls this every tick).

        Judged by the traffic's clock, the one event times come from, so the lines match the
        window the metrics see (give or take the ~2 s of event-time jitter).
        """
        now_ms = round(now_s * 1000)
        for i, spike in enumerate(self.traffic.spikes):
            start_ms, end_ms = spike.window_ms(self.traffic.started_s)
            phase = _AFTER if now_ms >= end_ms else _DURING if now_ms >= start_ms else _BEFORE
            if self._spike_phase[i] == _BEFORE and phase != _BEFORE:
                self._say(f"demo: latency spike started: {spike.endpoint} x{spike.factor:g} for {spike.duration_s:g} s")
            if self._spike_phase[i] != _AFTER and phase == _AFTER:
                self._say(f"demo: latency spike ended: {spike.endpoint}")
            self._spike_phase[i] = phase

    def _post(
        self, client: httpx.Client, stream: str, events: list[dict],
        stop: threading.Event, deadline: float | None,
    ) -> None:
        body = json.dumps(events, separators=(",", ":")).encode()
        # Every try of this body carries one key: a retry after a timeout whose first try did
        # reach the log is answered from the service's record instead of appended twice.
        headers = {"content-type": "application/json", "idempotency-key": uuid.uuid4().hex}
        backoff = self.BACKOFF_START_S
        while True:
            if stop.is_set() or (deadline is not None and time.monotonic() >= deadline):
                self.dropped += len(events)
                return
            try:
                resp = client.post(INGEST_PATH, params={"stream": stream}, content=body, headers=headers)
            except httpx.TransportError as exc:
                # Connection refused while the service starts, or a timeout: wait and retry.
                self.errors += 1
                if not self._down:
                    self._down = True
                    self._say(f"demo: cannot reach {self.base_url} ({type(exc).__name__}); retrying")
                stop.wait(backoff)
                backoff = min(backoff * 2, self.BACKOFF_MAX_S)
                continue
            if self._down:
                self._down = False
                self._say(f"demo: connected to {self.base_url}")
            if resp.status_code == 200:
                self._count(stream, events, resp)
                return
            self.errors += 1
            if resp.status_code == 413 and len(events) > 1:
                half = len(events) // 2  # body over the limit: send it in halves
                self._post(client, stream, events[:half], stop, deadline)
                self._post(client, stream, events[half:], stop, deadline)
                return
            if resp.status_code in self.RETRY_STATUSES:
                stop.wait(backoff)
                backoff = min(backoff * 2, self.BACKOFF_MAX_S)
                continue
            # Another 4xx/5xx will not get better by resending the same body: report, drop.
            self.dropped += len(events)
            self._say_once(f"demo: {stream}: HTTP {resp.status_code}: {_detail(resp)}")
            return

    def _count(self, stream: str, events: list[dict], resp: httpx.Response) -> None:
        try:
            answer = resp.json()
        except ValueError:
            answer = {}
        rejected = answer.get("rejected") if isinstance(answer, dict) else None
        rejected = rejected if isinstance(rejected, list) else []
        accepted = answer.get("accepted") if isinstance(answer, dict) else None
        accepted = accepted if isinstance(accepted, int) else len(events) - len(rejected)
        self.requests += 1
        self.sent += len(events)
        self.accepted += accepted
        self.rejected += len(rejected)
        self.by_stream[stream] = self.by_stream.get(stream, 0) + accepted
        for item in rejected[:1]:  # the first reason of a kind tells what is wrong
            reason = item.get("reason") if isinstance(item, dict) else item
            self._say_once(f"demo: {stream}: event rejected: {reason}")

    def _say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def _say_once(self, line: str) -> None:
        # Bounded, so a broken schema does not flood the terminal.
        if line not in self._reported and len(self._reported) < 20:
            self._reported.add(line)
            self._say(line)


def _detail(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:200]
    return str(body.get("detail", body) if isinstance(body, dict) else body)[:200]


TOKEN_ENV = "SKETCHBOARD_TOKEN"


def main(argv: list[str] | None = None, token: str | None = None) -> int:
    """`token`: the bearer token to send; default the SKETCHBOARD_TOKEN environment variable
    (not an option: a command line is visible to every user of the machine)."""
    parser = argparse.ArgumentParser(prog="python -m ingest.demo", description="Send realistic demo traffic to Sketchboard.")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="service base URL (default %(default)s)")
    parser.add_argument("--rate", type=float, default=200.0, help="HTTP requests/s before the daily shape (default %(default)s)")
    parser.add_argument("--duration", type=float, default=None, help="seconds to run (default: until Ctrl-C)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default %(default)s)")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="stream configuration (default %(default)s)")
    d = Stragglers()
    parser.add_argument("--delayed-fraction", type=float, default=d.delayed_fraction,
                        help="share of events sent late by an exponential delay (default %(default)s)")
    parser.add_argument("--delay-mean", type=float, default=d.delay_mean_s,
                        help="mean of that delay in seconds (default %(default)s)")
    parser.add_argument("--late-fraction", type=float, default=d.late_fraction,
                        help="share sent after their pane became final: corrections (default %(default)s)")
    parser.add_argument("--horizon-fraction", type=float, default=d.horizon_fraction,
                        help="share older than the retention: dead letters (default %(default)s)")
    parser.add_argument("--future-fraction", type=float, default=d.future_fraction,
                        help="share from a clock far in the future: dead letters (default %(default)s)")
    parser.add_argument("--spike", type=parse_spike, action="append", default=[], metavar=SPIKE_SYNTAX,
                        help="multiply ENDPOINT's latencies by FACTOR from START after the producer starts, for"
                             " DURATION (event time), e.g. /api/cart:40:20s:30s; repeatable")
    args = parser.parse_args(argv)
    try:
        stragglers = Stragglers(args.delayed_fraction, args.delay_mean, args.late_fraction, args.horizon_fraction,
                                args.future_fraction)
    except ValueError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    try:
        catalog = load_catalog(args.config)
    except ConfigError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    # Built right before sending: spike starts count from here (DemoTraffic.started_s).
    traffic = DemoTraffic(catalog, seed=args.seed, stragglers=stragglers, spikes=args.spike)
    producer = DemoProducer(args.url, traffic, rate=args.rate, token=token or os.environ.get(TOKEN_ENV) or None)
    print(
        f"demo: sending ~{args.rate:g} requests/s (x{traffic.rate_at(time.time()):.2f} now) to {args.url},"
        f" streams: {', '.join(catalog.streams)}; Ctrl-C to stop",
        file=sys.stderr, flush=True,
    )
    for spike in traffic.spikes:
        print(
            f"demo: latency spike planned: {spike.endpoint} x{spike.factor:g} from +{spike.start_s:g} s"
            f" for {spike.duration_s:g} s",
            file=sys.stderr, flush=True,
        )
    try:
        summary = producer.run(args.duration)
    except KeyboardInterrupt:
        summary = producer.summary()
    print(f"demo: done: {json.dumps(summary)}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

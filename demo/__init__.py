"""The demo: realistic events for the demo streams, and a producer that posts them to the API.

It talks to the service over HTTP only, so it sits on top, beside the `sketchboard` wiring:
it reads the catalog (which streams and fields to generate) and nothing else of the service.

- `demo.shapes`: the shop's endpoints, regions, rate curve and bursts (constants, seeded draws)
- `demo.stragglers`: the late and broken share of the traffic (delayed, late, beyond retention, future)
- `demo.spikes`: latency spikes (`--spike /api/cart:40:20s:30s`)
- `demo.devices`: the mobile app's devices, whose clocks cannot be trusted
- `demo.searches`: searches and the clicks on their results, for a window join on search_id
- `demo.logins`: logins with credential-stuffing bursts, for the pattern credential_stuffing
- `demo.checkouts`: the checkout funnel and its abandoned carts, for the pattern checkout_abandoned
- `demo.traffic`: `DemoTraffic`, the pure generator (seeded RNG, injected clock, no I/O)
- `demo.producer`: `DemoProducer`, which posts it at a rate, with retries and Idempotency-Key
- `demo.pg_tables`: the tables' rows written into PostgreSQL instead, for change data capture (demo_postgres_dsn)
- `demo.cli`: `python -m demo --url http://127.0.0.1:8000`

Stragglers (on by default in the command line, off in a bare `DemoTraffic`): a fraction of
events is sent late by an exponential delay; a smaller fraction later than the stream's allowed
lateness (the pane is final by then: the pipeline publishes a correction); a few older than the
stream's retention and a few from a clock far in the future (both dead-lettered).
"""

from demo.cli import DEFAULT_CONFIG, TOKEN_ENV, main
from demo.producer import INGEST_PATH, DemoProducer
from demo.shapes import MAX_JITTER_MS, RATE_MAX, RATE_MIN, SLOW_ENDPOINT
from demo.spikes import SPIKE_SYNTAX, LatencySpike, parse_spike
from demo.stragglers import BEYOND_HORIZON, DELAYED, FUTURE, LATE, ON_TIME, Stragglers
from demo.traffic import DemoTraffic

__all__ = [
    "BEYOND_HORIZON", "DEFAULT_CONFIG", "DELAYED", "FUTURE", "INGEST_PATH", "LATE", "MAX_JITTER_MS", "ON_TIME",
    "RATE_MAX", "RATE_MIN", "SLOW_ENDPOINT", "SPIKE_SYNTAX", "TOKEN_ENV", "DemoProducer", "DemoTraffic",
    "LatencySpike", "Stragglers", "main", "parse_spike",
]

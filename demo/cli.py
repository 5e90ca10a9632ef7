"""`python -m demo`: the demo producer's command line."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from pathlib import Path

from catalog import ConfigError, load_catalog
from demo.pg_tables import PostgresTables
from demo.producer import DemoProducer
from demo.spikes import SPIKE_SYNTAX, parse_spike
from demo.stragglers import Stragglers
from demo.shapes import USER_POPULATION
from demo.traffic import DemoTraffic
from stopping.signals import stop_on_signals

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "config" / "streams.yaml"


TOKEN_ENV = "SKETCHBOARD_TOKEN"


def rate_arg(text: str) -> float:
    """--rate: HTTP requests/s, a finite number >= 0 (0: no events, the tables' rows only)."""
    try:
        rate = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(rate) or rate < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0 (0: no events), not {text!r}")
    return rate


def main(argv: list[str] | None = None, token: str | None = None) -> int:
    """`token`: the bearer token to send; default the SKETCHBOARD_TOKEN environment variable
    (not an option: a command line is visible to every user of the machine)."""
    parser = argparse.ArgumentParser(prog="python -m demo", description="Send realistic demo traffic to Sketchboard.")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="service base URL (default %(default)s)")
    parser.add_argument("--rate", type=rate_arg, default=200.0,
                        help="HTTP requests/s before the daily shape; 0: no events, the tables' rows only (default %(default)s)")
    parser.add_argument("--duration", type=float, default=None, help="seconds to run (default: until Ctrl-C)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default %(default)s)")
    parser.add_argument("--users", type=int, default=USER_POPULATION,
                        help="the shop's user population: the users table's rows (default %(default)s)")
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
    parser.add_argument("--postgres-dsn", default=None,
                        help="write the tables' rows into this PostgreSQL database (schema sketchboard_demo) instead"
                             " of posting them: the service follows them by CDC (setting demo_postgres_dsn)")
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
    try:
        traffic = DemoTraffic(catalog, seed=args.seed, stragglers=stragglers, spikes=args.spike, users=args.users)
    except ValueError as exc:
        print(f"demo: --users: {exc}", file=sys.stderr)
        return 2
    try:
        tables = PostgresTables(args.postgres_dsn, catalog) if args.postgres_dsn else None
    except ValueError as exc:  # a ${NAME} in the DSN that is not set
        print(f"demo: --postgres-dsn: {exc}", file=sys.stderr)
        return 2
    producer = DemoProducer(args.url, traffic, rate=args.rate, token=token or os.environ.get(TOKEN_ENV) or None,
                            pg_tables=tables)
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
    # Ctrl-C, or SIGTERM (`sketchboard up` stops its children so, right after the Ctrl-C that
    # reached the whole process group): stop between requests and say what was sent. Killed by
    # the SIGTERM while unwinding a KeyboardInterrupt, the demo never printed its summary under `up`.
    stop = threading.Event()
    put_back = stop_on_signals(stop) if threading.current_thread() is threading.main_thread() else lambda: None
    try:
        summary = producer.run(args.duration, stop=stop)
    except KeyboardInterrupt:
        summary = producer.summary()
    finally:
        put_back()
    print(f"demo: done: {json.dumps(summary)}", file=sys.stderr, flush=True)
    return 0


"""The device clock step's plan on the driver, per batch (issue 28, session 89).

    python -m bench.clock_plan [--devices 5000] [--heard 100] [--batches 20]

Every batch of a configuration with a `sent_time_field` (the demo's `mobile_app`: a fleet of
5 000 devices, demo/devices.py) plans its device clocks on the driver (aggregates/device_clocks.py
plan_batch). Builds 15 minutes of estimates for `--devices` devices, then plans `--batches`
batches each hearing from `--heard` devices, side by side in one run: judging every kept
estimate again (`whole`, as every batch did before session 89 and the first batch of a process
still does) and judging only what can change (what every later batch does now). Prints the
median time of a batch's plan.

Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from aggregates.device_clocks import plan_batch
from catalog import load_catalog
from demo import DEFAULT_CONFIG

MINUTE = 60_000
T0 = 1_700_000_000_000 - 1_700_000_000_000 % MINUTE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=5_000)
    parser.add_argument("--heard", type=int, default=100)
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args(argv)
    streams = {n: s for n, s in load_catalog(DEFAULT_CONFIG).streams.items() if s.sent_time_field}
    stream = next(iter(streams))
    rng = random.Random(89)
    offsets = {f"d{d}": rng.choice([40, 90, 3_000, -2_500]) for d in range(args.devices)}  # some clocks off
    history = [(stream, device, T0 + m * MINUTE, offset + rng.randrange(30))
               for device, offset in offsets.items() for m in range(15)]
    now = T0 + 15 * MINUTE
    start = plan_batch({}, history, streams, batch_now_ms=now).after
    print(f"{len(start):,} devices of {stream!r} with 15 minutes of estimates", flush=True)
    batches = [[(stream, device, now, offsets[device] + rng.randrange(30))
                for device in rng.sample(sorted(offsets), args.heard)] for _ in range(args.batches)]
    for label, whole in (("every estimate judged (before)", True), ("what can change (now)", False)):
        state, runs = dict(start), []
        for i, samples in enumerate(batches):
            started = time.perf_counter()
            plan = plan_batch(state, samples, streams, batch_now_ms=now + i, whole=whole)
            runs.append((time.perf_counter() - started) * 1000)
            state = dict(plan.after)
        print(f"a batch's clock plan, {args.heard} devices heard, {label}: median {statistics.median(runs):.2f} ms"
              f" (min {min(runs):.2f}, max {max(runs):.2f})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

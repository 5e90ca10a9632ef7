"""One key's burst through the matcher alone: N failed logins of one user 100 ms apart, then a
success, for the shipped credential_stuffing pattern (times [5, 20], the success's address the
last failure's), a one_or_more variant and a one_or_more no_skip one (every match published: a run
per failure, each extended by every later one; bounded by patterns/matcher.py's MAX_RUNS_PER_KEY and
MAX_EVENTS_PER_KEY). Prints the time, the peak runs, the key's state as a batch would write it back
(JSON) and the partial matches the bounds dropped. Before session 59 the matcher offered every event to
every partial run, so a burst cost grew with its square (N=1000: ~35 s) and stalled every stream.

    python -m bench.pattern_burst --sizes 250 1000 4000 --addresses 1 16
"""

from __future__ import annotations

import argparse
import json
import time

from catalog import parse_catalog
from patterns.events import PatternEvent
from patterns.matcher import PatternMatcher
from patterns.plan import compile_pattern

CONFIG = """
streams:
  logins: {key_field: user_id, dimensions: [outcome, ip, client]}
patterns:
  - name: credential_stuffing
    key: user_id
    within: 10m
    steps:
      - {name: failures, stream: logins, where: {outcome: failure}, times: [5, 20]}
      - {name: success, stream: logins, where: {outcome: success, ip: {same_as: failures.ip}}}
    measures:
      attempts: {count: failures}
    dimensions: [failures.client]
  - name: one_or_more
    key: user_id
    within: 10m
    steps:
      - {name: failures, stream: logins, where: {outcome: failure}, one_or_more: true}
      - {name: success, stream: logins, where: {outcome: success, ip: {same_as: failures.ip}}}
  - name: no_skip
    key: user_id
    within: 10m
    after_match: no_skip
    steps:
      - {name: failures, stream: logins, where: {outcome: failure}, one_or_more: true}
      - {name: success, stream: logins, where: {outcome: success}}
"""


def burst(pattern: str, size: int, addresses: int) -> tuple[float, int, int, int, int]:
    catalog = parse_catalog(CONFIG)
    plan = compile_pattern(next(p for p in catalog.patterns if p.name == pattern), catalog)
    matcher = PatternMatcher(plan)
    start = time.perf_counter()
    peak = 0
    for i in range(size):
        fields = {"user_id": "alice", "outcome": "failure", "ip": f"10.0.0.{i % addresses}", "client": "web"}
        matcher.feed(PatternEvent("logins", 0, i, i * 100, "alice", fields))
        peak = max(peak, matcher.partial_matches)
    # What a batch would write back as the key's state before the success, and what the bound refused.
    state_bytes, dropped = len(json.dumps(matcher.state())), matcher.dropped_runs
    last_ip = f"10.0.0.{(size - 1) % addresses}"
    matches = matcher.feed(PatternEvent("logins", 0, size, size * 100, "alice",
                                        {"user_id": "alice", "outcome": "success", "ip": last_ip})).matches
    # no_skip: every match the success completes
    return time.perf_counter() - start, peak, len(matches), state_bytes, dropped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[250, 1000, 4000])
    parser.add_argument("--addresses", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--patterns", nargs="+", default=["credential_stuffing", "one_or_more", "no_skip"])
    args = parser.parse_args()
    print(f"{'pattern':<20} {'failures':>8} {'addresses':>9} {'seconds':>8} {'us/event':>9} {'peak runs':>9}"
          f" {'state KB':>9} {'dropped':>8} matches")
    for pattern in args.patterns:
        for addresses in args.addresses:
            for size in args.sizes:
                seconds, peak, matches, state_bytes, dropped = burst(pattern, size, addresses)
                print(f"{pattern:<20} {size:>8} {addresses:>9} {seconds:>8.2f} {seconds / (size + 1) * 1e6:>9.0f}"
                      f" {peak:>9} {state_bytes / 1024:>9.0f} {dropped:>8} {matches}")


if __name__ == "__main__":
    main()

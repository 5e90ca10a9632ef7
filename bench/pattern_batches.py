"""The patterns' driver side, timed: logins as the pipeline collects them from a batch (Arrow) ->
buffered per key, released in event-time order at the watermark, matched, with the state in a
SQLite store -> derived partials -> the state, matches and late events committed. No Spark:
this is the cost patterns add to each batch of the streams they read.

    python -m bench.pattern_batches --batches 10 --events 50000 --users 20000
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from aggregates.patterns import PatternRunner, with_patterns
from catalog import parse_catalog
from store import BatchCommit, SqlitePaneStore

# Two patterns over one stream: credential stuffing (a run per failure burst) and an absence.
CONFIG = """
streams:
  logins: {key_field: user_id, dimensions: [outcome, ip]}
patterns:
  - name: credential_stuffing
    key: user_id
    within: 10m
    steps:
      - {name: failures, stream: logins, where: {outcome: failure}, times: 5}
      - {name: success, stream: logins, where: {outcome: success, ip: {same_as: failures.ip}}}
    measures:
      attempts: {count: failures}
  - name: failure_then_silence
    key: user_id
    steps:
      - {name: failure, stream: logins, where: {outcome: failure}}
    not_followed_by: {name: anything, stream: logins, within: 2m}
"""
T0 = 1_795_000_000_000
MIN = 60_000


def batch(rng: random.Random, b: int, n: int, users: int) -> pa.Table:
    """One minute of n logins of random users, 30 % failures, arriving up to 20 s out of order."""
    rows = []
    for i in range(n):
        t = T0 + b * MIN + rng.randrange(MIN) - rng.randrange(20_000)
        outcome = "failure" if rng.random() < 0.3 else "success"
        rows.append(("logins", 0, b * n + i, t, [outcome, rng.choice(["10.0.0.1", "10.0.0.2"])],
                     [f"u{rng.randrange(users)}"]))
    cols = list(zip(*rows, strict=True))
    return pa.table({"stream": cols[0], "partition": pa.array(cols[1], pa.int32()), "offset": cols[2],
                     "event_time": cols[3], "dims": pa.array(cols[4], pa.list_(pa.string())),
                     "vals": pa.array([[] for _ in rows], pa.list_(pa.float64())),
                     "ids": pa.array(cols[5], pa.list_(pa.string()))})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--events", type=int, default=50_000, help="logins per batch (one minute of event time)")
    ap.add_argument("--users", type=int, default=20_000)
    args = ap.parse_args(argv)
    catalog = parse_catalog(CONFIG)
    with tempfile.TemporaryDirectory() as tmp:
        store = SqlitePaneStore(Path(tmp) / "store.db")
        runner, rng = PatternRunner(catalog, store), random.Random(1)
        events = 0
        match_s = commit_s = 0.0
        for b in range(args.batches):
            records = batch(rng, b, args.events, args.users)
            events += records.num_rows
            started = time.perf_counter()
            # The streams' watermark as the store would hold it before this batch: the last one's newest - 30 s.
            done = runner.run(records, {"logins": T0 + b * MIN - 30_000} if b else {})
            matched_at = time.perf_counter()
            commit = with_patterns(BatchCommit("main", b, [], 0), done, runner.names)
            store.commit_batch(commit, lateness_ms={n: s.allowed_lateness for n, s in catalog.streams.items()},
                               now_ms=T0)
            finished = time.perf_counter()
            match_s += matched_at - started
            commit_s += finished - matched_at
        sizes = store.pattern_sizes()
        store.close()
    print(f"{events} events in {args.batches} batches, 2 patterns: match {events / match_s:,.0f} events/s,"
          f" state commit {events / commit_s:,.0f} events/s, together {events / (match_s + commit_s):,.0f} events/s")
    for name, s in sizes.items():
        print(f"  {name}: {s.matches} matches, {s.late_events} late, state {s.keys_held} keys,"
              f" {s.partial_matches} partial matches, {s.buffered_events} buffered events")


if __name__ == "__main__":
    main()
